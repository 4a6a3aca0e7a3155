"""The committed real-model study (docs/study): its run directories resume without recomputing a stored result, its
report shows the numbers those directories hold, and its reading quotes only numbers they reproduce."""

from __future__ import annotations

import csv
import io
from collections import Counter
from pathlib import Path

import inactive_heads as ih
from inactive_heads.report.crossings import crossings_csv
from inactive_heads.report.quotes import check_quotes, unquoted_intervals
from inactive_heads.report.writer import _cells_csv
from inactive_heads.runs.directory import load_run

STUDY = Path(__file__).resolve().parents[1] / "docs" / "study"


def _rows(text: str) -> Counter[tuple[str, ...]]:
    """A report's ``cells.csv`` rows, the cells' bootstrap interval columns blanked (not recomputed here)."""
    rows = list(csv.DictReader(io.StringIO(text)))
    for r in rows:
        if r.get("row", "cell") == "cell":
            r["delta_low"] = r["delta_high"] = ""
    return Counter(tuple(r.values()) for r in rows)


def test_every_stored_result_is_a_planned_one():
    # The runs are committed without their full calibration scores: the thresholds record alone must plan the very
    # cells and searches stored, or a clone would compute them again under other keys.
    spec = ih.load_study(STUDY / "study.toml")
    status = ih.study_status(spec, out=STUDY)
    cells: Counter[str] = Counter()
    searches: Counter[str] = Counter()
    for (model, task), s in zip(spec.runs(), status, strict=True):
        name = spec.run_name(model, task)
        cells[name] = max(cells[name], s.stored)  # tasks sharing a directory share its baseline cell
        searches[name] += len(s.search_seconds)
    for name in cells:
        run = STUDY / "runs" / name
        assert len(list((run / "cells").glob("*.json"))) == cells[name], f"{name}: cells stored that the plan lacks"
        stored = len(list((run / "searches").glob("*.json"))) if (run / "searches").is_dir() else 0
        assert stored == searches[name], f"{name}: searches stored that the plan lacks"
    assert sum(searches.values()) > 0


def test_the_report_shows_the_stored_results():
    # The report is written from runs/: each of its rows is a stored cell, search or probe, as the report's writer
    # renders it from the run directories.
    committed = _rows((STUDY / "report" / "cells.csv").read_text())
    runs = [load_run(d) for d in sorted((STUDY / "runs").iterdir())]
    stored = _rows(crossings_csv(_cells_csv(runs, [None] * len(runs)), runs))
    assert committed == stored, (committed - stored, stored - committed)


def test_the_reading_quotes_only_what_the_runs_reproduce():
    reading = STUDY / "README.md"
    quotes = check_quotes(reading, STUDY / "runs")
    wrong = [f"line {q.line}: {q.query}: {q.found!r} where the runs give {q.expected!r}" for q in quotes if not q.ok]
    assert not wrong, "\n".join(wrong)
    assert not unquoted_intervals(reading, quotes)
    assert len(quotes) >= 10
