"""The ``inactive-heads`` command end to end on a tiny model saved to disk and the generated recall task."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from _tiny import tiny_model, tiny_tokenizer

import inactive_heads.evaluation as evaluation
from inactive_heads import analysis
from inactive_heads.cli import main
from inactive_heads.scores import _SCORE_FUNCTIONS, SCORE_FUNCTIONS, HeadScores

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


@pytest.fixture
def no_plugin_scores():
    yield
    _SCORE_FUNCTIONS.pop("ahon_sq", None)
    sys.modules.pop("inactive_heads_plugin_my_scores", None)


def _cells(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run_dir / "cells").glob("*.json"))]


def _table2_from_markdown(md: str) -> dict[str, tuple[float, float]]:
    rows = re.findall(r"^\| (\w+) \| [^|]+ \| ([\d.]+) \| ([\d.]+) \| [\d.]+ \|$", md, flags=re.M)
    return {name: (float(pct), float(auc)) for name, pct, auc in rows}


def test_calibrate_sweep_report_compare_chain(model_dirs, tmp_path, monkeypatch, capsys, no_plugin_scores):
    run, other, out = tmp_path / "run", tmp_path / "other", tmp_path / "report"
    assert main(["calibrate", "--model", model_dirs[0], *_RUN, "--run-dir", str(run)]) == 0
    cal = HeadScores.load(run / "calibration" / "scores.safetensors")
    assert set(cal.names) == set(SCORE_FUNCTIONS) and cal.shape[1:] == (3, 4)
    meta = json.loads((run / "calibration" / "meta.json").read_text())
    assert meta["task"] == "recall" and meta["n_items"] == 12 and meta["rows"] == cal.shape[0]

    sweep = ["sweep", "--model", model_dirs[0], *_RUN, "--run-dir", str(run), "--targets", "0.1,0.3"]
    assert main([*sweep, "--scores", "ahon_ln,awft,random"]) == 0
    cells = _cells(run)
    assert len(cells) == 1 + 3 * 2
    baseline = next(c for c in cells if c["score"] is None)
    assert baseline["fraction_zeroed"] == 0.0 and len(baseline["per_item"]["pred"]) == 12
    for c in cells:
        if c["score"] is not None:
            assert 0.0 < c["fraction_zeroed"] < 0.6, c  # the threshold zeroes roughly its target share
    out_text = capsys.readouterr().out
    assert f"baseline accuracy {100 * baseline['accuracy']:.2f}%" in out_text

    # Rerun, plus a score registered by a plugin: only the new score's cells run, derived from the calibration.
    plugin = tmp_path / "my_scores.py"
    plugin.write_text(_PLUGIN)
    calls = []
    real = evaluation.evaluate
    monkeypatch.setattr(evaluation, "evaluate", lambda *a, **k: calls.append(k) or real(*a, **k))
    assert main([*sweep, "--plugin", str(plugin), "--scores", "ahon_ln,awft,random,ahon_sq"]) == 0
    assert len(calls) == 2 and all(k["policy"].score == "ahon_sq" and not k.get("record") for k in calls)
    derived = HeadScores.load(run / "calibration" / "scores.safetensors")
    torch.testing.assert_close(derived["ahon_sq"], cal["ahon"] ** 2)
    calls.clear()
    assert main([*sweep, "--plugin", str(plugin), "--scores", "ahon_ln,awft,random,ahon_sq"]) == 0
    assert calls == []

    capsys.readouterr()
    assert main(["report", str(run), "-o", str(out)]) == 0
    assert str((out / "report.html").resolve()) in capsys.readouterr().out
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    assert f"baseline accuracy {100 * baseline['accuracy']:.2f}%" in md
    # Every Table-2 number in the report is the one computed from the stored cells.
    cells = _cells(run)
    table = _table2_from_markdown(md)
    assert set(table) == {"ahon_ln", "awft", "random", "ahon_sq"}
    base = (0.0, baseline["accuracy"])  # every curve starts at the baseline
    curves = {s: [base] + [(c["fraction_zeroed"], c["accuracy"]) for c in cells if c["score"] == s] for s in table}
    hi = min(max(x for x, _ in pts) for pts in curves.values())
    for s, (pct, auc) in table.items():
        assert pct == pytest.approx(100 * analysis.max_zeroed_within(curves[s], baseline["accuracy"]), abs=0.051)
        assert auc == pytest.approx(analysis.normalized_auc(curves[s], baseline["accuracy"], hi), abs=5e-4)
    images = re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", md)
    assert images and all((out / name).is_file() for name in images)
    assert html.count('src="data:image/png;base64,') == len(images) and "<table" in html

    assert main(["calibrate", "--model", model_dirs[1], *_RUN, "--run-dir", str(other)]) == 0
    capsys.readouterr()
    assert main(["compare", str(run), str(other), "-o", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    b = HeadScores.load(other / "calibration" / "scores.safetensors")
    w1 = analysis.wasserstein1(derived["ahon_ln"], b["ahon_ln"])
    row = re.search(r"^\| ahon_ln \| ([^ ]+) \|", printed, flags=re.M)
    assert row and float(row.group(1)) == pytest.approx(w1, rel=1e-3)
    assert list(tmp_path.glob("compare_*.png"))


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
