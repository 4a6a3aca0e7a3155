import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inactive_heads.scores import HeadScores
from inactive_heads.stats.curves import (
    Curve,
    common_fraction_range,
    max_zeroed_within,
    normalized_auc,
    rank_scores,
    spearman,
    table2,
    top_k_iou,
    zero_frequency,
)
from inactive_heads.stats.distances import wasserstein1, wasserstein_table

stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        # Drops below 0.59 between 0.2 and 0.3: 0.2 + (0.595 - 0.59) / (0.595 - 0.58) * 0.1.
        ([(0, 0.60), (0.1, 0.60), (0.2, 0.595), (0.3, 0.58)], 0.2 + 0.1 / 3),
        # Never below the line: the largest measured fraction.
        ([(0, 0.60), (0.1, 0.60), (0.3, 0.595)], 0.3),
        # Below the line from the first point (no baseline point given): 0.
        ([(0.05, 0.50), (0.1, 0.40)], 0.0),
        # First point exactly on the line counts as within, and is where the curve leaves: its fraction.
        ([(0, 0.59), (0.1, 0.50)], 0.0),
        ([(0, 0.60), (0.1, 0.59), (0.2, 0.50)], 0.1),
        # A dip that recovers and ends within: the largest fraction.
        ([(0, 0.60), (0.1, 0.50), (0.2, 0.60)], 0.2),
        # The LAST down-crossing counts: 0.2 + (0.60 - 0.59) / (0.60 - 0.40) * 0.1.
        ([(0, 0.60), (0.1, 0.50), (0.2, 0.60), (0.3, 0.40)], 0.205),
        # Unsorted input is sorted by fraction first.
        ([(0.3, 0.58), (0, 0.60), (0.2, 0.595), (0.1, 0.60)], 0.2 + 0.1 / 3),
    ],
)
def test_max_zeroed_within_hand_computed(points, expected):
    assert max_zeroed_within(points, baseline=0.60, tol=0.01) == pytest.approx(expected, abs=1e-12)


def test_curve_adds_baseline_point_and_interpolates_from_it():
    c = Curve("ahon", [(0.1, 0.5)], baseline=0.6)
    assert c.points == [(0.0, 0.6), (0.1, 0.5)] and c.label == "ahon"
    assert c.max_zeroed_within() == pytest.approx(0.01)  # 0.01 / (0.6 - 0.5) * 0.1
    assert Curve("x", [(0.0, 0.55), (0.1, 0.5)], baseline=0.6).points[0] == (0.0, 0.55)  # measured p=0 kept


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=12), st.floats(0, 1))
def test_max_zeroed_within_is_in_measured_range(points, baseline):
    v = max_zeroed_within(points, baseline)
    xs = [x for x, _ in points]
    assert v == 0.0 or min(xs) <= v <= max(xs)


def test_normalized_auc_hand_computed():
    pts = [(0, 0.6), (0.1, 0.6), (0.2, 0.3)]  # ratios 1, 1, 0.5
    assert normalized_auc(pts, 0.6) == pytest.approx((0.1 + 0.1 * 0.75) / 0.2)  # 0.875
    assert normalized_auc(pts, 0.6, x_max=0.1) == pytest.approx(1.0)
    assert normalized_auc(pts, 0.6, x_max=0.15) == pytest.approx((0.1 + 0.05 * (1 + 0.75) / 2) / 0.15)
    assert normalized_auc(pts, 0.6, x_max=0.4) == pytest.approx((0.175 + 0.2 * 0.5) / 0.4)  # last value held
    assert normalized_auc(pts[1:], 0.6) == pytest.approx(0.875)  # missing 0 point -> baseline
    assert normalized_auc([(0, 0.6), (0.3, 0.0)], 0.6) == pytest.approx(0.5)
    assert normalized_auc(pts, 0.6, x_max=0.0) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        normalized_auc(pts, 0.0)


def test_common_range_and_table2():
    a = Curve("a", [(0.1, 0.60), (0.2, 0.59), (0.32, 0.4)], baseline=0.6)
    b = Curve("b", [(0.1, 0.55), (0.28, 0.5)], baseline=0.6)
    r = Curve("random", [(0.1, 0.60), (0.2, 0.59), (0.3, 0.3)], baseline=0.6)
    assert common_fraction_range([a, b, r]) == 0.28
    rows = table2([b, r, a])
    assert [row.score for row in rows] == ["a", "random", "b"]  # a and random tie on max_zeroed; AUC breaks it
    assert rows[0].max_zeroed == pytest.approx(0.2) and rows[1].max_zeroed == pytest.approx(0.2)
    assert rows[2].max_zeroed == pytest.approx(0.02)  # 0.01 / (0.6 - 0.55) * 0.1
    assert [row.rank for row in rows] == [1.0, 2.0, 3.0]
    assert rows[0].auc == pytest.approx(a.auc(0.28))
    # A score that zeroes nothing at any target neither shrinks the common range nor gets an AUC over it.
    flat = Curve("flat", [(0.0, 0.6)], baseline=0.6)
    assert common_fraction_range([a, b, r, flat]) == 0.28
    rows = table2([b, r, a, flat])
    assert rows[-1].score == "flat" and rows[-1].max_zeroed == 0 and math.isnan(rows[-1].auc)
    assert rows[0].auc == pytest.approx(a.auc(0.28))
    # A value is a lower bound only where the curve zeroes heads and ends within the tolerance.
    assert not any(row.lower_bound for row in rows)
    ends = Curve("ends", [(0.0, 0.6), (0.3, 0.591), (0.1, 0.58)], baseline=0.6)  # unsorted: the last is 0.3
    (row,) = table2([ends])
    assert row.lower_bound and row.max_zeroed == pytest.approx(0.3)
    assert not Curve("x", [(0.1, 0.6), (0.2, 0.58)], baseline=0.6).ends_within()


def test_rank_scores_ties_and_nan():
    assert rank_scores({"a": 3, "b": 1, "c": 3, "d": math.nan}) == {"a": 1.5, "b": 3.0, "c": 1.5, "d": 4.0}
    assert rank_scores({"a": 3, "b": 1}, higher_is_better=False) == {"a": 2.0, "b": 1.0}
    vals = [4, 1, 1, 7, 4, 4, 2]
    ours = rank_scores({str(i): v for i, v in enumerate(vals)}, higher_is_better=False)
    assert list(ours.values()) == pytest.approx(list(stats.rankdata(vals)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=3, max_size=15))
def test_spearman_matches_scipy(pairs):
    a = {f"s{i}": float(x) for i, (x, _) in enumerate(pairs)}
    b = {f"s{i}": float(y) for i, (_, y) in enumerate(pairs)}
    ours = spearman(a, b)
    if len(set(a.values())) < 2 or len(set(b.values())) < 2:
        assert math.isnan(ours)
    else:
        assert ours == pytest.approx(stats.spearmanr(list(a.values()), list(b.values())).statistic)


def test_spearman_common_keys_and_top_k_iou():
    a = {"s1": 1, "s2": 2, "s3": 3, "s4": 4}
    b = {"s1": 1, "s3": 2, "s4": 3, "s2": 4, "extra": 5}
    assert spearman(a, a) == pytest.approx(1.0)
    assert spearman(a, {k: -v for k, v in a.items()}) == pytest.approx(-1.0)
    assert spearman(a, b) == pytest.approx(stats.spearmanr([1, 2, 3, 4], [1, 4, 2, 3]).statistic)
    assert top_k_iou(a, b, k=2) == pytest.approx(1 / 3)  # {s1, s2} vs {s1, s3}
    assert top_k_iou(a, b, k=4) == 1.0
    assert top_k_iou({"x": 1, "y": 2.5, "z": 2.5}, {"x": 1, "y": 2, "z": 3}, k=2) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        top_k_iou(a, b, k=0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-100, 100), min_size=1, max_size=40),
    st.lists(st.floats(-100, 100), min_size=1, max_size=25),
)
def test_wasserstein1_matches_scipy(a, b):
    assert wasserstein1(a, b) == pytest.approx(stats.wasserstein_distance(a, b), abs=1e-9, rel=1e-9)


def test_wasserstein1_basics():
    assert wasserstein1([0.0, 1.0], [0.0, 1.0]) == 0.0
    assert wasserstein1([0.0], [3.0]) == pytest.approx(3.0)
    assert wasserstein1(torch.tensor([0.0, 0.0, 1.0]), np.array([1.0, np.nan])) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        wasserstein1([], [1.0])


def test_wasserstein_table_pooled_per_layer_and_relative_depth():
    g = torch.Generator().manual_seed(0)
    a = HeadScores({"ahon": torch.rand(8, 3, 4, generator=g), "awft": torch.rand(8, 3, 4, generator=g)})
    b = HeadScores({"ahon": torch.rand(5, 3, 2, generator=g) * 2})
    pooled = wasserstein_table(a, b)
    assert list(pooled) == ["ahon"]
    assert pooled["ahon"] == pytest.approx(stats.wasserstein_distance(a["ahon"].flatten(), b["ahon"].flatten()))
    per = wasserstein_table(a, b, per_layer=True)["ahon"]
    assert len(per) == 3
    assert per[1] == pytest.approx(stats.wasserstein_distance(a["ahon"][:, 1].flatten(), b["ahon"][:, 1].flatten()))
    # A 6-layer model whose layer pairs copy a 3-layer model's layers is at distance 0 at every relative depth.
    deep = HeadScores({"ahon": a["ahon"].repeat_interleave(2, dim=1)})
    assert wasserstein_table(a, deep, per_layer=True)["ahon"] == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)
    assert wasserstein_table(deep, a, per_layer=True)["ahon"] == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)


def test_zero_frequency():
    z = torch.zeros(4, 2, 3, dtype=torch.bool)
    z[:2, 0, 1] = True
    z[:, 1, 2] = True
    f = zero_frequency(z)
    assert f.dtype == torch.float32 and f.shape == (2, 3)
    assert f.tolist() == [[0.0, 0.5, 0.0], [0.0, 0.0, 1.0]]
    with pytest.raises(ValueError):
        zero_frequency(torch.zeros(2, 3, dtype=torch.bool))


def test_zero_baseline_gives_nan_auc_and_still_ranks():
    rows = table2([Curve("a", [(0.1, 0.0)], 0.0), Curve("b", [(0.2, 0.0)], 0.0)])
    assert all(math.isnan(r.auc) for r in rows)
    assert [r.score for r in rows] == ["b", "a"]  # both stay within 1 pt of 0: the larger fraction wins
