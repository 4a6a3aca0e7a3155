"""Studies: the same cells on every executor, resuming after a killed driver or worker, one report over all runs.

A small study (two tiny models saved to disk, two tasks, a plugin score and task, a few cells) runs with the local
executor and with Ray on a local instance of 2 CPUs. Tests marked ``ray`` start Ray (``.ci/setup`` installs it).
"""

from __future__ import annotations

import contextlib
import csv
import json
import lzma
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from _tiny import tiny_model, tiny_tokenizer
from conftest import temporary_registrations

import inactive_heads as ih
from inactive_heads.cli import main
from inactive_heads.report.crossings import grid_crossings
from inactive_heads.report.figures import delta_figure
from inactive_heads.report.tables import run_bootstrap, threshold_table
from inactive_heads.report.writer import write_report, write_study_report
from inactive_heads.runs.directory import Cell, RunDir, load_run, score_label
from inactive_heads.runs.jobs import plan_cells
from inactive_heads.studies.executors import LocalExecutor, RayExecutor

_PLUGIN = """
import dataclasses
import inactive_heads as ih
from inactive_heads.tasks.recall import recall_task

@ih.register_task("recall_short", summary="recall over 6-word lists")
def recall_short(data_dir, source):
    return dataclasses.replace(recall_task(n_items=30, seed=1, n_words=6), name="recall_short")

@ih.register_score("ahon_sq", label="AHON^2", inactive_when="below", needs={"ahon"})
def ahon_sq(s):
    return s.ahon ** 2
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Two tiny models on disk and a plugin registering a task and a score (unregistered afterwards)."""
    root = tmp_path_factory.mktemp("study")
    for seed, arch in ((0, "llama"), (1, "qwen2")):
        tiny_model(arch, seed=seed).save_pretrained(root / arch)
        tiny_tokenizer().save_pretrained(root / arch)
    (root / "plugin.py").write_text(_PLUGIN)
    with temporary_registrations():
        yield root


def _study_file(root: Path, name: str = "tiny", *, targets: str = "[0.25]", limit: int = 6, extra: str = "") -> Path:
    path = root / f"{name}.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            name = "{name}"
            scores = ["ahon_ln", "ahon_sq"]
            targets = {targets}
            batch_size = 4
            plugins = ["plugin.py"]
            pairs = [["llama", "qwen"]]
            {extra}

            [resources]
            workers = 2
            cpus = 1

            [[models]]
            name = "llama"
            spec = "llama"

            [[models]]
            name = "qwen"
            spec = "qwen2"

            [[tasks]]
            name = "recall"
            limit = {limit}

            [[tasks]]
            name = "recall_short"
            limit = {limit}
            """
        )
    )
    return path


def _cells(out: Path) -> dict[str, dict]:
    """Every stored cell of a study directory by run and key, without its timing; checks each is a valid Cell."""
    found = {}
    assert not list((out / "runs").glob("*/cells/.*.tmp"))  # no temp file of a torn write
    for path in sorted((out / "runs").glob("*/cells/*.json")):
        cell = json.loads(path.read_text())
        Cell.from_json(cell)
        found[f"{path.parent.parent.name}/{path.stem}"] = {k: v for k, v in cell.items() if k != "seconds"}
    return found


def _snapshot(out: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in (out / "runs").glob("*/cells/*.json")}


@pytest.fixture(scope="module")
def local_run(workspace, tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    return ih.study(_study_file(workspace), out, progress=False)


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray", reason="the ray executor needs Ray: .ci/setup installs the ray extra")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


# 2 models x 2 tasks x (baseline + 2 scores x 1 target)
_CELLS = 2 * 2 * 3


def test_local_study_computes_every_cell_and_writes_one_report(local_run, tmp_path):
    assert local_run.cells == local_run.computed == _CELLS and local_run.calibrated == 4 and local_run.reused == 0
    assert len(_cells(local_run.out)) == _CELLS and len(local_run.runs) == 4
    recorded = json.loads((local_run.out / "study.json").read_text())
    assert recorded["study"]["name"] == "tiny" and recorded["study"]["scores"] == ["ahon_ln", "ahon_sq"]
    md = (local_run.out / "report" / "report.md").read_text()
    for heading in (
        "# Study tiny",
        "## recall (0-shot, 6 items; calibrated on the evaluated items)",
        "## recall_short (0-shot, 6 items; calibrated on the evaluated items)",
    ):
        assert heading in md
    assert "| score | label | llama | qwen | mean rank |" in md  # Table 2 across models, per task
    # Bootstrap intervals beside Table 2's values and ranks; pairs compared only on the fitted crossings, with Holm.
    assert re.search(r"\| AHON \(LN\) \| ≥?\d+\.\d \[\d+\.\d, \d+\.\d\] \(\d(\.5)? \[\d", md)
    assert "rank differences significant" not in md
    assert md.count("the grid's cells read as probes of the crossing estimator") == 4
    assert md.count("adjusted by Holm's step-down correction over the 1 pairs") == 4
    assert md.count("| llama vs qwen | 2 | – | – |") == 2  # two shared scores: no rank correlation to speak of
    assert "## Overlap between score functions" in md and "### llama — calibration on recall" in md
    overlaps = md.split("## Overlap between score functions")[1].split("## Threshold")[0]
    assert re.search(r"^\| 0\.\d+ \| \d\.\d\d \[\d\.\d\d, \d\.\d\d\] \(", overlaps, flags=re.M)  # max IoU, interval
    assert "## Threshold stability across tasks" in md and "| threshold on recall | threshold on recall_short |" in md
    assert re.search(r"^\| AHON \(LN\) \| 0\.\d+ \| .* \| \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\] \|$", md, flags=re.M)
    assert "## Calibration protocols" not in md  # every task is calibrated one way only
    assert "### llama vs qwen — recall (0-shot, 6 items; calibrated on the evaluated items)" in md  # the declared pair
    # W1 of the pair with its bootstrap interval over the calibration items, only for the studied scores
    assert "| score | W1 pooled [95% CI] |" in md and "W1 intervals: 95% bootstrap over calibration items" in md
    pair = md.split("### llama vs qwen — recall (")[1].split("![")[0]
    assert re.search(r"^\| ahon_ln \| [\d.e-]+ \[[\d.e-]+, [\d.e-]+\] \|", pair, flags=re.M)
    assert "| lthon_hn |" not in pair
    assert local_run.report is not None and local_run.report.is_file()
    # cells.csv: a row per cell, each score cell with the paired bootstrap interval of its run
    with (local_run.out / "report" / "cells.csv").open(newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == _CELLS
    for run_dir in local_run.runs.values():
        run = load_run(run_dir)
        boot = run_bootstrap(run, 1000, 0)  # the report's resamples and seed
        assert boot is not None
        rows = [r for r in table if r["model"] == run.name and r["task"] == run.run["task"]]
        assert len(rows) == len(run.cells) == 3 and rows[0]["score"] == "baseline" and rows[0]["delta_low"] == ""
        for r in rows[1:]:
            (iv,) = [
                iv
                for (s, f), iv in boot.cells.items()
                if s == r["score"] and f == pytest.approx(float(r["fraction_zeroed"]), rel=1e-5)
            ]
            assert (float(r["delta_low"]), float(r["delta_high"])) == pytest.approx((iv.low, iv.high), abs=1e-5)
        # the report's delta figure draws these intervals: per score panel, the line at each cell's Δ, the band
        fig = delta_figure(run, boot.cells)
        for ax, name in zip(fig.axes, run.curves(), strict=False):
            cells = sorted((c for c in run.cells if c.score == name), key=lambda c: c.fraction_zeroed)
            want = [boot.cells[name, float(c.fraction_zeroed)] for c in cells]
            line = next(ln for ln in ax.get_lines() if ln.get_marker() == "o")
            assert list(line.get_ydata()) == pytest.approx([0.0, *(100 * iv.value for iv in want)])
            band = ax.collections[0].get_paths()[0].vertices[:, 1]
            assert {round(y, 6) for y in band} >= {round(100 * e, 6) for iv in want for e in (iv.low, iv.high)}
    assert len(list((local_run.out / "report").glob("deltas_*.png"))) == 4
    # a run that so far holds only its baseline is reported as such: no Table 2, curves or delta figure
    only_base = tmp_path / "base-only"
    shutil.copytree(next(iter(local_run.runs.values())), only_base)
    # written over a full report of the same run: its figures go, a file it did not write stays
    write_study_report([(only_base, None)], tmp_path / "report")
    assert list((tmp_path / "report").glob("curves_*.png"))
    (tmp_path / "report" / "mine.png").write_bytes(b"not the report's")
    for path in (only_base / "cells").glob("*.json"):
        if json.loads(path.read_text())["score"] is not None:
            path.unlink()
    with pytest.raises(ValueError, match="no cells of a score function"):
        delta_figure(load_run(only_base), {})
    md, _ = write_study_report([(only_base, None)], tmp_path / "report")
    text = md.read_text()
    assert "baseline accuracy" in text and "Only the baseline is stored so far." in text
    assert "max % zeroed within 1 pt | AUC" not in text
    figures = {p.name for p in (tmp_path / "report").glob("*.png")} - {"mine.png"}
    assert (tmp_path / "report" / "mine.png").exists() and figures == set(re.findall(r"\]\((\S+\.png)\)", text))
    assert not any(name.startswith(("curves_", "deltas_", "heads_")) for name in figures)


def test_grid_cells_read_by_the_crossing_estimator_match_a_hand_fit(local_run, tmp_path):
    # One cell per score: the fit is the cell's mean paired difference alone, read from the anchor (0, 0).
    md = write_report(list(local_run.runs.values())[:1], tmp_path)[0].read_text()
    assert "the grid's cells read as probes of the crossing estimator" in md and "Holm's step-down" in md
    for run_dir in local_run.runs.values():
        run = load_run(run_dir)
        base = next(c for c in run.cells if c.score is None)
        ids = base.per_item["ids"]
        found = grid_crossings(run)
        assert set(found) == set(run.score_names)
        for name, result in found.items():
            (cell,) = [c for c in run.cells if c.score == name]
            mean = float(np.mean(cell.correct(ids).astype(int) - base.correct(ids).astype(int)))
            c = result.crossing
            if cell.fraction_zeroed == 0:
                assert c.state == "not_applicable"
            elif mean >= -0.01:
                assert c.state == "censored" and c.value == pytest.approx(cell.fraction_zeroed)
            else:
                assert c.state == "estimated"
                assert c.value == pytest.approx(cell.fraction_zeroed * 0.01 / -mean)
            (probe,) = result.probes
            assert probe.items.size == len(ids) and probe.mean == pytest.approx(mean)


def test_rerun_computes_nothing_and_a_changed_study_adds_only_its_new_cells(local_run, workspace, tmp_path):
    out = tmp_path / "study"
    shutil.copytree(local_run.out, out, copy_function=shutil.copy2)
    before = _snapshot(out)
    again = ih.study(_study_file(workspace), out, progress=False)
    assert again.computed == again.calibrated == 0 and again.reused == _CELLS
    assert _snapshot(out) == before
    wider = ih.study(_study_file(workspace, targets="[0.25, 0.5]"), out, progress=False)
    assert wider.calibrated == 0 and wider.computed == 2 * 2 * 2 and wider.cells == _CELLS + 8
    assert all(before[p] == _snapshot(out)[p] for p in before)
    # Back to the first grid: nothing runs, and the report shows only this grid's cells.
    ih.study(_study_file(workspace), out, progress=False)
    md = (out / "report" / "report.md").read_text()
    assert "| ahon_sq | 0.5 |" not in md and "| ahon_sq | 0.25 |" in md


def test_a_study_kept_without_its_calibration_scores_resumes_from_its_thresholds_record(local_run, workspace, tmp_path):
    """A committed study keeps cells, run and calibration records and the thresholds record, not the (large)
    calibration scores: it plans the same cells, evaluates none again, and records the scores again for the report."""
    out = tmp_path / "study"
    shutil.copytree(local_run.out, out, copy_function=shutil.copy2)
    runs = sorted((out / "runs").iterdir())
    planned = {r.name: [c.key for c in plan_cells(r, scores=["ahon_ln", "ahon_sq"], targets=[0.25])] for r in runs}
    records = {r.name: (r / "calibration" / "thresholds.json").read_bytes() for r in runs}
    metas = {r.name: (r / "calibration" / "meta.json").read_bytes() for r in runs}
    for r in runs:
        (r / "calibration" / "scores.safetensors").unlink()
    before = _snapshot(out)
    for r in runs:  # planned from the record alone: the same keys
        assert [c.key for c in plan_cells(r, scores=["ahon_ln", "ahon_sq"], targets=[0.25])] == planned[r.name]
    with pytest.raises(FileNotFoundError, match=r"scores are not stored .* calibrate again"):
        plan_cells(runs[0], scores=["ahon_ln"], targets=[0.5])
    assert all(r.calibrated and r.left == 0 for r in ih.study_status(_study_file(workspace), out))
    report = (out / "report" / "report.md").stat().st_mtime_ns
    assert main(["study", str(_study_file(workspace)), "--out", str(out), "--no-report"]) in (0, None)
    assert not list((out / "runs").glob("*/calibration/scores.safetensors"))  # no model was needed
    assert (out / "report" / "report.md").stat().st_mtime_ns == report
    ih.study(_study_file(workspace), out, models=(), progress=False)  # --report-only: says what it leaves out
    md = (out / "report" / "report.md").read_text()
    assert "No calibration scores are stored for llama (recall (0-shot, 6 items; calibrated on the evaluated" in md
    assert "## Overlap between score functions" not in md and "## Model pairs" not in md
    again = ih.study(_study_file(workspace), out, progress=False)
    assert again.computed == again.calibrated == 0 and again.reused == _CELLS and _snapshot(out) == before
    for r in runs:  # recorded again for the report, beside the records as they were
        assert (r / "calibration" / "scores.safetensors").is_file()
        assert (r / "calibration" / "thresholds.json").read_bytes() == records[r.name]
        assert (r / "calibration" / "meta.json").read_bytes() == metas[r.name]
    md = (out / "report" / "report.md").read_text()
    assert "## Overlap between score functions" in md and "No calibration scores are stored" not in md
    for r in runs:
        (r / "calibration" / "scores.safetensors").unlink()
    wider = ih.study(_study_file(workspace, targets="[0.25, 0.5]"), out, progress=False, report=False)
    assert wider.calibrated == 4 and wider.computed == 2 * 2 * 2  # scores recorded again for the new target only
    assert all(before[p] == _snapshot(out)[p] for p in before)


def test_compact_scores_are_float16_copies_that_reports_read_alone(local_run, workspace, tmp_path):
    """``compact_scores = true`` keeps each run's scores of the study's functions as float16. Reports read the copy
    wherever it is, so removing the full scores changes no report byte and needs no calibration pass."""
    from safetensors.torch import load

    out = tmp_path / "study"
    shutil.copytree(local_run.out, out, copy_function=shutil.copy2)
    study_file = _study_file(workspace, "tiny", extra="compact_scores = true")
    first = ih.study(study_file, out, progress=False)
    assert first.computed == first.calibrated == 0
    runs = sorted((out / "runs").iterdir())
    for r in runs:
        rd = RunDir(r)
        full = rd.read_scores()
        assert full is not None
        stored = load(lzma.decompress(rd.compact_scores_path.read_bytes()))  # the file is compressed safetensors
        assert sorted(stored) == ["ahon_ln", "ahon_sq"]
        assert {t.dtype for t in stored.values()} == {torch.float16}
        kept = load_run(r).scores
        assert kept is not None and kept.meta == full.meta
        derived = full.derive(["ahon_sq"])
        for name in ("ahon_ln", "ahon_sq"):
            assert kept[name].dtype == torch.float32
            assert torch.equal(kept[name], derived[name].half().float())
    report = {p.name: p.read_bytes() for p in (out / "report").glob("*.md")}
    assert "## Overlap between score functions" in report["report.md"].decode()
    for r in runs:
        RunDir(r).scores_path.unlink()
    again = ih.study(study_file, out, progress=False)
    assert again.computed == again.calibrated == 0
    assert not list((out / "runs").glob("*/calibration/scores.safetensors"))  # no calibration pass ran
    assert {p.name: p.read_bytes() for p in (out / "report").glob("*.md")} == report


def test_one_calibration_recorded_twice_keeps_one_compact_copy(workspace, tmp_path):
    """Runs of two tasks calibrated on the same third task hold the same scores: the study keeps one compact copy
    and a checked reference to it, and every report reads the same numbers as from two copies."""
    path = _study_file(workspace, "twins", extra="compact_scores = true")
    text = path.read_text().replace(
        'name = "recall_short"\nlimit = 6', 'name = "recall_short"\nlimit = 6\ncalibration_task = "recall"'
    )
    path.write_text(
        text.replace('name = "recall"\nlimit = 6', 'name = "recall"\nlimit = 6\ncalibration_task = "recall"', 1)
    )
    out = tmp_path / "study"
    ih.study(path, out, models=["llama"], progress=False, report=False)
    runs = [RunDir(r) for r in sorted((out / "runs").iterdir())]
    assert len(runs) == 2 and all(r.read_meta() is not None for r in runs)
    owner, twin = sorted(runs, key=lambda r: not r.compact_scores_path.is_file())
    assert owner.compact_scores_path.is_file() and not twin.compact_scores_path.is_file()
    reference = json.loads(twin.compact_reference_path.read_text())
    assert (twin.compact_reference_path.parent / reference["same_as"]).resolve() == owner.compact_scores_path.resolve()
    full = twin.read_scores()
    shared = load_run(twin.root).scores
    assert full is not None and shared is not None
    assert all(torch.equal(shared[n], full.derive([n])[n].half().float()) for n in ("ahon_ln", "ahon_sq"))
    ih.study(path, out, models=(), progress=False)  # the report, from the copy and the reference
    report = (out / "report" / "report.md").read_bytes()
    for r in runs:
        r.scores_path.unlink()
    again = ih.study(path, out, models=["llama"], progress=False)
    assert again.calibrated == again.computed == 0 and (out / "report" / "report.md").read_bytes() == report
    scores = ih.HeadScores.load(owner.compact_scores_path)
    ih.HeadScores({n: scores[n] + 1 for n in scores.names}, scores.meta).save(
        owner.compact_scores_path, dtype=torch.float16
    )
    with pytest.raises(ih.InactiveHeadsError, match="are missing or have changed; run the study again"):
        load_run(twin.root)


def test_threshold_stability_gives_the_thresholds_the_cells_used(local_run):
    """Taken from the calibration scores, the thresholds side by side are exactly those the sweep's cells used."""
    runs = [load_run(d) for d in sorted((local_run.out / "runs").iterdir())]
    checked = 0
    for model in {r.name for r in runs}:
        group = [r for r in runs if r.name == model]
        assert all(r.scores is not None for r in group)
        header, rows = threshold_table(group, n_resamples=0)
        by = {(row[0], row[1]): row for row in rows}
        for r in group:
            column = header.index(f"threshold on {r.calibration_meta['task']}")
            for c in r.cells:
                if c.score is not None and c.threshold is not None:
                    assert by[(score_label(c.score), f"{c.target:g}")][column] == f"{c.threshold:.4g}"
                    checked += 1
    assert checked == _CELLS - 4  # every cell but the 4 baselines


def test_threshold_spread_intervals_do_not_depend_on_the_order_of_the_runs(local_run):
    # A reading's quote and the report list one model's calibrations in different orders: same table either way.
    runs = [load_run(d) for d in sorted((local_run.out / "runs").iterdir())]
    group = [r for r in runs if r.name == runs[0].name]
    assert len(group) == 2
    assert threshold_table(group, n_resamples=200) == threshold_table(group[::-1], n_resamples=200)


def test_a_compact_copy_refuses_scores_beyond_float16(tmp_path):
    rd = RunDir(tmp_path / "run")
    scores = ih.HeadScores({"ahon": torch.tensor([[[1.0, 7e4]]]), "random": torch.tensor([[[0.5, 0.5]]])})
    rd.scores_path.parent.mkdir(parents=True)
    scores.save(rd.scores_path)
    rd.write_meta({"run": "x"})
    assert rd.write_compact_scores(["random"])
    with pytest.raises(ih.InactiveHeadsError, match="exceeds float16's range; keep the full scores"):
        rd.write_compact_scores(["ahon"])
    with pytest.raises(ih.InactiveHeadsError, match="float32 or float16"):
        scores.save(tmp_path / "x.safetensors", dtype=torch.bfloat16)
    assert rd.compact_scores_path.read_bytes().startswith(b"\xfd7zXZ")  # lzma's xz container
    rd.scores_path.unlink()
    assert not rd.write_compact_scores(["random"])  # nothing to copy from


def test_processes_sharing_a_study_take_other_cells_instead_of_waiting(local_run, workspace, tmp_path):
    """A cell another process holds is left for last: this one evaluates every other cell meanwhile, then waits for
    it (and evaluates it itself when that process ends without storing it)."""
    out = tmp_path / "study"
    shutil.copytree(local_run.out, out, copy_function=shutil.copy2)
    run = next((out / "runs").glob("llama--recall-*"))
    keys = [c.key for c in plan_cells(run, scores=["ahon_ln", "ahon_sq"], targets=[0.25])]  # in the study's order
    for key in keys:
        (run / "cells" / f"{key}.json").unlink()

    def stored(key: str) -> bool:
        return (run / "cells" / f"{key}.json").is_file()

    done: dict[str, ih.StudyResult] = {}
    with RunDir(run).cell_store().claim(keys[0], wait=False) as mine:  # as another process would hold it
        assert mine
        worker = threading.Thread(target=lambda: done.update(r=ih.study(_study_file(workspace), out, progress=False)))
        worker.start()
        deadline = time.monotonic() + 120
        while not all(stored(k) for k in keys[1:]):
            assert worker.is_alive() and time.monotonic() < deadline, "the study waited on the held cell"
            time.sleep(0.1)
        assert not stored(keys[0]) and worker.is_alive()
    worker.join(timeout=120)
    assert done["r"].computed == len(keys) and all(stored(k) for k in keys)


def test_held_work_is_waited_for_only_after_every_other_model_s(local_run, workspace, tmp_path):
    """A calibration or cell another process holds is left until this process has run every other job, of every
    model (a worker waiting at the end of one model's jobs would idle while the next model's are free); then it
    waits for it, and calibrates or evaluates it itself when that process ends without doing so."""
    out = tmp_path / "study"
    shutil.copytree(local_run.out, out, copy_function=shutil.copy2)
    llama = next((out / "runs").glob("llama--recall-*"))  # of the first model: its calibration held
    shutil.rmtree(llama / "calibration")
    for path in (llama / "cells").glob("*.json"):
        path.unlink()
    llama_short = next((out / "runs").glob("llama--recall_short-*"))  # one cell of it held
    qwen = next((out / "runs").glob("qwen--recall-*"))  # of the next model: free
    held = sorted((llama_short / "cells").glob("*.json"))[-1]
    free = sorted((qwen / "cells").glob("*.json"))[-1]
    held.unlink()
    free.unlink()

    done: dict[str, ih.StudyResult] = {}
    with (
        RunDir(llama).cell_store().claim("calibration", wait=False) as calibrating,
        RunDir(llama_short).cell_store().claim(held.stem, wait=False) as evaluating,
    ):
        assert calibrating and evaluating
        worker = threading.Thread(target=lambda: done.update(r=ih.study(_study_file(workspace), out, progress=False)))
        worker.start()
        deadline = time.monotonic() + 120
        while not free.is_file():
            assert worker.is_alive() and time.monotonic() < deadline, "the study waited on held work"
            time.sleep(0.1)
        assert worker.is_alive() and not held.is_file() and RunDir(llama).read_meta() is None
    worker.join(timeout=120)
    assert not worker.is_alive() and done["r"].calibrated == 1 and done["r"].computed == 3 + 1 + 1
    assert held.is_file() and len(list((llama / "cells").glob("*.json"))) == 3


def test_status_counts_stored_and_missing_cells_without_running_anything(local_run, workspace, tmp_path, capsys):
    file = _study_file(workspace)
    fresh = ih.study_status(file, tmp_path / "nothing")
    assert [(r.model, r.task, r.calibrated, r.planned, r.stored) for r in fresh] == [
        (m, t, False, 3, 0) for m in ("llama", "qwen") for t in ("recall", "recall_short")
    ]
    assert not (tmp_path / "nothing").exists()
    out = tmp_path / "study"
    shutil.copytree(local_run.out, out, copy_function=shutil.copy2)
    cells = sorted((out / "runs").glob("llama--recall-*/cells/*.json"))
    assert len(cells) == 3
    cells[0].unlink()
    before = _snapshot(out)
    status = {(r.model, r.task): r for r in ih.study_status(file, out)}
    assert _snapshot(out) == before  # read only
    assert status["llama", "recall"].stored == 2 and status["llama", "recall"].left == 1
    assert all(r.calibrated and r.planned == 3 and r.left == 0 for k, r in status.items() if k != ("llama", "recall"))
    stored = [json.loads(p.read_text())["seconds"] for p in cells[1:]]
    assert sorted(status["llama", "recall"].cell_seconds) == pytest.approx(sorted(stored))
    capsys.readouterr()
    assert main(["study", str(file), "--out", str(out), "--status"]) in (0, None)
    printed = capsys.readouterr().out
    assert "11 of 12 cells stored" in printed and re.search(r"^llama +recall +same items +2/3 ", printed, re.M)


def test_a_study_of_some_models_reports_every_calibrated_run(local_run, workspace, tmp_path):
    """``models=`` runs only those models; the report still shows every run calibrated before."""
    out = tmp_path / "study"
    shutil.copytree(local_run.out, out, copy_function=shutil.copy2)
    for run in (out / "runs").glob("qwen--*"):
        shutil.rmtree(run)
    nothing = ih.study(_study_file(workspace), out, models=(), progress=False)  # --report-only
    assert nothing.computed == nothing.calibrated == 0 and nothing.report is not None
    first = ih.study(_study_file(workspace, targets="[0.25, 0.5]"), out, models=["llama"], progress=False)
    assert first.calibrated == 0 and first.computed == 2 * 2  # llama's new target only; qwen is not run
    assert not list((out / "runs").glob("qwen--*"))
    md = (out / "report" / "report.md").read_text()
    assert "### llama — recall" in md and "### qwen — recall" not in md
    again = ih.study(_study_file(workspace, targets="[0.25, 0.5]"), out, models=["qwen"], progress=False)
    assert again.calibrated == 2 and again.computed == 2 * 5
    md = (out / "report" / "report.md").read_text()
    assert "### llama — recall" in md and "### qwen — recall" in md
    with pytest.raises(ValueError, match="'nope' is not a model of study tiny; its models: llama, qwen"):
        ih.study(_study_file(workspace), out, models=["nope"], progress=False)


def test_a_task_calibrated_two_ways_has_a_run_each(local_run, workspace, tmp_path):
    """Runs of one (model, task) that calibrate differently keep their own directories, and the result lists both."""
    out = tmp_path / "study"
    shutil.copytree(local_run.out, out, copy_function=shutil.copy2)
    path = _study_file(workspace, "tiny")
    path.write_text(path.read_text() + '\n[[tasks]]\nname = "recall"\nlimit = 6\ncalibration_task = "recall_short"\n')
    result = ih.study(path, out, models=["llama"], progress=False)
    assert result.calibrated == 1 and result.computed == 3  # the transferred calibration and its cells only
    llama_recall = sorted(name for name in result.runs if name.startswith("llama--recall-"))
    assert len(result.runs) == 6 and len(llama_recall) == 2
    assert {result.runs[n].name for n in llama_recall} == set(llama_recall)


def test_the_report_names_runs_still_being_computed(local_run, workspace, tmp_path):
    out = tmp_path / "study"
    shutil.copytree(local_run.out, out, copy_function=shutil.copy2)
    run = next((out / "runs").glob("llama--recall-*"))
    cells = sorted((run / "cells").glob("*.json"))
    score_cell = next(p for p in cells if json.loads(p.read_text())["score"] is not None)
    score_cell.unlink()
    ih.study(_study_file(workspace), out, models=(), progress=False)  # --report-only
    md = (out / "report" / "report.md").read_text()
    assert (
        "Runs still being computed: llama (recall (0-shot, 6 items; calibrated on the evaluated items): 2 of 3 cells)"
        in md
    )
    assert md.count("planned cells stored so far") == 1 and "2 of 3 planned cells stored so far" in md


def test_report_only_skips_malformed_and_truncated_cells_naming_each(local_run, workspace, tmp_path):
    out = tmp_path / "study"
    shutil.copytree(local_run.out, out, copy_function=shutil.copy2)
    run = next((out / "runs").glob("llama--recall-*"))
    cells = sorted((run / "cells").glob("*.json"))
    high, torn = (p for p in cells if json.loads(p.read_text())["score"] is not None)
    high.write_text(json.dumps({**json.loads(high.read_text()), "accuracy": "high"}))
    torn.write_text(torn.read_text()[:50])
    with pytest.warns(UserWarning) as record:
        assert main(["study", str(_study_file(workspace)), "--out", str(out), "--report-only"]) in (0, None)
    warned = [str(w.message) for w in record]
    assert sum(high.name in m and "wrong type ['accuracy']" in m for m in warned) == 1
    assert sum(torn.name in m and "unreadable" in m for m in warned) == 1
    md = (out / "report" / "report.md").read_text()
    assert "llama (recall (0-shot, 6 items; calibrated on the evaluated items): 1 of 3 cells)" in md


def test_an_executor_is_one_registered_class(local_run, workspace, tmp_path, registrations):
    @ih.register_executor
    class ModelsInReverse(LocalExecutor):
        name = "reverse-test"

        def run(self, groups, on_result):
            super().run(list(reversed(groups)), on_result)

    assert ih.EXECUTORS["reverse-test"] is ModelsInReverse
    with pytest.raises(ValueError, match="already registered"):
        ih.register_executor(ModelsInReverse)
    result = ih.study(_study_file(workspace), tmp_path, executor="reverse-test", progress=False)
    assert _cells(result.out) == _cells(local_run.out)
    with pytest.raises(ValueError, match="unknown executor 'nope'"):
        ih.study(_study_file(workspace), tmp_path, executor="nope", progress=False)
    with pytest.raises(ValueError, match="takes no address"):
        ih.study(_study_file(workspace), tmp_path, address="auto", progress=False)


@pytest.mark.ray
def test_ray_gives_the_same_cells_as_local(local_run, workspace, tmp_path, ray_instance):
    result = ih.study(_study_file(workspace), tmp_path, executor=RayExecutor(), progress=False)
    assert result.computed == result.cells == _CELLS and result.calibrated == 4
    assert _cells(result.out) == _cells(local_run.out)
    assert (result.out / "report" / "report.html").is_file()


@pytest.mark.ray
def test_ray_refuses_a_worker_no_node_can_hold(workspace, tmp_path, ray_instance):
    study = _study_file(workspace, "gpu", extra="")
    study.write_text(study.read_text().replace("cpus = 1", "cpus = 1\ngpus = 1"))
    with pytest.raises(
        ValueError, match=r"asks for CPU 1, GPU 1, but the largest node of the Ray cluster has CPU 2, GPU 0"
    ):
        ih.study(study, tmp_path, executor=RayExecutor(), progress=False)
    assert not list(tmp_path.glob("runs/*/cells/*.json"))


def _start(study: Path, out: Path, executor: str, mark: str) -> subprocess.Popen:
    env = {**os.environ, "IH_TEST_MARK": mark, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "inactive_heads", "study", str(study), "--out", str(out), "--executor", executor]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_cells(out: Path, n: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while len(list(out.glob("runs/*/cells/*.json"))) < n:
        assert proc.poll() is None, f"the study ended before {n} cells were stored:\n{proc.communicate()[0]}"
        assert time.monotonic() < deadline, f"fewer than {n} cells after {timeout} s"
        time.sleep(0.2)


def _processes(mark: str, name: str) -> list[int]:
    """Pids of processes started for this test (they carry its mark in their environment) named ``name``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if f"IH_TEST_MARK={mark}".encode() in env and name.encode() in cmd:
                found.append(int(entry.name))
    return found


def _describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        with contextlib.suppress(OSError):
            out.append(f"{pid}: {Path(f'/proc/{pid}/cmdline').read_bytes().replace(NUL, b' ')[:160].decode()}")
    return out


NUL = b"\0"


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds Ray's worker processes through /proc")
def test_killed_ray_worker_loses_only_its_cell_in_flight(local_run, workspace, tmp_path):
    pytest.importorskip("ray", reason="the ray executor needs Ray: .ci/setup installs the ray extra")
    mark = uuid.uuid4().hex
    proc = _start(_study_file(workspace, limit=24), tmp_path, "ray", mark)
    try:
        _wait_for_cells(tmp_path, 2, proc)
        deadline = time.monotonic() + 60
        while not (workers := _processes(mark, "ray::_ModelWorker")):
            assert time.monotonic() < deadline, "no Ray worker process found"
            time.sleep(0.2)
        os.kill(workers[0], signal.SIGKILL)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The killed worker was restarted and its job retried: the study finished, every cell once, none torn. Killed
    # while writing, it leaves at most a temp file that the store ignores; removed here, as no writer runs now.
    assert proc.returncode == 0, output
    assert sum(RunDir(r).cell_store().remove_stale_tmp() for r in (tmp_path / "runs").iterdir()) <= 1
    stored = _cells(tmp_path)
    assert len(stored) == _CELLS
    again = ih.study(_study_file(workspace, limit=24), tmp_path, progress=False)
    assert again.computed == again.calibrated == 0 and again.reused == _CELLS


@pytest.mark.slow
@pytest.mark.ray
def test_killed_driver_resumes_without_recomputing_a_finished_cell(workspace, tmp_path):
    pytest.importorskip("ray", reason="the ray executor needs Ray: .ci/setup installs the ray extra")
    mark = uuid.uuid4().hex
    study = _study_file(workspace, limit=24)
    proc = _start(study, tmp_path, "ray", mark)
    try:
        _wait_for_cells(tmp_path, 3, proc)
        proc.send_signal(signal.SIGKILL)  # no cleanup code runs; Ray's processes go with their driver
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 120
    while left := _processes(mark, "ray"):
        assert time.monotonic() < deadline, f"Ray processes outlived their killed driver: {_describe(left)}"
        time.sleep(0.5)
    before = _snapshot(tmp_path)
    assert 3 <= len(before) < _CELLS
    # A worker killed inside an atomic write leaves its temp file, never a torn cell; the resume leaves none of its own.
    torn = set((tmp_path / "runs").glob("*/cells/.*.tmp"))
    result = ih.study(study, tmp_path, progress=False)
    assert result.reused == len(before) and result.computed == _CELLS - len(before)
    after = _snapshot(tmp_path)
    assert all(after[p] == before[p] for p in before)  # finished cells untouched: not recomputed, not rewritten
    assert set((tmp_path / "runs").glob("*/cells/.*.tmp")) == torn
    for path in torn:
        path.unlink()
    assert len(_cells(tmp_path)) == _CELLS


@pytest.mark.slow
@pytest.mark.ray
def test_offline_example_runs_on_both_executors_with_the_same_cells(tmp_path, capsys, smollm2_gguf):
    pytest.importorskip("ray", reason="the ray executor needs Ray: .ci/setup installs the ray extra")
    example = Path(__file__).resolve().parents[1] / "examples" / "offline.toml"
    local, ray = tmp_path / "local", tmp_path / "ray"
    # Bit-identical cells need the same threads per worker: a Ray worker of 1 CPU runs 1 thread, and on CPUs with
    # AVX-512 a real model's float32 sums change with the thread count.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["study", str(example), "--out", str(local), "--limit", "4"]) == 0
    finally:
        torch.set_num_threads(threads)
    assert main(["study", str(example), "--out", str(ray), "--limit", "4", "--executor", "ray"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("50 cells of 2 runs (50 evaluated now, 0 already stored; 2 calibrations)") == 2
    assert _cells(local) == _cells(ray) and len(_cells(local)) == 50
    for out in (local, ray):
        md = (out / "report" / "report.md").read_text()
        assert "## recall (0-shot, 4 items; calibrated on the evaluated items)" in md
        assert "## mmlu (0-shot, 4 items; calibrated on the evaluated items)" in md
