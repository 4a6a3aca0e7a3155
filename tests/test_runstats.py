"""Run-level statistics from stored cells: bootstrap inputs, thresholds side by side, calibrations compared."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inactive_heads.rundir import RunData
from inactive_heads.runstats import calibration_label, protocol_table, run_bootstrap, threshold_table
from inactive_heads.uncertainty import bootstrap_run

IDS = [f"q{i}" for i in range(30)]


def _cell(score, target, frac, correct, threshold=None):
    gold = [0] * len(correct)
    pred = [0 if c else 1 for c in correct]
    per_item = {"ids": IDS, "gold": gold, "pred": pred, "pred_norm": pred, "loglikelihoods": []}
    return {
        "score": score,
        "target": target,
        "threshold": threshold,
        "fraction_zeroed": frac,
        "accuracy": float(np.mean(correct)),
        "per_item": per_item,
    }


def _run(task="piqa", cal_task="piqa", items="heldout", thresholds=(0.5, 0.7), seed=0):
    rng = np.random.default_rng(seed)
    base = rng.random(30) < 0.7
    cells = [_cell(None, None, 0.0, base)]
    for k, (target, t) in enumerate(zip((0.1, 0.2), thresholds, strict=True)):
        cells.append(_cell("ahon_ln", target, target + 0.01, base ^ (rng.random(30) < 0.1 * k), t))
        cells.append(_cell("awft", target, target, base ^ (rng.random(30) < 0.2 * (k + 1)), 2 * t))
    meta = {"task": cal_task, "items": items}
    return RunData(Path("/nonexistent"), {"task": task, "model": {"name": "m"}}, cells, None, meta)


def test_run_bootstrap_feeds_per_item_correctness_in_curve_order():
    run = _run()
    boot = run_bootstrap(run, n_resamples=200, seed=3)
    base = np.asarray(run.cells[0]["per_item"]["pred"]) == 0
    curves = {
        name: [(c["fraction_zeroed"], np.asarray(c["per_item"]["pred"]) == 0) for c in curve.extra["cells"]]
        for name, curve in run.curves().items()
    }
    expected = bootstrap_run(base, curves, n_resamples=200, seed=3)
    assert boot is not None and boot.cells == expected.cells and boot.rank == expected.rank
    assert boot.max_zeroed["ahon_ln"].value == pytest.approx(
        {r["score"]: r["max_zeroed"] for r in run.table2()}["ahon_ln"]
    )


def test_run_bootstrap_is_none_without_per_item_answers_or_with_other_items():
    run = _run()
    del run.cells[2]["per_item"]
    assert run_bootstrap(run) is None
    run = _run()
    run.cells[1]["per_item"]["ids"] = list(reversed(IDS))
    assert run_bootstrap(run) is None


def test_threshold_table_puts_each_tasks_threshold_side_by_side():
    header, rows = threshold_table([_run("piqa", "piqa"), _run("arc_easy", "arc_easy", thresholds=(0.6, 0.7))])
    assert header[2:4] == ["threshold on piqa", "threshold on arc_easy"]
    by = {(r[0], r[1]): r for r in rows}
    assert by[("AHON (LN)", "0.1")][2:] == ["0.5", "0.6", f"{0.1 / 0.55:.3f}"]
    assert by[("AHON (LN)", "0.2")][4] == "0.000"
    assert threshold_table([_run()]) is None


def test_protocol_table_lines_up_cells_of_one_task_under_each_calibration():
    same, held, moved = _run(items="same"), _run(seed=1), _run(cal_task="arc_easy", items="same", seed=2)
    assert [calibration_label(r) for r in (same, held, moved)] == [
        "calibrated on the evaluated items",
        "held-out calibration",
        "calibrated on arc_easy",
    ]
    header, rows = protocol_table([(same, None), (held, run_bootstrap(held)), (moved, None)])
    assert header == ["score", "target", *(calibration_label(r) for r in (same, held, moved))]
    assert [r[:2] for r in rows] == [["AWFT", "0.1"], ["AWFT", "0.2"], ["AHON (LN)", "0.1"], ["AHON (LN)", "0.2"]]
    cell = next(c for c in same.cells if c["score"] == "ahon_ln" and c["target"] == 0.1)
    row = next(r for r in rows if r[:2] == ["AHON (LN)", "0.1"])
    assert row[2] == f"{100 * (cell['accuracy'] - same.baseline):+.1f} at 11.0%"
    assert row[3].count("[") == 1 and row[3].endswith("at 11.0%")
    assert protocol_table([(same, None)]) is None
