"""The package version, from the installed distribution's metadata; ``pyproject.toml`` holds the only literal."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

__all__ = ["__version__"]

_DISTRIBUTION = "inactive-heads"


def _from_source_tree() -> str:
    # A source checkout on sys.path without an installed distribution: read the version pyproject.toml declares.
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return "0+unknown"
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, flags=re.M)
    return match.group(1) if match else "0+unknown"


try:
    __version__: str = importlib.metadata.version(_DISTRIBUTION)
except importlib.metadata.PackageNotFoundError:
    __version__ = _from_source_tree()
