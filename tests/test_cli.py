"""The ``inactive-heads`` command end to end on a tiny model saved to disk and the generated recall task."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _tiny import tiny_model, tiny_tokenizer

import inactive_heads.evaluation as evaluation
from inactive_heads import analysis
from inactive_heads.cli import main
from inactive_heads.scores import SCORE_FUNCTIONS, HeadScores
from inactive_heads.stats.bootstrap import bootstrap_wasserstein

_RUN = ["--task", "recall", "--limit", "12", "--batch-size", "8"]
_PLUGIN = """
import inactive_heads as ih

@ih.register_score("ahon_sq", label="AHON^2", inactive_when="below", needs={"ahon"})
def ahon_sq(s):
    return s.ahon ** 2
"""


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    dirs = []
    for seed in (0, 1):
        d = tmp_path_factory.mktemp(f"tiny{seed}")
        tiny_model("llama", seed=seed).save_pretrained(d)
        tiny_tokenizer().save_pretrained(d)
        dirs.append(str(d))
    return dirs


def _cells(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run_dir / "cells").glob("*.json"))]


def _table2_from_markdown(md: str) -> dict[str, tuple[float, float, bool]]:
    """score -> (max % zeroed, AUC, whether the value is marked as a lower bound)."""
    rows = re.findall(r"^\| (\w+) \| [^|]+ \| (≥?)([\d.]+) \| ([\d.]+) \| [\d.]+ \|$", md, flags=re.M)
    return {name: (float(pct), float(auc), bound == "≥") for name, bound, pct, auc in rows}


def _main(argv: list[str]) -> str:
    """Run the command, assert it succeeded, and return what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue()


def _sweep(model: str, run: Path) -> list[str]:
    return ["sweep", "--model", model, *_RUN, "--run-dir", str(run), "--targets", "0.1,0.3"]


@pytest.fixture(scope="module")
def swept(model_dirs, tmp_path_factory) -> SimpleNamespace:
    """One run directory: calibrated, then swept over 3 scores x 2 targets (read-only for the tests)."""
    run = tmp_path_factory.mktemp("cli") / "run"
    _main(["calibrate", "--model", model_dirs[0], *_RUN, "--run-dir", str(run)])
    calibration = HeadScores.load(run / "calibration" / "scores.safetensors")
    printed = _main([*_sweep(model_dirs[0], run), "--scores", "ahon_ln,awft,random"])
    return SimpleNamespace(dir=run, calibration=calibration, printed=printed)


def test_calibrate_records_every_score_for_every_row(swept):
    cal = swept.calibration
    assert set(cal.names) == set(SCORE_FUNCTIONS) and cal.shape[1:] == (3, 4)
    meta = json.loads((swept.dir / "calibration" / "meta.json").read_text())
    assert meta["task"] == "recall" and meta["n_items"] == 12 and meta["rows"] == cal.shape[0]


def test_sweep_stores_the_baseline_and_every_score_target_cell(swept):
    cells = _cells(swept.dir)
    assert sorted((c["score"] or "", c.get("target") or 0.0) for c in cells) == [("", 0.0)] + [
        (s, p) for s in ("ahon_ln", "awft", "random") for p in (0.1, 0.3)
    ]
    baseline = next(c for c in cells if c["score"] is None)
    assert baseline["fraction_zeroed"] == 0.0 and len(baseline["per_item"]["pred"]) == 12
    assert f"baseline accuracy {100 * baseline['accuracy']:.2f}%" in swept.printed
    for c in cells:
        if c["score"] is not None:
            assert 0.0 < c["fraction_zeroed"] < 0.6, c  # the threshold zeroes roughly its target share


def test_plugin_score_runs_only_its_cells_from_the_recorded_calibration(
    swept, model_dirs, tmp_path, monkeypatch, registrations
):
    run = tmp_path / "run"
    shutil.copytree(swept.dir, run)
    plugin = tmp_path / "my_scores.py"
    plugin.write_text(_PLUGIN)
    calls = []
    real = evaluation.evaluate
    monkeypatch.setattr(evaluation, "evaluate", lambda *a, **k: calls.append(k) or real(*a, **k))
    sweep = [*_sweep(model_dirs[0], run), "--plugin", str(plugin), "--scores", "ahon_ln,awft,random,ahon_sq"]
    _main(sweep)
    # Two targets of the new score, no calibration forward: its values derive from the recorded statistics.
    assert len(calls) == 2 and all(k["policy"].score == "ahon_sq" and not k.get("record") for k in calls)
    derived = HeadScores.load(run / "calibration" / "scores.safetensors")
    torch.testing.assert_close(derived["ahon_sq"], swept.calibration["ahon"] ** 2)
    calls.clear()
    _main(sweep)
    assert calls == []


@pytest.fixture(scope="module")
def report(swept, tmp_path_factory) -> SimpleNamespace:
    out = tmp_path_factory.mktemp("report")
    printed = _main(["report", str(swept.dir), "-o", str(out)])
    return SimpleNamespace(dir=out, printed=printed, md=(out / "report.md").read_text())


def test_report_table2_is_computed_from_the_stored_cells(swept, report):
    cells = _cells(swept.dir)
    baseline = next(c["accuracy"] for c in cells if c["score"] is None)
    assert f"baseline accuracy {100 * baseline:.2f}%" in report.md
    table = _table2_from_markdown(report.md)
    assert set(table) == {"ahon_ln", "awft", "random"}
    base = (0.0, baseline)  # every curve starts at the baseline
    curves = {s: [base] + [(c["fraction_zeroed"], c["accuracy"]) for c in cells if c["score"] == s] for s in table}
    hi = min(max(x for x, _ in pts) for pts in curves.values())
    for s, (pct, auc, bound) in table.items():
        assert pct == pytest.approx(100 * analysis.max_zeroed_within(curves[s], baseline), abs=0.051)
        last = max(curves[s])  # the largest fraction measured: a lower bound when still within one point there
        assert bound == (last[0] > 0 and last[1] >= baseline - 0.01 - 1e-9), s
        assert auc == pytest.approx(analysis.normalized_auc(curves[s], baseline, hi), abs=5e-4)


def test_report_prints_its_path_and_embeds_every_figure(report):
    assert str((report.dir / "report.html").resolve()) in report.printed
    images = re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", report.md)
    assert images and all((report.dir / name).is_file() for name in images)
    html = (report.dir / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == len(images) and "<table" in html


def test_compare_prints_w1_between_two_models_calibration_scores(swept, model_dirs, tmp_path, capsys):
    other = tmp_path / "other"
    _main(["calibrate", "--model", model_dirs[1], *_RUN, "--run-dir", str(other)])
    printed = _main(["compare", str(swept.dir), str(other), "-o", str(tmp_path), "--resamples", "200"])
    b = HeadScores.load(other / "calibration" / "scores.safetensors")
    items = json.loads((other / "calibration" / "meta.json").read_text())["row_items"]
    assert items == json.loads((swept.dir / "calibration" / "meta.json").read_text())["row_items"]
    # both calibrated on the same items: one resample of items serves both models
    iv = bootstrap_wasserstein(swept.calibration["ahon_ln"], items, b["ahon_ln"], items, paired=True, n_resamples=200)
    assert iv.value == pytest.approx(analysis.wasserstein1(swept.calibration["ahon_ln"], b["ahon_ln"]))
    row = re.search(r"^\| ahon_ln \| ([^ ]+) \[([^,]+), ([^]]+)\] \|", printed, flags=re.M)
    assert row and [float(x) for x in row.groups()] == pytest.approx([iv.value, iv.low, iv.high], rel=1e-3)
    assert list(tmp_path.glob("compare_*.png"))
    one = _main(["compare", str(swept.dir), str(other), "-o", str(tmp_path), "--resamples", "0", "--scores", "awft"])
    assert re.search(r"^\| awft \| [^ ]+ \| ", one, flags=re.M) and "ahon_ln" not in one
    capsys.readouterr()
    assert main(["compare", str(swept.dir), str(other), "--scores", "nope"]) == 2
    assert "['nope'] are not recorded in both runs" in capsys.readouterr().err


def test_prune_writes_a_loadable_model_and_its_measurements(swept, model_dirs, tmp_path):
    import inactive_heads as ih
    from inactive_heads.pruning import pruned_mask

    out = tmp_path / "pruned"
    printed = _main(["prune", "--run-dir", str(swept.dir), "--score", "ahon_ln", "--fraction", "0.25", "-o", str(out),
                     "--repeats", "1", "--prefill-tokens", "16"])  # fmt: skip
    summary = json.loads((out / "pruning.json").read_text())
    mask = ih.static_mask(swept.dir, score="ahon_ln", fraction=0.25)
    assert summary["removed_heads"] == [row.nonzero().flatten().tolist() for row in mask] and mask.sum() == 3
    loaded, _ = ih.load_model(out)
    assert torch.equal(pruned_mask(loaded), mask)
    params = summary["parameter_bytes"]
    assert params[1] < params[0] and summary["kv_cache_bytes_per_token"][1] <= summary["kv_cache_bytes_per_token"][0]
    # The unpruned accuracy is the run's own baseline: the same items and settings.
    baseline = next(c for c in _cells(swept.dir) if c["score"] is None)
    assert summary["accuracy"][0] == baseline["accuracy"] and summary["task"] == "recall"
    # The pruned model scores as the unpruned one with the same heads statically zeroed.
    model, tok = ih.load_model(model_dirs[0])
    zeroed = evaluation.evaluate(model, tok, "recall", ih.EvalConfig(limit=12), policy=ih.Policy(mask=mask))
    assert summary["accuracy"][1] == zeroed.metrics["acc"]
    assert f"{100 * summary['accuracy'][0]:.2f}% -> {100 * summary['accuracy'][1]:.2f}%" in printed
    assert main(["prune", "--run-dir", str(swept.dir), "--score", "ahon_ln", "--fraction", "0.25", "-o", str(out)]) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sweep", "--model", "/no/such/model", "--task", "recall"], "does not exist"),
        (["sweep", "--model", "{model}", "--task", "nope"], "unknown task 'nope'"),
        (["sweep", "--model", "{model}", "--task", "recall", "--limit", "2", "--scores", "bogus"], "not registered"),
        (["list", "--plugin", "/no/such.py"], "plugin file"),
        (["report", "{tmp}", "-o", "{tmp}/out"], "not a run directory"),
        (["sweep", "--model", "{model}", "--task", "piqa", "--data-dir", "{tmp}"], "piqa"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(model_dirs, tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)  # default run directories go under the working directory
    argv = [a.format(model=model_dirs[0], tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("inactive-heads: error: ") and message in err[-1]
    assert "Traceback" not in "\n".join(err)


def test_bad_targets_are_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as e:
        main(["sweep", "--model", "m", "--task", "recall", "--targets", "0.1,2"])
    assert e.value.code == 2 and "fractions of heads" in capsys.readouterr().err


def test_list_shows_scores_and_tasks(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in SCORE_FUNCTIONS) and "recall" in out and "mmlu_<subject>" in out


def test_a_reader_that_goes_away_ends_the_output_quietly(monkeypatch, capsys, tmp_path):
    class ClosedPipe(io.StringIO):  # `inactive-heads list | head -1` once head has exited
        def __init__(self, fd: int):
            super().__init__()
            self.fd = fd

        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self) -> int:
            return self.fd

    with open(tmp_path / "stdout", "w") as f:
        monkeypatch.setattr("sys.stdout", ClosedPipe(f.fileno()))
        assert main(["list"]) == 141
    assert capsys.readouterr().err == ""  # no "error: Broken pipe", no traceback
