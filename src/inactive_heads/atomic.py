"""Crash-safe files: atomic writes and the canonical JSON that content keys hash.

A write goes to a temporary file in the destination's directory, is fsynced, and is renamed over the destination
with :func:`os.replace` (atomic on POSIX and Windows within one file system), then the directory is fsynced so the
rename itself survives a power cut. A reader therefore sees the old file or the new one, never a mix; a process killed
mid-write leaves at most a stray ``.*.tmp`` file.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import InactiveHeadsError

__all__ = ["TMP_SUFFIX", "atomic_write_bytes", "atomic_write_json", "atomic_write_text", "canonical_json", "plain_json"]

TMP_SUFFIX = ".tmp"


def _fsync_dir(directory: Path) -> None:
    # Directories cannot be opened for fsync on Windows; the rename is still atomic there.
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same directory, fsync, ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        if os.name == "posix":
            os.fchmod(fd, 0o644)  # mkstemp's 0600 would make results unreadable to collaborators
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode(encoding))


def plain_json(value: Any) -> Any:
    """``value`` with tensors, numpy values and paths turned into plain JSON types."""
    # Tensors, numpy scalars/arrays and paths appear in results; turn them into plain JSON types.
    if isinstance(value, Mapping):
        return {str(k): plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist") and callable(value.tolist):
        return plain_json(value.tolist())
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value


def atomic_write_json(path: str | Path, obj: Any, *, indent: int | None = 1) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (tensors and numpy values converted; NaN written as ``NaN``)."""
    atomic_write_text(path, json.dumps(plain_json(obj), indent=indent, sort_keys=True) + "\n")


def canonical_json(obj: Any) -> str:
    """The canonical JSON of ``obj``: sorted keys, no whitespace, ASCII; NaN/inf rejected (they have no JSON form)."""
    obj = plain_json(obj)

    def check(v: Any) -> None:
        if isinstance(v, float) and not math.isfinite(v):
            raise InactiveHeadsError(f"cannot key on non-finite float {v!r}")
        if isinstance(v, dict):
            for x in v.values():
                check(x)
        elif isinstance(v, list):
            for x in v:
                check(x)

    check(obj)
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
