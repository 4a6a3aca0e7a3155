"""The paired bootstrap against a per-resample loop, and the properties its intervals must have."""

from __future__ import annotations

import numpy as np
import pytest

from inactive_heads.analysis import Curve, table2
from inactive_heads.uncertainty import bootstrap_run, resample_counts


def _run(seed: int, n: int = 40):
    rng = np.random.default_rng(seed)
    base = rng.random(n) < 0.6
    curves = {}
    for k, name in enumerate(("a", "b", "c")):
        flip = rng.random((3, n)) < 0.1 * (k + 1)
        curves[name] = [(0.1 * (i + 1), base ^ flip[i]) for i in range(3)]
    return base, curves


def test_matches_a_loop_over_explicit_resamples():
    base, curves = _run(0)
    n, r, seed = len(base), 200, 7
    boot = bootstrap_run(base, curves, n_resamples=r, seed=seed)
    draws = np.random.default_rng(seed).integers(0, n, size=(r, n))
    diffs, maxz, ranks = {}, {s: [] for s in curves}, {s: [] for s in curves}
    for idx in draws:
        b = sum(base[i] for i in idx) / n
        rows = []
        for s, cells in curves.items():
            pts = [(f, sum(c[i] for i in idx) / n) for f, c in cells]
            for f, acc in pts:
                diffs.setdefault((s, f), []).append(acc - b)
            rows.append(Curve(s, pts, b))
        for row in table2(rows):
            maxz[row["score"]].append(row["max_zeroed"])
            ranks[row["score"]].append(row["rank"])
    for key, values in diffs.items():
        lo, hi = np.percentile(values, [2.5, 97.5])
        assert boot.cells[key].low == pytest.approx(lo) and boot.cells[key].high == pytest.approx(hi)
        cell = dict(curves[key[0]])[key[1]]
        assert boot.cells[key].value == pytest.approx(cell.mean() - base.mean())
    for s in curves:
        expected = tuple(np.percentile(maxz[s], [2.5, 97.5]))
        assert (boot.max_zeroed[s].low, boot.max_zeroed[s].high) == pytest.approx(expected)
        # Ranks are discrete: the interval's ends are ranks some resample had (the wider neighbours).
        low, high = np.percentile(ranks[s], 2.5, method="lower"), np.percentile(ranks[s], 97.5, method="higher")
        assert (boot.rank[s].low, boot.rank[s].high) == (low, high) and low in ranks[s] and high in ranks[s]
        for t in curves:
            share = np.mean([(x < y) + 0.5 * (x == y) for x, y in zip(ranks[s], ranks[t], strict=True)])
            assert boot.better[s][t] == pytest.approx(share)


def test_identical_cells_have_a_zero_width_difference_and_equal_ranks_are_not_significant():
    base = np.array([True, False] * 20)
    curves = {"same": [(0.1, base), (0.2, base)], "also": [(0.1, base), (0.2, base)]}
    boot = bootstrap_run(base, curves, n_resamples=300)
    assert all(iv.low == iv.high == iv.value == 0.0 for iv in boot.cells.values())
    assert boot.better["same"]["also"] == 0.5 and not boot.significant("same", "also")


def test_a_large_paired_difference_is_significant_and_a_tiny_one_is_not():
    rng = np.random.default_rng(1)
    base = rng.random(400) < 0.7
    broken = base & (rng.random(400) < 0.5)  # loses about half of the correct answers
    one_off = base.copy()
    one_off[np.flatnonzero(base)[0]] = False  # one item differs
    boot = bootstrap_run(base, {"broken": [(0.2, broken)], "one": [(0.2, one_off)]}, n_resamples=1000)
    assert boot.cells[("broken", 0.2)].excludes_zero()
    assert not boot.cells[("one", 0.2)].excludes_zero()
    assert boot.significant("one", "broken") and boot.better["one"]["broken"] > 0.975


def test_resample_counts_draw_n_items_per_resample_and_are_seeded():
    c = resample_counts(17, 50, seed=3)
    assert c.shape == (50, 17) and (c.sum(axis=1) == 17).all()
    assert (c == resample_counts(17, 50, seed=3)).all() and not (c == resample_counts(17, 50, seed=4)).all()


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="items, but the baseline has"):
        bootstrap_run([True, False], {"a": [(0.1, [True])]})
    with pytest.raises(ValueError, match="level"):
        bootstrap_run([True], {}, level=1.5)
