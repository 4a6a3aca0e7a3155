"""Run-level statistics from stored cells: bootstrap inputs, thresholds side by side, calibrations compared."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from _runs import make_cell, make_run

from inactive_heads.report.tables import calibration_label, protocol_table, run_bootstrap, threshold_table
from inactive_heads.runs.directory import Cell, RunData, load_run
from inactive_heads.stats.bootstrap import bootstrap_run

IDS = [f"q{i}" for i in range(30)]


def _cells(thresholds=(0.5, 0.7), seed=0) -> list[Cell]:
    """The baseline, then AHON (LN) and AWFT at targets 0.1 and 0.2, each with its answers to the 30 items."""
    rng = np.random.default_rng(seed)
    base = rng.random(30) < 0.7
    cells = [make_cell(correct=base)]
    for k, (target, t) in enumerate(zip((0.1, 0.2), thresholds, strict=True)):
        flipped = base ^ (rng.random(30) < 0.1 * k)
        cells.append(make_cell("ahon_ln", target, fraction_zeroed=target + 0.01, correct=flipped, threshold=t))
        flipped = base ^ (rng.random(30) < 0.2 * (k + 1))
        cells.append(make_cell("awft", target, fraction_zeroed=target, correct=flipped, threshold=2 * t))
    return cells


def _run(root, task="piqa", cal_task="piqa", items="heldout", thresholds=(0.5, 0.7), seed=0, *, cells=None, **kw):
    """A stored run of :func:`_cells` (or ``cells``) on ``task``, calibrated on ``cal_task``; ``kw``: calibration
    scores (``scores``) and more of the calibration's meta record."""
    cells = _cells(thresholds, seed) if cells is None else cells
    scores = kw.pop("scores", None)
    meta = {"task": cal_task, "items": items, **kw}
    return load_run(make_run(Path(tempfile.mkdtemp(dir=root)), cells, task=task, scores=scores, meta=meta))


def test_run_bootstrap_feeds_per_item_correctness_in_curve_order(tmp_path):
    run = _run(tmp_path)
    boot = run_bootstrap(run, n_resamples=200, seed=3)
    base = np.asarray(next(c for c in run.cells if c.score is None).per_item["pred"]) == 0
    curves = {
        name: [(c.fraction_zeroed, np.asarray(c.per_item["pred"]) == 0) for c in curve.extra["cells"]]
        for name, curve in run.curves().items()
    }
    expected = bootstrap_run(base, curves, n_resamples=200, seed=3)
    assert boot is not None and boot.cells == expected.cells and boot.rank == expected.rank
    assert boot.max_zeroed["ahon_ln"].value == pytest.approx({r.score: r.max_zeroed for r in run.table2()}["ahon_ln"])


def test_run_bootstrap_is_none_without_per_item_answers_or_with_other_items(tmp_path):
    cells = _cells()
    cells[2] = replace(cells[2], per_item=None)
    assert run_bootstrap(_run(tmp_path, cells=cells)) is None
    cells = _cells()
    cells[1] = replace(cells[1], per_item={**cells[1].per_item, "ids": list(reversed(IDS))})
    assert run_bootstrap(_run(tmp_path, cells=cells)) is None


def test_threshold_table_puts_each_tasks_threshold_side_by_side(tmp_path):
    piqa, arc = _run(tmp_path, "piqa", "piqa"), _run(tmp_path, "arc_easy", "arc_easy", thresholds=(0.6, 0.7))
    header, rows = threshold_table([piqa, arc])
    assert header[2:4] == ["threshold on arc_easy", "threshold on piqa"]  # tasks by name, whatever the runs' order
    by = {(r[0], r[1]): r for r in rows}
    assert by[("AHON (LN)", "0.1")][2:] == ["0.6", "0.5", f"{0.1 / 0.55:.3f}"]
    assert by[("AHON (LN)", "0.2")][4] == "0.000"
    assert threshold_table([_run(tmp_path)]) is None


def test_threshold_spread_interval_is_a_bootstrap_of_each_tasks_calibration_items(tmp_path):
    """With calibration scores and their rows' items, the spread gets an interval: each task's items resampled on
    their own, thresholds of the repeated rows, spread per resample, percentiles."""
    from inactive_heads.scores import HeadScores
    from inactive_heads.stats.bootstrap import independent_counts
    from inactive_heads.stats.thresholds import thresholds_from_cdf

    rng = np.random.default_rng(4)
    runs, values, items = [], {}, {}
    for task, n_items, rows_per in (("piqa", 8, 2), ("arc_easy", 6, 3)):
        x = rng.gamma(2.0, size=(n_items * rows_per, 2, 3)).astype(np.float32)
        values[task], items[task] = x, np.repeat(np.arange(n_items), rows_per)
        cells = [  # the sweep's thresholds for these scores
            replace(c, threshold=thresholds_from_cdf(x, "below", [c.target])[0]) if c.score == "ahon_ln" else c
            for c in _cells()
        ]
        ahon = HeadScores({"ahon_ln": torch.from_numpy(x)})
        runs.append(_run(tmp_path, task, task, cells=cells, scores=ahon, row_items=items[task].tolist()))
    header, rows = threshold_table(runs, n_resamples=50, seed=9)
    assert header[-1] == "spread (max − min) / |median| [95% CI]"
    row = next(r for r in rows if r[:2] == ["AHON (LN)", "0.1"])
    counts = dict(zip(["arc_easy", "piqa"], independent_counts([6, 8], 50, 9), strict=True))  # tasks by name
    spreads = []
    for k in range(50):
        ts = []
        for task, x in values.items():
            keep = np.repeat(np.arange(counts[task].shape[1]), counts[task][k])
            ts.append(thresholds_from_cdf(np.concatenate([x[items[task] == i] for i in keep]), "below", [0.1])[0])
        spreads.append((max(ts) - min(ts)) / abs(np.median(ts)))
    point = (max(float(row[2]), float(row[3])) - min(float(row[2]), float(row[3]))) / np.median(
        [float(row[2]), float(row[3])]
    )
    lo, hi = np.percentile(spreads, [2.5, 97.5])
    assert row[4] == f"{point:.3f} [{lo:.3f}, {hi:.3f}]"
    # AWFT has no calibration scores here: its spread stays a point value
    assert " [" not in next(r for r in rows if r[0] == "AWFT")[4]


def test_scores_flat_within_layers_names_scores_that_cannot_rank_a_layers_heads(tmp_path):
    from inactive_heads.report.tables import scores_flat_within_layers
    from inactive_heads.scores import HeadScores

    per_layer = torch.rand(6, 3, 1).expand(6, 3, 4)  # one value per (row, layer): 4 heads sharing one KV head
    varied = torch.rand(6, 3, 4)
    run = _run(tmp_path)
    run = RunData(run.dir, run.run, run.cells, HeadScores({"ahon_ln": per_layer, "awft": varied}))
    assert scores_flat_within_layers(run) == ["ahon_ln"]
    almost = per_layer.clone()
    almost[5, 2, 3] += 1e-3
    run = RunData(run.dir, run.run, run.cells, HeadScores({"ahon_ln": almost, "awft": varied}))
    assert scores_flat_within_layers(run) == []


def test_protocol_table_lines_up_cells_of_one_task_under_each_calibration(tmp_path):
    same, held = _run(tmp_path, items="same"), _run(tmp_path, seed=1)
    moved = _run(tmp_path, cal_task="arc_easy", items="same", seed=2)
    assert [calibration_label(r) for r in (same, held, moved)] == [
        "calibrated on the evaluated items",
        "held-out calibration",
        "calibrated on arc_easy",
    ]
    header, rows = protocol_table([(same, None), (held, run_bootstrap(held)), (moved, None)], n_resamples=300)
    labels = [calibration_label(r) for r in (same, held, moved)]
    assert header == ["score", "target", *labels, "on the evaluated items − held-out", "on arc_easy − held-out"]
    assert [r[:2] for r in rows] == [["AWFT", "0.1"], ["AWFT", "0.2"], ["AHON (LN)", "0.1"], ["AHON (LN)", "0.2"]]
    cell = next(c for c in same.cells if c.score == "ahon_ln" and c.target == 0.1)
    row = next(r for r in rows if r[:2] == ["AHON (LN)", "0.1"])
    assert row[2] == f"{100 * (cell.accuracy - same.baseline):+.1f} at 11.0%"
    assert row[3].count("[") == 1 and row[3].endswith("at 11.0%")
    # Against the held-out calibration (the reference): the paired difference over the same items, as a loop.
    held_cell = next(c for c in held.cells if c.score == "ahon_ln" and c.target == 0.1)
    x, y = (np.asarray(c.per_item["pred"]) == 0 for c in (cell, held_cell))
    draws = np.random.default_rng(0).integers(0, 30, size=(300, 30))
    diffs = [100 * (x[i].mean() - y[i].mean()) for i in draws]
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    assert row[5] == f"{100 * (x.mean() - y.mean()):+.1f} [{lo:+.1f}, {hi:+.1f}]"
    assert protocol_table([(same, None)]) is None
