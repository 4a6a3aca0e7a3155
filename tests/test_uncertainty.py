"""The paired bootstrap against a per-resample loop, and the properties its intervals must have."""

from __future__ import annotations

import numpy as np
import pytest

from inactive_heads.stats import bootstrap
from inactive_heads.stats.bootstrap import (
    _resampled_w1,
    bootstrap_cascade,
    bootstrap_difference,
    bootstrap_run,
    bootstrap_wasserstein,
    resample_counts,
)
from inactive_heads.stats.curves import Curve, table2
from inactive_heads.stats.distances import wasserstein1


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
            maxz[row.score].append(row.max_zeroed)
            ranks[row.score].append(row.rank)
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


def test_identical_cells_have_a_zero_width_difference_and_equal_ranks():
    base = np.array([True, False] * 20)
    curves = {"same": [(0.1, base), (0.2, base)], "also": [(0.1, base), (0.2, base)]}
    boot = bootstrap_run(base, curves, n_resamples=300)
    assert all(iv.low == iv.high == iv.value == 0.0 for iv in boot.cells.values())
    assert boot.rank["same"] == boot.rank["also"]


def test_a_large_paired_difference_excludes_zero_and_a_tiny_one_does_not():
    rng = np.random.default_rng(1)
    base = rng.random(400) < 0.7
    broken = base & (rng.random(400) < 0.5)  # loses about half of the correct answers
    one_off = base.copy()
    one_off[np.flatnonzero(base)[0]] = False  # one item differs
    boot = bootstrap_run(base, {"broken": [(0.2, broken)], "one": [(0.2, one_off)]}, n_resamples=1000)
    assert boot.cells[("broken", 0.2)].excludes_zero()
    assert not boot.cells[("one", 0.2)].excludes_zero()


def test_resample_counts_draw_n_items_per_resample_and_are_seeded():
    c = resample_counts(17, 50, seed=3)
    assert c.shape == (50, 17) and (c.sum(axis=1) == 17).all()
    assert (c == resample_counts(17, 50, seed=3)).all() and not (c == resample_counts(17, 50, seed=4)).all()


def test_bootstrap_difference_is_a_loop_over_explicit_resamples():
    rng = np.random.default_rng(4)
    a, b = rng.random(50) < 0.6, rng.random(50) < 0.5
    got = bootstrap_difference(a, b, n_resamples=300, seed=9)
    draws = np.random.default_rng(9).integers(0, 50, size=(300, 50))
    diffs = [sum(a[i] for i in idx) / 50 - sum(b[i] for i in idx) / 50 for idx in draws]
    assert got.value == pytest.approx(a.mean() - b.mean())
    assert (got.low, got.high) == pytest.approx(tuple(np.percentile(diffs, [2.5, 97.5])))
    same = bootstrap_difference(a, a)
    assert (same.value, same.low, same.high) == (0.0, 0.0, 0.0)


def test_bootstrap_cascade_is_a_loop_over_explicit_resamples():
    rng = np.random.default_rng(5)
    n = 40
    base, cell = rng.random(n) < 0.5, rng.random(n) < 0.4
    first = [None if u < 0.3 else int(k) for u, k in zip(rng.random(n), rng.integers(0, 200, n), strict=True)]
    got = bootstrap_cascade(cell, base, first, n_resamples=200, seed=2)
    draws = np.random.default_rng(2).integers(0, n, size=(200, n))
    delta, same, median = [], [], []
    for idx in draws:  # each resample as the list of items it drew
        delta.append(sum(int(cell[i]) - int(base[i]) for i in idx) / n)
        same.append(sum(first[i] is None for i in idx) / n)
        median.append(float(np.median([first[i] for i in idx if first[i] is not None])))
    assert got.delta.value == pytest.approx(cell.mean() - base.mean())
    assert (got.delta.low, got.delta.high) == pytest.approx(tuple(np.percentile(delta, [2.5, 97.5])))
    assert got.identical.value == pytest.approx(sum(k is None for k in first) / n)
    assert (got.identical.low, got.identical.high) == pytest.approx(tuple(np.percentile(same, [2.5, 97.5])))
    assert got.quartiles[1].value == np.median([k for k in first if k is not None])
    assert (got.quartiles[1].low, got.quartiles[1].high) == pytest.approx(tuple(np.percentile(median, [2.5, 97.5])))
    none = bootstrap_cascade(base, base, [None] * n)
    assert none.identical.value == 1.0 and all(np.isnan(q.value) for q in none.quartiles)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="items, but the baseline has"):
        bootstrap_run([True, False], {"a": [(0.1, [True])]})
    with pytest.raises(ValueError, match="level"):
        bootstrap_run([True], {}, level=1.5)
    with pytest.raises(ValueError, match="same items"):
        bootstrap_difference([True, False], [True])


def _scores(seed: int, rows: int, shape: tuple[int, ...] = (3, 2), shift: float = 0.0) -> np.ndarray:
    return np.random.default_rng(seed).gamma(2.0, 1.0, size=(rows, *shape)) + shift


@pytest.mark.parametrize("block_values", [2**20, 300])  # one block; 2 resamples a block, the last one short
def test_resampled_w1_equals_w1_of_the_repeated_samples(monkeypatch, block_values):
    monkeypatch.setattr(bootstrap, "_W1_BLOCK_VALUES", block_values)
    a, b = _scores(0, 12), _scores(1, 9, shift=0.3)
    items_a, items_b = np.repeat(np.arange(6), 2), np.arange(9) // 3  # 6 items of 2 rows, 3 items of 3 rows
    counts_a, counts_b = resample_counts(6, 25, 3), resample_counts(3, 25, 4)
    va, vb = a.reshape(12, -1), b.reshape(9, -1)
    da, db = np.repeat(items_a, va.shape[1]), np.repeat(items_b, vb.shape[1])
    got = _resampled_w1(va.ravel(), da, counts_a, vb.ravel(), db, counts_b)
    for r in range(25):
        rep_a = np.concatenate([np.tile(va[items_a == i].ravel(), counts_a[r, i]) for i in range(6)])
        rep_b = np.concatenate([np.tile(vb[items_b == i].ravel(), counts_b[r, i]) for i in range(3)])
        assert got[r] == pytest.approx(wasserstein1(rep_a, rep_b), rel=1e-9, abs=1e-12)


def test_bootstrap_wasserstein_paired_is_a_loop_over_shared_item_resamples():
    a, b = _scores(2, 20), _scores(3, 20, shift=0.5)
    items = np.repeat(np.arange(10), 2)
    got = bootstrap_wasserstein(a, items, b, items, paired=True, n_resamples=300, seed=5)
    assert got.value == pytest.approx(wasserstein1(a, b))
    loop = []
    for counts in resample_counts(10, 300, 5):
        keep = np.repeat(np.arange(10), counts)
        loop.append(
            wasserstein1(np.concatenate([a[items == i] for i in keep]), np.concatenate([b[items == i] for i in keep]))
        )
    lo, hi = np.percentile(loop, [2.5, 97.5])
    assert (got.low, got.high) == pytest.approx((lo, hi))


def test_bootstrap_wasserstein_properties():
    a, b = _scores(4, 30), _scores(5, 24, shift=1.0)
    ia, ib = np.arange(30) // 3, np.arange(24) // 2
    one = bootstrap_wasserstein(a, ia, b, ib, n_resamples=400, seed=1)
    assert one == bootstrap_wasserstein(a, ia, b, ib, n_resamples=400, seed=1)  # seeded
    assert one.low <= one.value <= one.high and one.low > 0
    # NaNs are dropped like wasserstein1 drops them
    a_nan = a.copy()
    a_nan[0, 0, 0] = np.nan
    assert bootstrap_wasserstein(a_nan, ia, b, ib, n_resamples=10).value == pytest.approx(wasserstein1(a_nan, b))
    # a sample against itself: zero distance, an interval from zero when paired
    same = bootstrap_wasserstein(a, ia, a, ia, paired=True, n_resamples=50)
    assert same.value == 0 and same.low == 0 and same.high == 0
    with pytest.raises(ValueError, match="same items"):
        bootstrap_wasserstein(a, ia, b, ib, paired=True)
    with pytest.raises(ValueError, match="one item per row"):
        bootstrap_wasserstein(a, ia[:-1], b, ib)
