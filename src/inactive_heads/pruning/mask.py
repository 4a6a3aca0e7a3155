"""Choosing heads to prune: per head, how often a score marks it inactive on the calibration rows, and the mask.

:func:`head_inactivity` / :func:`static_mask`: per head, the fraction of calibration rows on which a score passes its
threshold (and the mean score); the mask removes the given fraction of all heads, most often inactive first.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import InactiveHeadsError, UnknownNameError
from ..runs.directory import RunDir
from ..scores import SCORE_FUNCTIONS, HeadScores
from ..stats.curves import zero_frequency
from ..stats.thresholds import thresholds_from_cdf

__all__ = ["HeadInactivity", "ScoresSource", "head_inactivity", "static_mask"]

ScoresSource = HeadScores | str | os.PathLike[str]


# --- choosing the mask -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadInactivity:
    """How inactive each head was on the calibration rows, by one score function.

    ``frequency`` [n_layers, n_heads]: fraction of rows on which the head's score passed ``threshold`` (what the
    report's head heatmap shows for the sweep cell of that threshold); ``mean`` [n_layers, n_heads]: its mean score.
    Heads a pruned model no longer has are NaN in both.
    """

    score: str
    threshold: float
    frequency: torch.Tensor
    mean: torch.Tensor
    rows: int


def _load_scores(scores: ScoresSource) -> HeadScores:
    if isinstance(scores, HeadScores):
        return scores
    path = Path(scores)
    if path.is_file():
        return HeadScores.load(path)
    return RunDir(path).read_calibration()


def head_inactivity(
    scores: ScoresSource, score: str, *, threshold: float | None = None, target: float | None = None
) -> HeadInactivity:
    """Per head, how often ``score`` marks it inactive on the calibration rows of ``scores``, and its mean score.

    ``scores``: a :class:`HeadScores`, a run directory (its calibration) or a saved scores file. The threshold is
    ``threshold`` if given, else the calibration threshold of ``target`` (the one the sweep uses for that target
    fraction, :func:`inactive_heads.thresholds_from_cdf`).
    """
    if score not in SCORE_FUNCTIONS:
        raise UnknownNameError(f"unknown score {score!r}; registered: {', '.join(SCORE_FUNCTIONS)}")
    if (threshold is None) == (target is None):
        raise InactiveHeadsError(
            "give either threshold= or target= (a fraction of heads whose calibration threshold to use)"
        )
    recorded = _load_scores(scores)
    if score not in recorded:
        recorded = recorded.derive([score])
    values = recorded[score]
    if values.shape[0] == 0:
        raise InactiveHeadsError("no calibration rows to choose heads from")
    spec = SCORE_FUNCTIONS[score]
    if threshold is None:
        assert target is not None
        threshold = thresholds_from_cdf(values, spec.inactive_when, [target])[0]
    absent = values.isnan().all(0)
    frequency = zero_frequency(spec.passes(values, float(threshold))).masked_fill(absent, math.nan)
    return HeadInactivity(score, float(threshold), frequency, values.nanmean(0), int(values.shape[0]))


def static_mask(scores: ScoresSource, *, score: str, fraction: float, threshold: float | None = None) -> torch.Tensor:
    """bool [n_layers, n_heads]: the ``fraction`` of all heads most often inactive by ``score`` on calibration rows.

    Heads are ranked by :func:`head_inactivity` frequency at ``threshold`` (default: the calibration threshold of
    target ``fraction``, so the ranking is by the per-head frequencies the report's heatmap shows for that target),
    ties broken by the mean score (the more inactive side first). ``round(fraction * n_layers * n_heads)`` heads are
    chosen, skipping any whose removal would leave its layer without a head. Heads already removed (scores of a
    pruned model, NaN) are in the mask and count towards the fraction. ValueError when the fraction cannot be met.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
        raise InactiveHeadsError(f"fraction must be a number in [0, 1], got {fraction!r}")
    found = head_inactivity(scores, score, threshold=threshold, target=None if threshold is not None else fraction)
    n_layers, n_heads = found.frequency.shape
    wanted = round(fraction * n_layers * n_heads)
    mask = found.frequency.isnan()
    left = (~mask).sum(1)
    if wanted > n_layers * n_heads - n_layers:
        raise InactiveHeadsError(
            f"cannot remove {wanted} of {n_layers * n_heads} heads and keep one per layer; use fraction <= "
            f"{(n_heads - 1) / n_heads:.3f}"
        )
    # More inactive first: higher frequency, then the mean score on the inactive side.
    side = 1.0 if SCORE_FUNCTIONS[score].inactive_when == "below" else -1.0
    order = sorted(
        ((layer, head) for layer in range(n_layers) for head in range(n_heads) if not mask[layer, head]),
        key=lambda lh: (-float(found.frequency[lh]), side * float(found.mean[lh]), lh),
    )
    count = int(mask.sum())
    for layer, head in order:
        if count >= wanted:
            break
        if left[layer] > 1:
            mask[layer, head] = True
            left[layer] -= 1
            count += 1
    return mask
