"""BoolQ as lm-eval's ``boolq`` (SuperGLUE): validation split, choices "no"/"yes", acc.

Files: ``<data_dir>/boolq/val.jsonl`` (SuperGLUE schema: question, passage, label as bool, 0/1 or "true"/"false").
No train split offline: few-shot examples come from validation, excluding the scored item.
"""

from __future__ import annotations

from pathlib import Path

from . import Item, Task, register_task
from ._data import DataError, convert, field, hub_rows, read_jsonl, require, resolve_dir

__all__: list[str] = []

_TRUE = (True, 1, "true", "True", "1")
_FALSE = (False, 0, "false", "False", "0")


def _item(passage: str, question: str, label: object, item_id: str, where: str) -> Item:
    if label not in _TRUE and label not in _FALSE:
        raise DataError(f"{where}: label {label!r} is not a boolean (true/false, 1/0)")
    return Item(item_id, (f"{passage}\nQuestion: {question}?\nAnswer:",), ("no", "yes"), int(label in _TRUE))


@register_task("boolq", summary="BoolQ validation, acc")
def boolq(data_dir: Path | None, source: str) -> Task:
    """Load BoolQ validation."""
    if source == "hub":
        rows = list(hub_rows("aps/super_glue", "boolq", "validation"))
        items = convert(
            rows,
            lambda r, w: _item(r["passage"], r["question"], r["label"], f"boolq/validation:{r['_line']}", w),
            "aps/super_glue",
        )
        sources = ["hub:aps/super_glue/boolq"]
    else:
        path = require(resolve_dir(data_dir, "boolq") / "val.jsonl", "BoolQ validation (question, passage, label)")
        items = convert(
            read_jsonl(path),
            lambda r, w: _item(
                field(r, "passage", path, w),
                field(r, "question", path, w),
                field(r, "label", path, w, (str, int, bool)),
                f"boolq/val:{r['_line']}",
                f"{path}, {w}",
            ),
            path,
        )
        sources = [str(path)]
    return Task.own_validation("boolq", items, ("acc",), sources)
