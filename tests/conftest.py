"""Shared test fixtures: where the real benchmark data and the real pretrained model are, and loading them once.

Tests that need the real data take the ``data_dir`` fixture, which skips them (naming the missing folder) where
``../shared/data`` is not beside the checkout. The real model (SmolLM2-135M-Instruct) travels as a PyPI package that
``.ci/setup`` installs, so a missing package fails the test instead of skipping it. Tests that load a real model are
marked ``slow``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inactive_heads import InactiveHeadsError

#: The repository root.
ROOT = Path(__file__).resolve().parents[1]
#: Real benchmark files (read-only), laid out as ``$INACTIVE_HEADS_DATA`` expects, in ``../shared`` beside the checkout.
DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real benchmark data folder; skips the test where it is absent."""
    if not DATA.is_dir():
        pytest.skip(f"real benchmark data not found: {DATA} (../shared/data beside the checkout)")
    return DATA


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF file inside its installed package (``.ci/setup`` installs it)."""
    from inactive_heads.loading import demo_model_path

    try:
        return demo_model_path()
    except InactiveHeadsError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of SmolLM2-135M-Instruct in float32, loaded once per test session."""
    from inactive_heads.loading import load_model

    return load_model(smollm2_gguf)
