"""The committed real-model study (docs/study): its run directories resume without recomputing a stored cell, and
its report shows the numbers those directories hold."""

from __future__ import annotations

import csv
from pathlib import Path

import inactive_heads as ih
from inactive_heads.rundir import load_run
from inactive_heads.runstats import calibration_label

STUDY = Path(__file__).resolve().parents[1] / "docs" / "study"


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def test_every_stored_cell_is_a_planned_cell():
    # The runs are committed without their calibration scores: the thresholds record alone must plan the very
    # cells stored, or a clone would compute them again under other keys.
    spec = ih.load_study(STUDY / "study.toml")
    status = ih.study_status(spec, out=STUDY)
    stored = 0
    for (model, task), s in zip(spec.runs(), status, strict=True):
        files = list((STUDY / "runs" / spec.run_name(model, task) / "cells").glob("*.json"))
        assert s.stored == len(files), f"{s.model} {s.task} ({s.calibration}): cells stored that the plan lacks"
        stored += s.stored
    assert stored > 0


def test_the_report_shows_the_stored_cells():
    with open(STUDY / "report" / "cells.csv", newline="") as f:
        rows = {(r["model"], r["task"], r["calibration"], r["score"], r["target"]): r for r in csv.DictReader(f)}
    shared = 0
    for run_dir in sorted((STUDY / "runs").iterdir()):
        run = load_run(run_dir)
        for cell in run.cells:
            key = (run.name, run.run["task"], calibration_label(run), cell["score"] or "baseline", _num(cell["target"]))
            row = rows.get(key)
            if row is None:
                continue
            shared += 1
            assert row["accuracy"] == _num(cell["accuracy"]), key
            # A cell computed again on a CPU whose float sums differ in the last bits may flip a head that sits at
            # its threshold on some input, which moves the fraction by a few (input, head) pairs.
            assert abs(float(row["fraction_zeroed"]) - cell["fraction_zeroed"]) < 1e-4, key
    assert shared > 0
