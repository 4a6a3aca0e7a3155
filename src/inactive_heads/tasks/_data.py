"""File loading helpers shared by the task modules: every problem becomes a :class:`DataError` naming file and row."""

from __future__ import annotations

import bz2
import csv
import importlib.util
import io
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import InactiveHeadsError

__all__ = ["DATA_ENV", "DataError"]

#: Environment variable naming the default data directory (layout of ``../shared/data``).
DATA_ENV = "INACTIVE_HEADS_DATA"


class DataError(InactiveHeadsError):
    """A benchmark file is missing or malformed; the message names the file, the row and the fix."""


def resolve_dir(data_dir: str | Path | None, dataset: str) -> Path:
    """``<data_dir>/<dataset>``; ``data_dir`` defaults to ``$INACTIVE_HEADS_DATA``."""
    if data_dir is None:
        env = os.environ.get(DATA_ENV)
        if not env:
            raise DataError(
                f"no data directory for {dataset!r}: pass data_dir=... (a folder laid out like ../shared/data, "
                f"containing {dataset}/) or set ${DATA_ENV}; or use source='hub' where the HF hub is reachable"
            )
        data_dir = env
    root = Path(data_dir).expanduser()
    folder = root / dataset
    if not folder.is_dir():
        raise DataError(f"{folder} does not exist: data_dir={str(root)!r} must contain a {dataset}/ folder")
    return folder


def require(path: Path, what: str) -> Path:
    """``path`` if it is a file, else a DataError saying what the file should hold."""
    if not path.is_file():
        raise DataError(f"missing file {path}: expected {what}")
    return path


def read_text(path: Path) -> str:
    """The text of a UTF-8 file (``.bz2`` de-compressed), universal newlines; a DataError names a non-UTF-8 line."""
    try:
        data = bz2.decompress(path.read_bytes()) if path.suffix == ".bz2" else path.read_bytes()
    except (OSError, EOFError, ValueError) as e:
        raise DataError(f"cannot read {path}: {e}; restore the original file") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(
            f"{path}, line {line}: not UTF-8 text (byte {data[e.start]:#04x}); the file must be UTF-8 encoded, "
            "as the original benchmark files are"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _not_empty(rows: list[Any], path: Path) -> list[Any]:
    # An empty file would silently evaluate nothing (or drop an MMLU subject) and still print an accuracy.
    if not rows:
        raise DataError(f"{path} holds no rows; restore the original benchmark file (see the data folder's SOURCE.md)")
    return rows


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file (blank lines skipped); row numbers in errors are 1-based line numbers."""
    rows = []
    for lineno, line in enumerate(read_text(path).split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}, line {lineno}: not valid JSON ({e.msg}); the file must be JSON lines") from e
        if not isinstance(row, dict):
            raise DataError(f"{path}, line {lineno}: expected a JSON object, got {type(row).__name__}")
        row["_line"] = lineno
        rows.append(row)
    return _not_empty(rows, path)


def read_lines(path: Path) -> list[str]:
    """Non-empty stripped lines of a text file (e.g. a ``*-labels.lst``)."""
    return _not_empty([line.strip() for line in read_text(path).split("\n") if line.strip()], path)


def read_csv(path: Path, n_fields: int) -> list[tuple[int, list[str]]]:
    """(record number, fields) of a header-less CSV whose every record must have ``n_fields`` fields."""
    out = []
    for recno, rec in enumerate(csv.reader(io.StringIO(read_text(path), newline="")), 1):
        if not rec:
            continue
        if len(rec) != n_fields:
            raise DataError(
                f"{path}, record {recno}: {len(rec)} fields, expected {n_fields}; the file must be the original "
                "header-less CSV parsed with quoting (fields may contain commas and newlines)"
            )
        out.append((recno, rec))
    return _not_empty(out, path)


def field(row: Mapping[str, Any], key: str, path: Path | str, where: str, kind: type | tuple[type, ...] = str) -> Any:
    """``row[key]`` checked for presence and type, else a DataError naming file and row."""
    if key not in row:
        present = sorted(k for k in row if not k.startswith("_"))
        raise DataError(f"{path}, {where}: missing field {key!r} (fields present: {present})")
    value = row[key]
    if not isinstance(value, kind):
        raise DataError(f"{path}, {where}: field {key!r} has type {type(value).__name__}, expected {kind}")
    return value


def package_file(package: str, relative: str, install_hint: str) -> Path:
    """A data file shipped inside an installed package, found without importing (running) the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"package {package!r} is not installed: {install_hint}")
    for base in spec.submodule_search_locations:
        path = Path(base) / relative
        if path.is_file():
            return path
    raise DataError(f"package {package!r} is installed but has no {relative}: {install_hint}")


def hub_rows(path: str, name: str | None, split: str) -> Iterator[dict[str, Any]]:
    """Rows of a HF hub dataset split through ``datasets`` (only where the hub is reachable)."""
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise DataError("source='hub' needs the `datasets` package: pip install 'inactive-heads[hub]'") from e
    try:
        ds = datasets.load_dataset(path, name, split=split)
    except Exception as e:  # pragma: no cover - network dependent
        raise DataError(
            f"could not load {path}/{name or ''} split {split!r} from the HF hub: {e}; "
            "use source='files' with a local data_dir instead"
        ) from e
    for i, row in enumerate(ds):
        yield {**row, "_line": i + 1}


def convert(rows: list[dict[str, Any]], fn: Callable[[dict[str, Any], str], Any], path: Path | str) -> list[Any]:
    """Apply ``fn(row, where)`` to every row, turning KeyError/ValueError/IndexError into a DataError."""
    out = []
    for row in rows:
        where = f"row {row.get('_line', '?')}"
        try:
            out.append(fn(row, where))
        except DataError:
            raise
        except (KeyError, ValueError, IndexError, TypeError, AttributeError) as e:
            raise DataError(f"{path}, {where}: cannot read the row ({type(e).__name__}: {e})") from e
    return out
