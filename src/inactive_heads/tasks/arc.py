"""ARC-Easy / ARC-Challenge as lm-eval's ``arc_easy`` / ``arc_challenge``: test split, acc and acc_norm.

Files: ``<data_dir>/arc/ARC-{Easy,Challenge}/ARC-*-{Test,Dev}.jsonl`` (original AI2 schema). lm-eval draws
few-shot examples from train; train is not available offline, so they come from Dev (default 0-shot).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from . import Item, Task, register_task
from ._data import DataError, convert, field, hub_rows, read_jsonl, require, resolve_dir

__all__: list[str] = []


def _item(stem: str, texts: list[str], labels: list[str], key: str, item_id: str, where: str) -> Item:
    if key not in labels:
        raise DataError(f"{where}: answerKey {key!r} is not one of the choice labels {labels}")
    return Item(item_id, (f"Question: {stem}\nAnswer:",), tuple(texts), labels.index(key))


def _file_items(path: Path, split: str) -> list[Item]:
    def row_item(row: dict[str, Any], where: str) -> Item:
        q = field(row, "question", path, where, dict)
        choices = field(q, "choices", path, where, list)
        texts = [field(c, "text", path, where) for c in choices]
        labels = [field(c, "label", path, where) for c in choices]
        return _item(
            field(q, "stem", path, where),
            texts,
            labels,
            field(row, "answerKey", path, where),
            f"{path.stem}:{row['_line']}",
            f"{path}, {where}",
        )

    return convert(read_jsonl(path), row_item, path)


def _hub_items(subset: str, split: str) -> list[Item]:
    rows = list(hub_rows("allenai/ai2_arc", subset, split))
    return convert(
        rows,
        lambda r, w: _item(
            r["question"],
            list(r["choices"]["text"]),
            list(r["choices"]["label"]),
            r["answerKey"],
            f"{subset}/{split}:{r['_line']}",
            w,
        ),
        "allenai/ai2_arc",
    )


def _load(subset: str, name: str, data_dir: Path | None, source: str, split: str = "test") -> Task:
    """``split`` ``"test"`` (lm-eval's task) or ``"dev"``: the dev items as the evaluated ones (a held-out calibration
    for a study that evaluates the whole test split; few-shot examples still come from dev)."""
    if source == "hub":
        items, dev = _hub_items(subset, "test"), _hub_items(subset, "validation")
        sources = [f"hub:allenai/ai2_arc/{subset}"]
    else:
        folder = resolve_dir(data_dir, "arc") / subset
        test = require(folder / f"{subset}-Test.jsonl", f"the {subset} test split (AI2 ARC jsonl)")
        devp = require(folder / f"{subset}-Dev.jsonl", f"the {subset} dev split (AI2 ARC jsonl)")
        items, dev = _file_items(test, "test"), _file_items(devp, "dev")
        sources = [str(test), str(devp)]
    return Task(
        name=name,
        items=dev if split == "dev" else items,
        metrics=("acc", "acc_norm"),
        default_shots=0,
        fewshot={"": dev},
        fewshot_excludes_item=split == "dev",
        split="validation" if split == "dev" else "test",
        fewshot_split="validation (train unavailable)",
        sources=sources,
    )


register_task("arc_easy", summary="ARC-Easy test, acc/acc_norm")(partial(_load, "ARC-Easy", "arc_easy"))
register_task("arc_easy_dev", summary="ARC-Easy dev (a calibration split beside the test)")(
    partial(_load, "ARC-Easy", "arc_easy_dev", split="dev")
)
register_task("arc_challenge", summary="ARC-Challenge test, acc/acc_norm")(
    partial(_load, "ARC-Challenge", "arc_challenge")
)
