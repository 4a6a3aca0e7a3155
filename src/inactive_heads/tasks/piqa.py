"""PIQA as lm-eval's ``piqa``: validation split, 0-shot, acc and acc_norm.

Files: ``<data_dir>/piqa/valid.jsonl`` + ``valid-labels.lst`` (official layout). No train split is available
offline, so few-shot examples come from the validation set itself, excluding the scored item.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import Item, Task, register_task
from ._data import DataError, convert, field, hub_rows, read_jsonl, read_lines, require, resolve_dir

__all__: list[str] = []


def _item(goal: str, sol1: str, sol2: str, label: int, item_id: str) -> Item:
    return Item(item_id, (f"Question: {goal}\nAnswer:",), (sol1, sol2), label)


@register_task("piqa", summary="PIQA validation, 0-shot, acc/acc_norm")
def piqa(data_dir: Path | None, source: str) -> Task:
    """Load PIQA validation."""
    if source == "hub":
        rows = list(hub_rows("baber/piqa", None, "validation"))
        items = convert(
            rows,
            lambda r, w: _item(r["goal"], r["sol1"], r["sol2"], int(r["label"]), f"piqa/validation:{r['_line']}"),
            "baber/piqa",
        )
        sources = ["hub:baber/piqa"]
    else:
        folder = resolve_dir(data_dir, "piqa")
        path = require(folder / "valid.jsonl", "PIQA validation questions (goal, sol1, sol2 per line)")
        lpath = require(folder / "valid-labels.lst", "PIQA validation labels (0 or 1 per line)")
        rows, labels = read_jsonl(path), read_lines(lpath)
        if len(rows) != len(labels):
            raise DataError(
                f"{lpath} has {len(labels)} labels but {path} has {len(rows)} rows; they must be "
                "line-aligned copies of the same release"
            )

        def row_item(row: dict[str, Any], where: str) -> Item:
            n = row["_line"]
            lab = labels[n - 1]
            if lab not in ("0", "1"):
                raise DataError(f"{lpath}, line {n}: label {lab!r} is not 0 or 1")
            return _item(
                field(row, "goal", path, where),
                field(row, "sol1", path, where),
                field(row, "sol2", path, where),
                int(lab),
                f"piqa/valid:{n}",
            )

        items = convert(rows, row_item, path)
        sources = [str(path), str(lpath)]
    return Task.own_validation("piqa", items, ("acc", "acc_norm"), sources)
