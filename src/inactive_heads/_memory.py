"""Returning the heap pages that freed tensors leave behind to the operating system."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Any

__all__: list[str] = []  # internal module


def _load_malloc_trim() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to trim
        return None


_MALLOC_TRIM = _load_malloc_trim()


def release_freed_memory() -> None:
    """Return heap pages that freed tensors left behind to the operating system (glibc; a no-op elsewhere)."""
    # The statistics' temporaries (a few MB each) come from glibc's heap, where the small recorded tensors kept
    # between them pin freed pages. Measured on SmolLM2 at S=2048: peak RSS 1.36x a plain forward without this,
    # 1.03x when trimmed once per forward (after its last attention layer, before the LM head's large logits);
    # trimming after every layer costs ~10% in time, as every later allocation faults its pages in again.
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
