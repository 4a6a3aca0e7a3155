"""Do score functions flag the same heads, and do their thresholds carry over between tasks?

Both read calibration scores only (no forward pass). A score function *flags* a (row, layer, head) when its score
on that row passes the threshold that its pooled calibration CDF gives for a target fraction, as the sweep's
zeroing would. For two functions at the same target, ``IoU = |A & B| / |A | B|`` and the precision of ``A``
against ``B`` is ``|A & B| / |A|``: the share of A's flagged heads that B flags too (not symmetric).

Given the item of each calibration row, both come with a bootstrap interval over items (thresholds kept as
calibrated, as a sweep keeps them): a resample counts each row's flagged heads as often as its item is drawn.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import InactiveHeadsError
from ..scores import SCORE_FUNCTIONS
from .bootstrap import DEFAULT_RESAMPLES, item_index, resample_counts
from .thresholds import thresholds_from_cdf

__all__ = ["Overlap", "flagged", "overlap", "threshold_spread"]


def flagged(scores: Mapping[str, torch.Tensor], name: str, target: float) -> np.ndarray:
    """Boolean ``[rows, n_layers, n_heads]``: where score ``name`` passes its calibration threshold for ``target``."""
    spec = SCORE_FUNCTIONS[name]
    (threshold,) = thresholds_from_cdf(scores[name], spec.inactive_when, [target])
    return spec.passes(scores[name].to(torch.float32), threshold).numpy()


@dataclass(frozen=True)
class Overlap:
    """IoU and precision between the flagged sets of score functions ``names`` at one target fraction.

    ``precision[i][j]`` is the share of ``names[i]``'s flagged heads that ``names[j]`` flags too; diagonals are 1
    (NaN where a function flags nothing). ``iou_interval`` / ``precision_interval``: ``[2, k, k]`` percentile
    bounds of a bootstrap over items, None when the rows' items are unknown."""

    names: list[str]
    target: float
    iou: np.ndarray
    precision: np.ndarray
    level: float = 0.95
    iou_interval: np.ndarray | None = None
    precision_interval: np.ndarray | None = None

    def max_pair(self, which: str) -> tuple[float, str, str]:
        """The largest off-diagonal value of ``which`` (``"iou"`` or ``"precision"``) and its pair."""
        matrix = self.iou if which == "iou" else self.precision
        best = (float("nan"), "", "")
        for i, a in enumerate(self.names):
            for j, b in enumerate(self.names):
                v = float(matrix[i, j])
                if i != j and not np.isnan(v) and not (v <= best[0]):
                    best = (v, a, b)
        return best


def _ratios(both: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IoU and precision from intersection counts ``[..., k, k]`` and set sizes ``[..., k]``."""
    union = size[..., :, None] + size[..., None, :] - both
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, both / union, np.nan)
        precision = np.where(size[..., :, None] > 0, both / size[..., :, None], np.nan)
    return iou, precision


def _resampled(sets: np.ndarray, row_items: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IoU and precision ``[resamples, k, k]`` when row ``r`` of ``sets`` (``[k, rows, cells]``, 0/1) counts
    ``counts[:, row_items[r]]`` times."""
    per_row = np.einsum("arc,brc->rab", sets, sets)  # [rows, k, k]: heads two functions both flag in the row
    weights = counts[:, row_items].astype(np.float64)  # [resamples, rows]
    both = np.einsum("nr,rab->nab", weights, per_row)
    return _ratios(both, np.diagonal(both, axis1=1, axis2=2))


def overlap(
    scores: Mapping[str, torch.Tensor],
    names: Sequence[str],
    target: float,
    row_items: Sequence[int] | np.ndarray | None = None,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> Overlap:
    """:class:`Overlap` of ``names`` at ``target`` on the calibration ``scores`` (a :class:`HeadScores`), with
    bootstrap intervals when ``row_items`` (the item of each row) is given."""
    sets = np.stack([flagged(scores, n, target).reshape(scores[n].shape[0], -1) for n in names])  # [k, rows, cells]
    flat = sets.reshape(len(names), -1).astype(np.float64)  # [k, rows * cells]
    both = flat @ flat.T
    iou, precision = _ratios(both, np.diagonal(both))
    if row_items is None:
        return Overlap(list(names), float(target), iou, precision, level)
    items = np.asarray(row_items)
    if items.shape != (sets.shape[1],):
        raise InactiveHeadsError(
            f"{items.shape[0]} row items for {sets.shape[1]} calibration rows; give one item per row"
        )
    index, n_items = item_index(items)
    iou_s, precision_s = _resampled(sets.astype(np.float64), index, resample_counts(n_items, n_resamples, seed))
    tail = (1 - level) / 2 * 100
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN pairs: a function flags nothing
        bounds = [np.nanpercentile(x, [tail, 100 - tail], axis=0) for x in (iou_s, precision_s)]
    return Overlap(list(names), float(target), iou, precision, level, bounds[0], bounds[1])


def threshold_spread(thresholds: Mapping[str, float] | np.ndarray) -> float | np.ndarray:
    """How far the thresholds of one score and target differ across tasks: ``(max - min) / |median|`` (0: identical;
    NaN for fewer than two tasks or a zero median). An array ``[tasks, ...]`` gives one spread per trailing index
    (e.g. per bootstrap resample)."""
    values = np.array(list(thresholds.values()) if isinstance(thresholds, Mapping) else thresholds, dtype=float)
    if values.shape[0] < 2:
        return float("nan") if values.ndim == 1 else np.full(values.shape[1:], np.nan)
    mid = np.abs(np.median(values, axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        spread = np.where(mid > 0, (values.max(axis=0) - values.min(axis=0)) / mid, np.nan)
    return float(spread) if values.ndim == 1 else spread
