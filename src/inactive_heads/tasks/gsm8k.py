"""GSM8K as lm-eval 0.4.13's ``gsm8k`` (generate_until): 5 random shots from train, greedy decoding, exact match.

Files: ``<data_dir>/gsm8k/{test,train}.jsonl`` (the authors' release: question, answer ending in ``#### <number>``).
Prompt ``Question: {question}\\nAnswer:``; a few-shot example is that prompt, a space and the full worked answer,
then a blank line. Decoding stops at ``Question:``, ``</s>``, ``<|im_end|>``, end-of-text or 256 new tokens.
``strict-match`` takes the number after ``#### ``; ``flexible-extract`` the last number in the text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import Extraction, Generation, Item, Task, register_task
from ._data import convert, field, hub_rows, read_jsonl, require, resolve_dir

__all__: list[str] = []

#: lm-eval's gsm8k.yaml (metadata version 3.0): generation_kwargs, filter_list and exact_match options.
GSM8K_GENERATION = Generation(
    until=("Question:", "</s>", "<|im_end|>"),
    max_gen_toks=256,
    extractions=(
        Extraction("strict-match", r"#### (\-?[0-9\.\,]+)"),
        Extraction("flexible-extract", r"(-?[$0-9.,]{2,})|(-?[0-9]+)", group_select=-1),
    ),
    regexes_to_ignore=(",", "\\$", "(?s).*#### ", "\\.$"),
    ignore_case=True,
)


def _item(question: str, answer: str, item_id: str) -> Item:
    return Item(item_id, (f"Question: {question}\nAnswer:",), (answer,), 0)


def _rows(rows: list[dict[str, Any]], path: Path | str, prefix: str) -> list[Item]:
    return convert(
        rows,
        lambda r, w: _item(field(r, "question", path, w), field(r, "answer", path, w), f"{prefix}:{r['_line']}"),
        path,
    )


@register_task("gsm8k", summary="GSM8K test, 5-shot generation, exact match (strict-match, flexible-extract)")
def gsm8k(data_dir: Path | None, source: str) -> Task:
    """Load GSM8K test, with train as the few-shot pool."""
    if source == "hub":
        test = _rows(list(hub_rows("openai/gsm8k", "main", "test")), "openai/gsm8k", "gsm8k/test")
        train = _rows(list(hub_rows("openai/gsm8k", "main", "train")), "openai/gsm8k", "gsm8k/train")
        sources = ["hub:openai/gsm8k/main"]
    else:
        folder = resolve_dir(data_dir, "gsm8k")
        paths = {s: require(folder / f"{s}.jsonl", f"GSM8K {s} split (question, answer)") for s in ("test", "train")}
        test = _rows(read_jsonl(paths["test"]), paths["test"], "gsm8k/test")
        train = _rows(read_jsonl(paths["train"]), paths["train"], "gsm8k/train")
        sources = [str(p) for p in paths.values()]
    return Task(
        name="gsm8k",
        items=test,
        metrics=("exact_match,strict-match", "exact_match,flexible-extract"),
        default_shots=5,
        fewshot={"": train},
        split="test",
        fewshot_split="train",
        sources=sources,
        generation=GSM8K_GENERATION,
    )
