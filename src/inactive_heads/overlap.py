"""Do score functions flag the same heads, and do their thresholds carry over between tasks?

Both read calibration scores only (no forward pass). A score function *flags* a (row, layer, head) when its score
on that row passes the threshold that its pooled calibration CDF gives for a target fraction, as the sweep's
zeroing would. For two functions at the same target, ``IoU = |A & B| / |A | B|`` and the precision of ``A``
against ``B`` is ``|A & B| / |A|``: the share of A's flagged heads that B flags too (not symmetric).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .scores import SCORE_FUNCTIONS
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
    (NaN where a function flags nothing)."""

    names: list[str]
    target: float
    iou: np.ndarray
    precision: np.ndarray

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


def overlap(scores: Mapping[str, torch.Tensor], names: Sequence[str], target: float) -> Overlap:
    """:class:`Overlap` of ``names`` at ``target`` on the calibration ``scores`` (a :class:`HeadScores`)."""
    sets = np.stack([flagged(scores, n, target).reshape(-1) for n in names]).astype(np.float64)  # [k, cells]
    both = sets @ sets.T
    size = sets.sum(axis=1)
    union = size[:, None] + size[None, :] - both
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, both / union, np.nan)
        precision = np.where(size[:, None] > 0, both / size[:, None], np.nan)
    return Overlap(list(names), float(target), iou, precision)


def threshold_spread(thresholds: Mapping[str, float]) -> float:
    """How far the thresholds of one score and target differ across tasks: ``(max - min) / |median|`` (0: identical;
    NaN for fewer than two tasks or a zero median)."""
    values = np.array(list(thresholds.values()), dtype=float)
    if values.size < 2:
        return float("nan")
    mid = abs(float(np.median(values)))
    return float((values.max() - values.min()) / mid) if mid > 0 else float("nan")
