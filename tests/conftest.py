"""Shared test fixtures: the real benchmark data and the real pretrained model, temporary registrations, and the
``--all`` option.

Tests that need the real data take the ``data_dir`` fixture, which skips them (naming the missing folder) where
neither ``$INACTIVE_HEADS_DATA`` nor ``../shared/data`` beside the checkout is there. The real model
(SmolLM2-135M-Instruct) travels as a PyPI package that ``.ci/setup`` installs, so a missing package fails the test
instead of skipping it. Tests that load a real model are marked ``slow``, the large tiny-model grids ``grid``; both
run only with ``--all``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from inactive_heads import InactiveHeadsError

#: The repository root.
ROOT = Path(__file__).resolve().parents[1]
#: Real benchmark files (read-only) in the layout of ``$INACTIVE_HEADS_DATA``; by default ``../shared`` beside the
#: checkout.
DATA = Path(os.environ.get("INACTIVE_HEADS_DATA") or ROOT.parent / "shared" / "data")
#: Markers of the tests that run only with ``--all``.
FULL_ONLY = ("slow", "grid")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--all", action="store_true", help=f"also run the tests marked {' or '.join(FULL_ONLY)}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--all"):
        return
    kept: list[pytest.Item] = []
    full_only: list[pytest.Item] = []
    for item in items:
        (full_only if any(item.get_closest_marker(m) for m in FULL_ONLY) else kept).append(item)
    if full_only:
        config.hook.pytest_deselected(items=full_only)
        items[:] = kept


def covering_grid(*axes: Sequence[Any]) -> list[Any]:
    """The product of ``axes`` as parameter sets of one ``parametrize``, all but a covering subset marked ``grid``: the
    default run takes the i-th value of every axis (cycling through the shorter ones), so each value runs once."""
    n = max(len(axis) for axis in axes)
    kept = {tuple(i % len(axis) for axis in axes) for i in range(n)}
    return [
        pytest.param(
            *(axis[i] for axis, i in zip(axes, index, strict=True)), marks=() if index in kept else pytest.mark.grid
        )
        for index in itertools.product(*(range(len(axis)) for axis in axes))
    ]


@contextlib.contextmanager
def temporary_registrations() -> Iterator[None]:
    """Score functions, tasks, executors and plugin files registered or loaded inside the block are forgotten after
    it, and any registration they replaced is back."""
    from inactive_heads.scores import _SCORE_FUNCTIONS
    from inactive_heads.studies.executors import _EXECUTORS
    from inactive_heads.tasks import _TASKS

    registries: list[dict[str, Any]] = [_SCORE_FUNCTIONS, _TASKS, _EXECUTORS]
    saved = [dict(r) for r in registries]
    plugins = {m for m in sys.modules if m.startswith("inactive_heads_plugin_")}
    try:
        yield
    finally:
        for registry, before in zip(registries, saved, strict=True):
            registry.clear()
            registry.update(before)
        # A plugin file left in sys.modules would not run (and register) again in a later test.
        for m in [m for m in sys.modules if m.startswith("inactive_heads_plugin_") and m not in plugins]:
            del sys.modules[m]


@pytest.fixture
def registrations() -> Iterator[None]:
    """Undoes the test's registrations afterwards (:func:`temporary_registrations`)."""
    with temporary_registrations():
        yield


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real benchmark data folder; skips the test where it is absent."""
    if not DATA.is_dir():
        pytest.skip(f"real benchmark data not found: {DATA} (set $INACTIVE_HEADS_DATA or add ../shared/data)")
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
