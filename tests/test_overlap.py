"""Overlap of flagged heads and threshold spread, against brute force over every (row, layer, head)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from inactive_heads.scores import SCORE_FUNCTIONS, HeadScores
from inactive_heads.stats.bootstrap import resample_counts
from inactive_heads.stats.overlap import _resampled, flagged, overlap, threshold_spread
from inactive_heads.stats.thresholds import thresholds_from_cdf

NAMES = ["awft", "ahon_ln", "avvn_ln", "random"]


@pytest.fixture(scope="module")
def scores():
    from _tiny import tiny_model, tiny_tokenizer

    import inactive_heads as ih

    model, tok = tiny_model("llama", seed=0), tiny_tokenizer()
    texts = [f"the {w} sat on the mat number {i}" for i, w in enumerate(["cat", "dog", "bird", "fox", "owl"] * 3)]
    return ih.record_scores(model, tok, texts, batch_size=4)


def _brute_sets(scores: HeadScores, name: str, target: float) -> set[tuple[int, int, int]]:
    spec = SCORE_FUNCTIONS[name]
    values = scores[name]
    (t,) = thresholds_from_cdf(values, spec.inactive_when, [target])
    rows, layers, heads = values.shape
    out = set()
    for r, layer, h in itertools.product(range(rows), range(layers), range(heads)):
        v = float(values[r, layer, h])
        if (v > t) if spec.inactive_when == "above" else (v < t):
            out.add((r, layer, h))
    return out


@pytest.mark.parametrize("target", [0.1, 0.25])
def test_iou_and_precision_match_brute_force(scores, target):
    result = overlap(scores, NAMES, target)
    sets = {n: _brute_sets(scores, n, target) for n in NAMES}
    for (i, a), (j, b) in itertools.product(enumerate(NAMES), repeat=2):
        inter, union = len(sets[a] & sets[b]), len(sets[a] | sets[b])
        assert result.iou[i, j] == pytest.approx(inter / union)
        assert result.precision[i, j] == pytest.approx(inter / len(sets[a]))
    assert np.allclose(np.diag(result.iou), 1) and np.allclose(result.iou, result.iou.T)
    value, a, b = result.max_pair("precision")
    assert value == pytest.approx(max(len(sets[x] & sets[y]) / len(sets[x]) for x in NAMES for y in NAMES if x != y))
    assert a != b and result.precision[NAMES.index(a), NAMES.index(b)] == value


def test_resampled_overlap_is_the_overlap_of_the_repeated_rows(scores):
    """A resample counts each row as often as its item is drawn; thresholds stay as calibrated."""
    items = np.arange(scores.shape[0]) // 3  # 15 rows, 5 items of 3 rows
    counts = resample_counts(5, 20, seed=3)
    sets = {n: _brute_sets(scores, n, 0.2) for n in NAMES}
    stacked = np.stack([flagged(scores, n, 0.2).reshape(scores.shape[0], -1) for n in NAMES]).astype(float)
    iou, precision = _resampled(stacked, items, counts)
    for r in range(20):
        for (i, a), (j, b) in itertools.product(enumerate(NAMES), repeat=2):
            weight = {row: counts[r, items[row]] for row in range(scores.shape[0])}
            inter = sum(weight[x[0]] for x in sets[a] & sets[b])
            union = sum(weight[x[0]] for x in sets[a] | sets[b])
            size = sum(weight[x[0]] for x in sets[a])
            assert iou[r, i, j] == pytest.approx(inter / union) if union else np.isnan(iou[r, i, j])
            assert precision[r, i, j] == pytest.approx(inter / size) if size else np.isnan(precision[r, i, j])


def test_overlap_intervals(scores):
    items = np.arange(scores.shape[0]) // 3
    plain = overlap(scores, NAMES, 0.2)
    assert plain.iou_interval is None and plain.precision_interval is None
    boot = overlap(scores, NAMES, 0.2, items, n_resamples=300, seed=1)
    assert np.array_equal(boot.iou, plain.iou) and np.array_equal(boot.precision, plain.precision, equal_nan=True)
    stacked = np.stack([flagged(scores, n, 0.2).reshape(scores.shape[0], -1) for n in NAMES]).astype(float)
    iou, _ = _resampled(stacked, items, resample_counts(5, 300, seed=1))
    assert np.allclose(boot.iou_interval, np.nanpercentile(iou, [2.5, 97.5], axis=0), equal_nan=True)
    lo, hi = boot.iou_interval
    assert np.all((lo <= boot.iou + 1e-12) | np.isnan(lo)) and np.all((boot.iou <= hi + 1e-12) | np.isnan(hi))
    with pytest.raises(ValueError, match="one item per row"):
        overlap(scores, NAMES, 0.2, items[:-1])


def test_flagged_is_what_the_target_asks_for(scores):
    for name in NAMES:
        mask = flagged(scores, name, 0.2)
        assert mask.shape == tuple(scores.shape) and abs(mask.mean() - 0.2) < 0.05
        assert set(zip(*np.nonzero(mask), strict=True)) == _brute_sets(scores, name, 0.2)


def test_a_function_flagging_nothing_gives_nan_not_a_division_error():
    values = torch.ones(4, 2, 3)
    s = HeadScores({"ahon_ln": values, "avvn_ln": torch.rand(4, 2, 3)})
    result = overlap(s, ["ahon_ln", "avvn_ln"], 0.2)  # constant scores: nothing below the threshold
    assert np.isnan(result.precision[0, 1]) and result.iou[0, 1] == 0


def test_threshold_spread():
    assert threshold_spread({"piqa": 0.5, "arc": 0.5}) == 0
    assert threshold_spread({"piqa": 0.4, "arc": 0.6, "hs": 0.5}) == pytest.approx(0.4)
    assert np.isnan(threshold_spread({"piqa": 0.5}))
