"""The newer surfaces under bad input and faults: study files, Ray, prune, sweep, record_scores, lm-eval, the CLI.

Every check that needs no model runs before one loads, so these tests replace the loader with one that fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from _tiny import tiny_model, tiny_tokenizer

import inactive_heads as ih
from inactive_heads import cli
from inactive_heads.errors import InactiveHeadsError
from inactive_heads.runs.directory import RunDir
from inactive_heads.studies.executors import RayExecutor


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any attempt to load a model fails the test: the command must have refused before."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was refused")

    monkeypatch.setattr(cli, "_load", refuse)
    monkeypatch.setattr("inactive_heads.loading.load_model", refuse)


def _error(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err  # one line
    return err


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    tiny_model("llama").save_pretrained(root / "llama")
    tiny_tokenizer().save_pretrained(root / "llama")
    return root


def _study(root: Path, *, seed: int = 0, spec: str = "llama", extra: str = "") -> Path:
    path = root / "s.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            name = "s"
            scores = ["ahon_ln"]
            targets = [0.25]
            seed = {seed}
            batch_size = 4
            {extra}

            [[models]]
            name = "m"
            spec = "{spec}"

            [[tasks]]
            name = "recall"
            limit = 4
            """
        )
    )
    return path


def test_report_only_without_a_stored_baseline_removes_the_stale_report(tiny_dir, tmp_path, capsys):
    out = tmp_path / "study"
    ih.study(_study(tiny_dir), out, progress=False)
    assert (out / "report" / "cells.csv").is_file()
    # The same study with another seed has other runs, none computed: the old report must not stay beside it.
    assert cli.main(["study", str(_study(tiny_dir, seed=1)), "--out", str(out), "--report-only"]) == 0
    assert "no report written: no run of the study has a stored baseline" in capsys.readouterr().err
    assert not (out / "report").exists()
    assert json.loads((out / "study.json").read_text())["study"]["seed"] == 1


def test_nothing_to_run_starts_no_executor(tiny_dir, tmp_path, monkeypatch):
    out = tmp_path / "study"
    ih.study(_study(tiny_dir), out, progress=False, report=False)

    def refuse(self):
        raise AssertionError("an executor was started with nothing to run")

    monkeypatch.setattr(ih.studies.executors.LocalExecutor, "__enter__", refuse)
    result = ih.study(_study(tiny_dir), out, progress=False)
    assert result.computed == 0 and result.report is not None


def test_an_unreachable_ray_address_fails_at_once_before_anything_is_written(tiny_dir, tmp_path, capsys):
    out = tmp_path / "study"
    t0 = time.perf_counter()
    err = _error(
        capsys, ["study", str(_study(tiny_dir)), "--out", str(out), "--executor", "ray", "--address", "127.0.0.1:1"]
    )
    assert time.perf_counter() - t0 < 10
    assert "cannot reach a Ray cluster at 127.0.0.1:1" in err
    assert not out.exists()
    with pytest.raises(InactiveHeadsError, match="not host:port"):
        RayExecutor(address="nonsense")


def test_a_missing_model_file_fails_before_anything_is_written(tiny_dir, tmp_path, capsys, no_model_loads):
    out = tmp_path / "study"
    err = _error(capsys, ["study", str(_study(tiny_dir, spec="missing.gguf")), "--out", str(out)])
    assert "missing.gguf is not a file" in err and not out.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sweep", "--model", "m", "--task", "recall", "--scores", "nope"], "score(s) nope not registered"),
        (["sweep", "--model", "m", "--task", "nope"], "unknown task 'nope'"),
        (["calibrate", "--model", "m", "--task", "recall", "--generation-mode", "nope"], "generation_mode must be"),
        (["study", "s.toml", "--executor", "nope"], "unknown executor 'nope'"),
    ],
)
def test_sweep_calibrate_and_study_refuse_bad_names_before_a_model_loads(
    argv, message, tiny_dir, tmp_path, monkeypatch, capsys, no_model_loads
):
    _study(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert message in _error(capsys, argv)


def _calibrated(tmp_path: Path) -> Path:
    model, tok = tiny_model("llama"), tiny_tokenizer()
    run_dir = tmp_path / "run"
    ih.calibrate(model, tok, "recall", run_dir, limit=4, batch_size=4, progress=False)
    return run_dir


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--fraction", "1.5"], "must be a number in (0, 1)"),
        (["--fraction", "nan"], "must be a number in (0, 1)"),
        (["--fraction", "0.001"], "removes none of the model's"),
        (["--score", "nope"], "unknown score 'nope'; registered: awft,"),
    ],
)
def test_prune_refuses_bad_options_before_a_model_loads(options, message, tmp_path, capsys, no_model_loads):
    run_dir = _calibrated(tmp_path)
    argv = ["prune", "--run-dir", str(run_dir), "--score", "ahon_ln", "--fraction", "0.2", "-o", str(tmp_path / "p")]
    for flag, value in zip(options[::2], options[1::2], strict=True):
        argv[argv.index(flag) + 1] = value
    assert message in _error(capsys, argv)


def test_a_run_refused_only_for_its_display_name_says_so(tmp_path):
    model, tok = tiny_model("llama"), tiny_tokenizer()
    run_dir = tmp_path / "run"
    ih.calibrate(model, tok, "recall", run_dir, limit=4, batch_size=4, progress=False, model_name="a")
    with pytest.raises(InactiveHeadsError, match="under the model name 'a', not 'b'; give that name"):
        ih.calibrate(model, tok, "recall", run_dir, limit=4, batch_size=4, progress=False, model_name="b")


def test_record_scores_refuses_texts_longer_than_the_model_positions():
    model = tiny_model("llama")
    limit = model.config.max_position_embeddings
    with pytest.raises(InactiveHeadsError, match=f"more than the model's {limit} positions; pass max_length={limit}"):
        ih.record_scores(model, None, [[1] * (limit + 1)])
    assert ih.record_scores(model, None, [[1] * (limit + 1)], max_length=limit)["ahon"].shape[0] == 1


def test_prune_calibration_reader_needs_a_finished_calibration(tmp_path):
    run_dir = _calibrated(tmp_path)
    RunDir(run_dir).meta_path.unlink()  # an interrupted calibration: scores written, never marked complete
    with pytest.raises(InactiveHeadsError, match="holds no finished calibration"):
        ih.static_mask(run_dir, score="ahon_ln", fraction=0.2)


def test_a_bug_keeps_its_traceback(monkeypatch):
    def bug(args):
        raise KeyError("a programming error, not bad input")

    monkeypatch.setattr(cli, "_cmd_list", bug)
    with pytest.raises(KeyError):
        cli.main(["list"])


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["sweep", "--no-such-option"], ["study", "--help"]])
def test_help_version_and_argument_errors_import_no_torch(argv):
    probe = (
        "import sys\nfrom inactive_heads.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules), file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, check=True)
    assert done.stderr.strip().splitlines()[-1] == "[]"


def test_lm_eval_finds_the_model_by_its_entry_point():
    pytest.importorskip("lm_eval")
    from inactive_heads.lm_eval_model import InactiveHeadsLM

    (entry,) = [e for e in entry_points(group="lm_eval.models") if e.name == "inactive_heads"]
    assert entry.load() is InactiveHeadsLM


def test_a_run_whose_baseline_is_zero_says_why_it_has_no_auc(tmp_path, capsys):
    from _runs import make_cell, make_run

    cells = [make_cell(accuracy=0.0), make_cell("ahon_ln", 0.1, accuracy=0.0, fraction_zeroed=0.1)]
    run_dir = make_run(tmp_path / "gsm8k", cells, task="gsm8k")
    cli._print_table2(run_dir)
    out = capsys.readouterr().out
    assert "nan" not in out and "AUC: none, as the baseline accuracy is 0" in out
    md, _ = ih.write_report([run_dir], tmp_path / "report")
    assert "AUC: none, as the baseline accuracy is 0" in md.read_text()
