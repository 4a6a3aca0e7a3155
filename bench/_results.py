"""The tables of ``bench/RESULTS.md``: each bench script owns marked sections and updates only their rows.

A section is the text between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``; it holds one Markdown table. A run
adds its rows to the table, replacing the rows it measured again, and leaves every other row and the prose around
the markers as they are. The file is replaced atomically, so an interrupted run leaves it whole.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from inactive_heads.atomic import atomic_write_text

__all__ = ["RESULTS", "read_table", "results_file", "update_table"]

#: The results file the bench scripts write.
RESULTS = Path(__file__).with_name("RESULTS.md")


def results_file(given: Path | None, quick: bool) -> Path:
    """The file a run updates: ``given``; else RESULTS.md, or for a ``--quick`` run (whose numbers measure nothing)
    a copy of it with empty tables in a new temporary folder."""
    if given is not None:
        return given
    if not quick:
        return RESULTS
    text = RESULTS.read_text(encoding="utf-8")
    for name in re.findall(r"<!-- (\S+):begin -->", text):
        head, _, tail = _split(text, name)
        text = f"{head}\n{tail}"
    copy = Path(tempfile.mkdtemp(prefix="bench-quick-")) / RESULTS.name
    copy.write_text(text, encoding="utf-8")
    print(f"--quick: results go to {copy}", flush=True)
    return copy


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def _split(text: str, name: str) -> tuple[str, str, str]:
    begin, end = _markers(name)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"RESULTS.md needs exactly one {begin} ... {end} section")
    head, rest = text.split(begin)
    body, tail = rest.split(end)
    return head + begin, body, end + tail


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().removeprefix("|").removesuffix("|").split("|")]


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def read_table(name: str, path: Path = RESULTS) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the table in section ``name``; both empty for an empty section."""
    _, body, _ = _split(path.read_text(encoding="utf-8"), name)
    lines = [line for line in body.splitlines() if line.lstrip().startswith("|")]
    if not lines:
        return [], []
    return _cells(lines[0]), [_cells(line) for line in lines[2:]]  # lines[1] is the |---| separator


def update_table(
    name: str, header: Sequence[str], rows: Iterable[Sequence[str]], key: int, path: Path = RESULTS
) -> None:
    """Add ``rows`` to the table in section ``name`` of ``path``.

    A row replaces the row whose first ``key`` cells equal its own, in place; an empty cell keeps that row's value
    (a quantity this run did not measure). Rows with new keys are appended.
    """
    header = list(header)
    old_header, table = read_table(name, path)
    if old_header and old_header != header:
        raise ValueError(f"section {name} of {path} has columns {old_header}, this script writes {header}")
    for new in rows:
        new = list(new)
        if len(new) != len(header):
            raise ValueError(f"a row of section {name} needs {len(header)} cells, got {new}")
        old = next((row for row in table if row[:key] == new[:key]), None)
        if old is None:
            table.append(new)
        else:
            old[:] = [n if n else o for n, o in zip(new, old, strict=True)]
    write_table(name, header, table, path)


def write_table(name: str, header: Sequence[str], rows: Iterable[Sequence[str]], path: Path = RESULTS) -> None:
    """Replace the table in section ``name`` of ``path`` by ``rows``: for a script whose rows are the whole state
    (derived from stored runs), so their order is its own."""
    body = "\n".join([_line(header), _line(["---"] * len(header)), *map(_line, rows)])
    head, _, tail = _split(path.read_text(encoding="utf-8"), name)
    atomic_write_text(path, f"{head}\n{body}\n{tail}")
