"""WinoGrande (xl, v1.1) as lm-eval's ``winogrande``: dev/validation split, partial scoring, acc.

The two choices are two contexts (the sentence up to the blank, filled with each option); the shared rest of the
sentence after the blank is the scored continuation. Files: ``<data_dir>/winogrande/dev.jsonl`` (+ optional
``dev-labels.lst``, checked against the ``answer`` field). No train split is available offline: k-shot examples are
drawn from dev, excluding the scored item.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import Item, Task, register_task
from ._data import DataError, convert, field, hub_rows, read_jsonl, read_lines, require, resolve_dir

__all__: list[str] = []


def _item(sentence: str, option1: str, option2: str, answer: str, item_id: str, where: str) -> Item:
    if "_" not in sentence:
        raise DataError(f"{where}: sentence has no blank '_'")
    if answer not in ("1", "2"):
        raise DataError(f"{where}: answer {answer!r} is not '1' or '2'")
    idx = sentence.index("_")
    # lm-eval preprocess_winogrande: contexts = sentence[:idx] + option, target = sentence[idx+1:].strip()
    return Item(
        item_id, (sentence[:idx] + option1, sentence[:idx] + option2), (sentence[idx + 1 :].strip(),), int(answer) - 1
    )


@register_task("winogrande", summary="WinoGrande dev, partial scoring, acc")
def winogrande(data_dir: Path | None, source: str) -> Task:
    """Load WinoGrande dev (= lm-eval's validation split of winogrande_xl)."""
    if source == "hub":
        rows = list(hub_rows("allenai/winogrande", "winogrande_xl", "validation"))
        items = convert(
            rows,
            lambda r, w: _item(
                r["sentence"], r["option1"], r["option2"], str(r["answer"]), f"winogrande/validation:{r['_line']}", w
            ),
            "allenai/winogrande",
        )
        sources = ["hub:allenai/winogrande/winogrande_xl"]
    else:
        folder = resolve_dir(data_dir, "winogrande")
        path = require(folder / "dev.jsonl", "WinoGrande v1.1 dev (qID, sentence, option1, option2, answer)")
        rows = read_jsonl(path)
        sources = [str(path)]
        lpath = folder / "dev-labels.lst"
        if lpath.is_file():
            labels = read_lines(lpath)
            if len(labels) != len(rows):
                raise DataError(f"{lpath} has {len(labels)} labels but {path} has {len(rows)} rows")
            sources.append(str(lpath))
        else:
            labels = None

        def row_item(row: dict[str, Any], where: str) -> Item:
            answer = field(row, "answer", path, where)
            if labels is not None and labels[row["_line"] - 1] != answer:
                raise DataError(
                    f"{path}, {where}: answer {answer!r} disagrees with {lpath} "
                    f"({labels[row['_line'] - 1]!r}); the two files come from different releases"
                )
            return _item(
                field(row, "sentence", path, where),
                field(row, "option1", path, where),
                field(row, "option2", path, where),
                answer,
                f"winogrande/dev:{row['_line']}",
                f"{path}, {where}",
            )

        items = convert(rows, row_item, path)
    return Task.own_validation("winogrande", items, ("acc",), sources)
