"""The committed real-model study (docs/study): its run directories resume without recomputing a stored cell, and
its report shows the numbers those directories hold."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import inactive_heads as ih
from inactive_heads.report.writer import _cells_csv
from inactive_heads.runs.directory import load_run

STUDY = Path(__file__).resolve().parents[1] / "docs" / "study"


def _cells(text: str) -> dict[tuple[str, ...], dict[str, str]]:
    """Rows of a report's ``cells.csv`` by (model, task, calibration, score, target)."""
    rows = csv.DictReader(io.StringIO(text))
    return {(r["model"], r["task"], r["calibration"], r["score"], r["target"]): r for r in rows}


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
    # The report is written from runs/: each of its rows is a stored cell, as the report's writer renders it from
    # the run directories (the bootstrap interval columns aside: they are not recomputed here).
    committed = _cells((STUDY / "report" / "cells.csv").read_text())
    runs = [load_run(d) for d in sorted((STUDY / "runs").iterdir())]
    stored = _cells(_cells_csv(runs, [None] * len(runs)))
    missing = sorted(committed.keys() - stored.keys())
    assert not missing, f"{len(missing)} report rows have no stored cell, e.g. {missing[0]}"
    for key, row in committed.items():
        differ = {k for k, v in row.items() if k not in ("delta_low", "delta_high") and stored[key][k] != v}
        assert not differ, (key, differ)
    assert committed
