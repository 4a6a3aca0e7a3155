import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inactive_heads.scores import HeadScores
from inactive_heads.stats.bootstrap import resample_counts
from inactive_heads.stats.thresholds import DEFAULT_TARGETS, resampled_thresholds, thresholds_for, thresholds_from_cdf

_f32 = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32)
_targets = st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=8)
_side = st.sampled_from(["below", "above"])


def fraction_passing(scores: torch.Tensor | np.ndarray, side: str, threshold: float) -> float:
    """Fraction of the pooled ``scores`` that pass ``threshold`` (strict, compared in float32 like the engine)."""
    values = (scores.numpy() if isinstance(scores, torch.Tensor) else np.asarray(scores)).astype(np.float32).ravel()
    t = np.float32(threshold)
    return float((values < t if side == "below" else values > t).mean())


def _achievable(values: np.ndarray, side: str) -> list[int]:
    # Every count of strictly-passing values a threshold could produce, by brute force over candidate thresholds.
    v = np.sort(values)
    cands = np.concatenate([v, np.nextafter(v, np.float32(np.inf)), np.nextafter(v, np.float32(-np.inf))])
    if side == "below":
        return sorted({int((values < c).sum()) for c in cands})
    return sorted({int((values > c).sum()) for c in cands})


def test_default_targets_are_increasing_fractions_that_thresholds_reach():
    """The sweep's default grid: increasing fractions in [0, 0.3], starting at 0 (nothing zeroed), each reached."""
    assert len(DEFAULT_TARGETS) >= 2 and DEFAULT_TARGETS[0] == 0.0
    assert all(a < b for a, b in itertools.pairwise(DEFAULT_TARGETS))
    assert all(0.0 <= p <= 0.3 for p in DEFAULT_TARGETS)
    x = np.random.default_rng(0).permutation(1000).astype(np.float32)  # distinct values
    for side in ("below", "above"):
        thresholds = thresholds_from_cdf(x, side)  # the targets default to DEFAULT_TARGETS
        assert len(thresholds) == len(DEFAULT_TARGETS)
        for p, t in zip(DEFAULT_TARGETS, thresholds, strict=True):
            assert abs(fraction_passing(x, side, t) - p) <= 1 / (2 * x.size)


@settings(max_examples=80, deadline=None)
@given(st.lists(_f32, min_size=1, max_size=200, unique=True), _targets, _side)
def test_distinct_values_within_half_over_n(values, targets, side):
    x = np.array(values, dtype=np.float32)
    n = x.size
    for p, t in zip(targets, thresholds_from_cdf(x, side, targets), strict=True):
        frac = fraction_passing(x, side, t)
        assert abs(frac - p) <= 1 / (2 * n) + 1e-12
        assert abs(frac - p) <= 1 / n


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=60), _targets, _side)
def test_ties_pick_nearest_achievable_and_zero_passes_none(values, targets, side):
    x = np.array(values, dtype=np.float32)
    n = x.size
    ach = _achievable(x, side)
    for p, t in zip(targets, thresholds_from_cdf(x, side, targets), strict=True):
        count = round(fraction_passing(x, side, t) * n)
        assert count in ach
        best = min(abs(c - p * n) for c in ach)
        assert abs(count - p * n) == pytest.approx(best)
    assert fraction_passing(x, side, thresholds_from_cdf(x, side, [0.0])[0]) == 0.0


@settings(max_examples=100, deadline=None)
@given(st.lists(_f32, min_size=1, max_size=100), _side)
def test_monotone_in_p(values, side):
    x = np.array(values, dtype=np.float32)
    ps = np.linspace(0, 1, 21)
    ts = thresholds_from_cdf(x, side, ps)
    fracs = [fraction_passing(x, side, t) for t in ts]
    assert all(a <= b for a, b in itertools.pairwise(fracs))
    diffs = np.diff(ts)
    assert (diffs >= 0).all() if side == "below" else (diffs <= 0).all()
    assert fracs[-1] == 1.0  # p=1 zeroes every head, including the maximum


def test_matches_engine_comparison_on_tensor():
    torch.manual_seed(0)
    s = torch.rand(20, 4, 8)
    for side in ("below", "above"):
        for p, t in zip(DEFAULT_TARGETS, thresholds_from_cdf(s, side), strict=True):
            mask = s < t if side == "below" else s > t  # what ScoreSpec.passes does, python float vs float32
            assert abs(mask.float().mean().item() - p) <= 1 / s.numel()


def test_hand_computed_quantiles():
    x = np.array([5, 1, 4, 2, 3, 6, 8, 7, 10, 9], dtype=np.float32)  # 1..10
    assert thresholds_from_cdf(x, "below", [0.0, 0.2, 0.5]) == [1.0, 3.0, 6.0]  # 0, 2, 5 values pass
    assert thresholds_from_cdf(x, "above", [0.0, 0.2, 0.5]) == [10.0, 8.0, 5.0]
    # Ties: [1, 1, 1, 2]: achievable "below" counts are 0, 3, 4; p=0.25 -> nearest is 0 (|0-1| < |3-1|).
    y = np.array([1, 1, 1, 2], dtype=np.float32)
    assert thresholds_from_cdf(y, "below", [0.25, 0.5, 0.75]) == [1.0, 2.0, 2.0]


def test_nan_never_passes_and_counts_in_denominator():
    x = np.array([np.nan, 1, 2, 3], dtype=np.float32)
    t = thresholds_from_cdf(x, "below", [0.5, 1.0])
    assert fraction_passing(x, "below", t[0]) == 0.5
    assert fraction_passing(x, "below", t[1]) == 0.75  # the best achievable: NaN never passes


def test_rejects_bad_arguments():
    with pytest.raises(ValueError):
        thresholds_from_cdf(np.ones(3), "sideways", [0.1])
    with pytest.raises(ValueError):
        thresholds_from_cdf(np.ones(3), "below", [1.5])
    with pytest.raises(ValueError):
        thresholds_from_cdf(np.array([np.nan]), "below", [0.1])


def test_thresholds_for_headscores_uses_registry_side():
    torch.manual_seed(1)
    hs = HeadScores({"awft": torch.rand(10, 2, 4), "ahon": torch.rand(10, 2, 4)})
    out = thresholds_for(hs, [0.0, 0.25])
    assert set(out) == {"awft", "ahon"}
    assert fraction_passing(hs["awft"], "above", out["awft"][1]) == pytest.approx(0.25)
    assert fraction_passing(hs["ahon"], "below", out["ahon"][1]) == pytest.approx(0.25)


_cell = st.one_of(st.integers(-3, 3).map(float), st.sampled_from([float("nan"), float("inf"), float("-inf")]), _f32)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 5).flatmap(
        lambda items: st.tuples(st.just(items), st.lists(_cell, min_size=3 * items, max_size=3 * items))
    ),
    _targets,
    _side,
    st.integers(0, 2**16),
)
def test_resampled_thresholds_are_those_of_the_repeated_rows(data, targets, side, seed):
    """Each resample equals thresholds_from_cdf of its rows repeated by their item's count: ties, NaNs (counted in
    the denominator), infinities and undrawn items included."""
    n_items, cells = data
    rows = np.array(cells, dtype=np.float32).reshape(n_items * 3, 1)  # 3 rows per item
    row_items = np.repeat(np.arange(n_items), 3)
    counts = resample_counts(n_items, 8, seed)
    if np.isnan(rows).all():
        return
    got = resampled_thresholds(rows, side, targets, row_items, counts)
    for k in range(8):
        repeated = np.concatenate([rows[row_items == i] for i in range(n_items) for _ in range(counts[k, i])])
        if np.isnan(repeated).all():
            assert np.isnan(got[k]).all()
            continue
        assert got[k].tolist() == thresholds_from_cdf(repeated, side, targets), k


def test_resampled_thresholds_with_all_ones_are_the_thresholds():
    x = torch.tensor(np.random.default_rng(1).gamma(2.0, size=(12, 3, 2)), dtype=torch.float32)
    items = np.arange(12) // 2
    ones = np.ones((1, 6), dtype=np.int32)
    for side in ("below", "above"):
        got = resampled_thresholds(x, side, DEFAULT_TARGETS, items, ones)
        assert got[0].tolist() == thresholds_from_cdf(x, side)
