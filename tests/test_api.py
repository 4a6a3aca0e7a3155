"""The public API's contracts: registries refuse silent replacement and cannot be mutated; one package version."""

from __future__ import annotations

import importlib
import importlib.metadata
import tomllib
from pathlib import Path

import pytest
import torch

import inactive_heads as ih
from inactive_heads import _version
from inactive_heads.runs import store
from inactive_heads.scores import LayerStats
from inactive_heads.tasks import Item, Task


def _ahon(s: LayerStats) -> torch.Tensor:
    assert s.ahon is not None
    return s.ahon


def _ahon_doubled(s: LayerStats) -> torch.Tensor:
    assert s.ahon is not None
    return 2 * s.ahon


def _task(data_dir: Path | None, source: str) -> Task:
    return Task(name="api_test_task", items=[Item("0", ("Q: 2+2?\nA:",), (" 4", " 5"), 0)])


def _other_task(data_dir: Path | None, source: str) -> Task:
    return Task(name="api_test_task", items=[Item("0", ("Q: 3+3?\nA:",), (" 6", " 7"), 0)])


@pytest.fixture
def score_name(registrations):
    return "api_test_score"


@pytest.fixture
def task_name(registrations):
    return "api_test_task"


def test_duplicate_score_raises_unless_override(score_name):
    ih.register_score(score_name, label="AHON copy", needs={"ahon"})(_ahon)
    first = ih.SCORE_FUNCTIONS[score_name]
    with pytest.raises(ValueError, match=f"score '{score_name}' is already registered.*override=True"):
        ih.register_score(score_name, needs={"ahon"})(_ahon_doubled)
    assert ih.SCORE_FUNCTIONS[score_name] is first
    ih.register_score(score_name, label="AHON x2", needs={"ahon"}, override=True)(_ahon_doubled)
    spec = ih.SCORE_FUNCTIONS[score_name]
    assert spec.fn is _ahon_doubled and spec.label == "AHON x2" and spec.fingerprint != first.fingerprint
    scores = ih.HeadScores({"ahon": torch.rand(2, 3, 4)}).derive([score_name])
    torch.testing.assert_close(scores[score_name], 2 * scores["ahon"])


def test_builtin_score_is_not_replaced_by_accident():
    builtin = ih.SCORE_FUNCTIONS["ahon"]
    with pytest.raises(ValueError, match="already registered"):
        ih.register_score("ahon", needs={"ahon"})(_ahon_doubled)
    assert ih.SCORE_FUNCTIONS["ahon"] is builtin


def test_duplicate_task_raises_unless_override(task_name):
    ih.register_task(task_name, summary="first")(_task)
    with pytest.raises(ValueError, match=f"task '{task_name}' is already registered.*override=True"):
        ih.register_task(task_name, summary="second")(_other_task)
    assert ih.TASKS[task_name].summary == "first"
    ih.register_task(task_name, summary="second", override=True)(_other_task)
    assert ih.TASKS[task_name].summary == "second" and ih.TASKS[task_name].fn is _other_task
    assert ih.TASKS[task_name].load().items[0].contexts == ("Q: 3+3?\nA:",)


def test_registries_are_read_only_live_views(score_name):
    for registry in (ih.SCORE_FUNCTIONS, ih.TASKS):
        some = next(iter(registry))
        with pytest.raises(TypeError):
            registry["x"] = registry[some]
        with pytest.raises(TypeError):
            del registry[some]
        for method in ("pop", "update", "clear", "setdefault", "popitem"):
            assert not hasattr(registry, method), method
    assert score_name not in ih.SCORE_FUNCTIONS
    ih.register_score(score_name, needs={"ahon"})(_ahon)
    assert score_name in ih.SCORE_FUNCTIONS  # a view: registrations show without re-importing


def test_version_comes_from_package_metadata():
    assert ih.__version__ == importlib.metadata.version("inactive-heads")
    assert store.package_version() is ih.__version__  # one owner: what run records and cell keys carry
    assert store.cell_key(a=1) == store.cell_key(a=1, package_version=ih.__version__)


def test_version_of_a_source_tree_without_metadata_is_pyprojects():
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    with pyproject.open("rb") as f:
        declared = tomllib.load(f)["project"]["version"]
    assert _version._from_source_tree() == declared == ih.__version__


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_scores_file_ending_in_xz_reads_back_as_the_plain_file(tmp_path, dtype):
    scores = ih.HeadScores({"awft": torch.rand(5, 3, 4), "ahon": torch.rand(5, 3, 4) * 100}, {"task": "piqa", "n": 5})
    plain, packed = tmp_path / "s.safetensors", tmp_path / "s.safetensors.xz"
    scores.save(plain, dtype=dtype)
    scores.save(packed, dtype=dtype)
    a, b = ih.HeadScores.load(plain), ih.HeadScores.load(packed)
    assert b.meta == a.meta == {"task": "piqa", "n": 5} and b.names == a.names == ["ahon", "awft"]
    assert all(torch.equal(a[n], b[n]) and b[n].dtype == torch.float32 for n in a.names)
    assert packed.read_bytes().startswith(b"\xfd7zXZ") and not plain.read_bytes().startswith(b"\xfd7zXZ")
