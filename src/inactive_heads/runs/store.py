"""The store of finished sweep cells: content-addressed cell keys and one atomically written file per cell.

Writes go through :mod:`inactive_heads.atomic`, so a process killed mid-write leaves at most a stray ``.*.tmp`` file,
which the store ignores.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ..atomic import TMP_SUFFIX, atomic_write_json, canonical_json, plain_json
from ..errors import InactiveHeadsError

__all__ = [
    "ResultStore",
    "cell_key",
    "package_version",
]

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

T = TypeVar("T")


def package_version() -> str:
    """The installed package's version (imported here: store.py has no other import from the package)."""
    from .._version import __version__

    return __version__


def cell_key(**fields: Any) -> str:
    """Content address of a sweep cell: sha256 (first 32 hex digits) of the canonical JSON of ``fields``.

    Pass everything that changes the answer (model identity, task, shots, limit, seed, score, threshold, ...).
    ``package_version`` is added from the installed package when not given, so a new version never reuses old cells.
    Floats key by their exact repr, so pass the threshold actually used, not a rounded copy.
    """
    fields.setdefault("package_version", package_version())
    return hashlib.sha256(canonical_json(fields).encode("ascii")).hexdigest()[:32]


class ResultStore:
    """Finished cells as ``<root>/<key>.json`` JSON objects.

    ``put`` is atomic. A file that does not parse as a JSON object (or lacks a field in ``required``, or makes
    ``validate`` raise ValueError) is treated as not done: ``has`` is False, ``get`` raises KeyError, ``keys`` skips
    it, ``load`` skips it with a warning, and the next ``put`` replaces it. ``put`` refuses a value that would read
    back as not done.
    """

    def __init__(
        self,
        root: str | Path,
        required: Iterable[str] = (),
        validate: Callable[[dict[str, Any]], object] | None = None,
    ):
        self.root = Path(root)
        self.required = tuple(required)
        self.validate = validate

    def path(self, key: str) -> Path:
        if not key or "/" in key or "\\" in key or key.startswith("."):
            raise InactiveHeadsError(f"invalid cell key {key!r}")
        return self.root / f"{key}.json"

    def _lock_path(self, key: str) -> Path:
        self.path(key)  # validates the key
        return self.root / f".{key}.lock"

    def _load(self, key: str) -> tuple[dict[str, Any] | None, str]:
        """The stored JSON object with every required field, or None and what is wrong with the file ('' when
        there is none)."""
        try:
            obj = json.loads(self.path(key).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None, ""
        except (OSError, UnicodeDecodeError, ValueError) as e:  # a torn write leaves truncated JSON
            return None, f"unreadable ({e})"
        if not isinstance(obj, dict):
            return None, f"not a JSON object but {type(obj).__name__}"
        missing = [f for f in self.required if f not in obj]
        if missing:
            return None, f"lacks {missing}"
        return obj, ""

    def _read(self, key: str) -> dict[str, Any] | None:
        obj, _ = self._load(key)
        if obj is not None and self.validate is not None:
            try:
                self.validate(obj)
            except ValueError:
                return None
        return obj

    def has(self, key: str) -> bool:
        """Whether ``key`` holds a complete, readable cell."""
        return self._read(key) is not None

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.has(key)

    def get(self, key: str) -> dict[str, Any]:
        """The stored cell; KeyError when missing or corrupt."""
        obj = self._read(key)
        if obj is None:
            raise KeyError(key)
        return obj

    def put(self, key: str, value: Mapping[str, Any]) -> None:
        """Store ``value`` (a JSON object) under ``key`` atomically, replacing any previous or corrupt file."""
        missing = [f for f in self.required if f not in value]
        if missing:
            raise InactiveHeadsError(f"cell {key!r} lacks required fields {missing}")
        record = plain_json(dict(value))
        if self.validate is not None:
            self.validate(record)  # what a reader would reject must not be written
        # One line: a study keeps thousands of records (per-item answers), a fifth smaller without indentation.
        atomic_write_json(self.path(key), record, indent=None)

    @contextlib.contextmanager
    def claim(self, key: str, *, wait: bool = False) -> Iterator[bool]:
        """Hold the exclusive right to compute ``key`` for the block; yields False if another process holds it.

        The right is an advisory ``flock`` on ``.<key>.lock`` beside the cell, so a process that dies (SIGKILL, a
        lost node) releases it with its file descriptors, and no lock is ever stale. ``wait=True`` blocks until the
        holder is done. Compute only when the block gets True and the cell is still missing (``has`` again: the
        holder may have just finished it). Without ``fcntl`` (Windows) every claim succeeds.
        """
        lock = self._lock_path(key)
        if fcntl is None:  # type: ignore[comparison-overlap,unused-ignore]
            yield True  # type: ignore[unreachable,unused-ignore]
            return
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                yield False
                return
            yield True
        finally:
            os.close(fd)  # releases the lock

    def held(self, key: str) -> bool:
        """Whether another process holds ``key``'s claim now (a snapshot: it may be taken or let go right after)."""
        if fcntl is None or not self._lock_path(key).is_file():  # type: ignore[comparison-overlap,unused-ignore]
            return False  # never claimed: without creating the lock file (nor the folder) for it
        with self.claim(key) as mine:
            return not mine

    def _stored(self) -> list[str]:
        """Keys of every cell file, complete or not, sorted."""
        if not self.root.is_dir():
            return []
        found = (p.name[: -len(".json")] for p in self.root.iterdir() if p.name.endswith(".json"))
        return sorted(k for k in found if not k.startswith("."))

    def keys(self) -> list[str]:
        """Keys of complete cells, sorted."""
        return [k for k in self._stored() if self.has(k)]

    def load(self, parse: Callable[[dict[str, Any]], T], keys: Iterable[str] | None = None) -> Iterator[tuple[str, T]]:
        """``(key, parse(cell))`` for each stored cell of ``keys`` (default: every file, sorted by key), in that order.

        ``parse`` takes the place of ``validate``, so each cell is parsed once. A file that is there but is not a
        complete cell (unreadable, not a JSON object, lacking a required field, or rejected by ``parse`` with
        ValueError) is skipped with a warning that names it and what is wrong; a missing file is skipped silently.
        """
        for key in self._stored() if keys is None else keys:
            obj, problem = self._load(key)
            if obj is not None:
                try:
                    value = parse(obj)
                except ValueError as e:
                    problem = str(e)
                else:
                    yield key, value
                    continue
            if problem:
                warnings.warn(f"skipped cell file {self.path(key)}: {problem}", stacklevel=2)

    def __len__(self) -> int:
        return len(self.keys())

    def remove_stale_tmp(self) -> int:
        """Delete temp files left by killed writers; returns how many. Only call when no writer is running."""
        if not self.root.is_dir():
            return 0
        stale = [p for p in self.root.iterdir() if p.name.startswith(".") and p.name.endswith(TMP_SUFFIX)]
        for p in stale:
            with contextlib.suppress(OSError):
                p.unlink()
        return len(stale)
