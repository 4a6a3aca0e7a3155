"""HellaSwag as lm-eval's ``hellaswag``: validation split, acc and acc_norm, lm-eval's preprocessing.

Files: ``<data_dir>/hellaswag/hellaswag_val.jsonl`` (official; preferred when present) or the derived
``hellaswag_val_full.txt.bz2`` (llama.cpp text format, 6 lines per item). The derived file has lost the
``ctx_a``/``ctx_b`` split, so lm-eval's ``ctx_b.capitalize()`` cannot be reproduced on it: numbers from it can
differ slightly from lm-eval's. No train split offline: few-shot examples come from validation minus the item.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from . import Item, Task, register_task
from ._data import DataError, convert, field, hub_rows, read_jsonl, read_text, resolve_dir

__all__: list[str] = []


def _preprocess(text: str) -> str:
    # Verbatim lm-eval tasks/hellaswag/utils.py: brackets are WikiHow artifacts.
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


def _official(row: dict[str, Any], item_id: str, where: str) -> Item:
    ctx = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    endings = [_preprocess(e) for e in row["endings"]]
    label = int(row["label"])
    if not 0 <= label < len(endings):
        raise DataError(f"{where}: label {label} out of range for {len(endings)} endings")
    return Item(item_id, (_preprocess(row["activity_label"] + ": " + ctx),), tuple(endings), label)


def _derived(path: Path) -> list[Item]:
    lines = read_text(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) % 6:
        raise DataError(f"{path}: {len(lines)} lines, not a multiple of 6 (context, label, 4 endings per item)")
    items = []
    for k in range(len(lines) // 6):
        block = lines[6 * k : 6 * k + 6]
        if block[1].strip() not in ("0", "1", "2", "3"):
            raise DataError(f"{path}, line {6 * k + 2} (item {k + 1}): label {block[1]!r} is not 0..3")
        items.append(
            Item(
                f"hellaswag/val:{k + 1}",
                (_preprocess(block[0]),),
                tuple(_preprocess(e) for e in block[2:]),
                int(block[1]),
            )
        )
    return items


@register_task("hellaswag", summary="HellaSwag validation, acc/acc_norm")
def hellaswag(data_dir: Path | None, source: str) -> Task:
    """Load HellaSwag validation."""
    notes = ""
    if source == "hub":
        rows = list(hub_rows("Rowan/hellaswag", None, "validation"))
        items = convert(rows, lambda r, w: _official(r, f"hellaswag/validation:{r['_line']}", w), "Rowan/hellaswag")
        sources = ["hub:Rowan/hellaswag"]
    else:
        folder = resolve_dir(data_dir, "hellaswag")
        official, derived = folder / "hellaswag_val.jsonl", folder / "hellaswag_val_full.txt.bz2"
        if official.is_file():

            def row_item(r: dict[str, Any], w: str) -> Item:
                for key in ("ctx_a", "ctx_b", "activity_label"):
                    field(r, key, official, w)
                field(r, "endings", official, w, list)
                return _official(r, f"hellaswag/val:{r['_line']}", f"{official}, {w}")

            items = convert(read_jsonl(official), row_item, official)
            sources = [str(official)]
        elif derived.is_file():
            items, sources = _derived(derived), [str(derived)]
            notes = "derived text file: ctx_b capitalisation of lm-eval not reproducible"
        else:
            raise DataError(f"neither {official} (official jsonl) nor {derived} (llama.cpp text format) exists")
    return Task.own_validation("hellaswag", items, ("acc", "acc_norm"), sources, notes)
