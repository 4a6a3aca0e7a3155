"""Thresholds from the pooled empirical CDF of recorded scores.

For a score function and a target fraction ``p``, the sweep zeroes, per input and per layer, every head whose score
passes one global threshold. The threshold is chosen on calibration scores pooled over rows x layers x heads so that
the fraction of pooled values passing is as close as possible to ``p``.

Quantile convention (``n`` pooled values, sorted ascending ``s[0] <= ... <= s[n-1]``):

* ``"below"`` (pass when ``score < t``): with distinct values, ``t = s[k]`` with ``k = round(p * n)`` makes exactly
  ``k`` values pass; this is the "lower" empirical ``p``-quantile taken at index ``round(p*n)``. For ``k = n`` the
  threshold is the next float32 above ``s[n-1]``.
* ``"above"`` (pass when ``score > t``): the mirror image, ``t = s[n-1-k]``, i.e. the ``(1-p)``-quantile; for ``k = n``
  the next float32 below ``s[0]``.
* Ties: a threshold can only make whole groups of equal values pass, so the achievable counts are the numbers of
  values strictly below (above) each distinct value, plus ``n``. The achievable count nearest ``p * n`` is chosen, the
  smaller one when two are equally near (zero less when in doubt). Without ties ``|fraction - p| <= 1/(2n)``.
* ``p = 0`` always gives count 0 (``t = s[0]`` resp. ``s[n-1]``): nothing is zeroed.
* NaN scores never pass a strict comparison; they stay in the denominator ``n`` but are never counted.

Thresholds are float32 values returned as Python floats (exact), because the engine compares float32 scores with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch

from ..errors import InactiveHeadsError

__all__ = ["DEFAULT_TARGETS", "resampled_thresholds", "thresholds_for", "thresholds_from_cdf"]

#: Target fractions of heads to zero: 0 %, 5 %, ..., 30 %.
DEFAULT_TARGETS: tuple[float, ...] = (0.0, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30)


def _as_float32(scores: torch.Tensor | np.ndarray | Sequence[float]) -> np.ndarray:
    if isinstance(scores, torch.Tensor):
        return scores.detach().to("cpu", torch.float32).reshape(-1).numpy()
    return np.asarray(scores, dtype=np.float32).reshape(-1)


def check_targets(targets: Iterable[float]) -> list[float]:
    """``targets`` as floats; ValueError unless every one is a fraction of heads in [0, 1]."""
    ps = [float(p) for p in targets]
    bad = [p for p in ps if not 0.0 <= p <= 1.0]
    if bad:
        raise InactiveHeadsError(f"target fractions must lie in [0, 1], got {bad}")
    return ps


def _check(inactive_when: str, targets: Iterable[float]) -> list[float]:
    if inactive_when not in ("above", "below"):
        raise InactiveHeadsError(f"inactive_when must be 'above' or 'below', got {inactive_when!r}")
    return check_targets(targets)


def _below(values: np.ndarray, n_total: int, ps: list[float]) -> list[float]:
    s = np.sort(values[~np.isnan(values)])
    if s.size == 0:
        raise InactiveHeadsError("no finite scores to take thresholds from")
    top = np.nextafter(s[-1], np.float32(np.inf), dtype=np.float32)
    candidates = np.append(np.unique(s), top).astype(np.float32)
    # Actual counts under the strict `<` the engine uses; this also handles +inf maxima where `top` cannot pass all.
    counts = np.searchsorted(s, candidates, side="left")
    out = []
    for p in ps:
        # argmin returns the first minimum, and counts ascend, so ties resolve to the smaller count.
        i = int(np.argmin(np.abs(counts - p * n_total)))
        out.append(float(candidates[i]))
    return out


def thresholds_from_cdf(
    scores: torch.Tensor | np.ndarray, inactive_when: str, targets: Iterable[float] = DEFAULT_TARGETS
) -> list[float]:
    """One threshold per target fraction, from the pooled empirical CDF of ``scores`` (any shape, e.g. ``[N, L, H]``).

    ``inactive_when="below"`` gives the ``p``-quantile, ``"above"`` the ``(1-p)``-quantile, with the convention in the
    module docstring: the fraction of pooled values passing is the achievable one nearest ``p``; ``p=0`` passes none.
    """
    ps = _check(inactive_when, targets)
    values = _as_float32(scores)
    if inactive_when == "below":
        return _below(values, values.size, ps)
    # x > t  <=>  -x < -t, and float32 negation is exact.
    return [-t for t in _below(-values, values.size, ps)]


def _weight_below(cum: np.ndarray, starts: np.ndarray, g: int) -> int:
    """The weight strictly below distinct value ``g``, from the cumulative weights ``cum`` of the sorted values
    (``starts``: the first sorted position of each distinct value)."""
    return int(cum[starts[g] - 1]) if g > 0 else 0


def resampled_thresholds(
    scores: torch.Tensor | np.ndarray,
    inactive_when: str,
    targets: Iterable[float],
    row_items: Sequence[int] | np.ndarray,
    counts: np.ndarray,
) -> np.ndarray:
    """``[resamples, targets]``: :func:`thresholds_from_cdf` of each bootstrap resample of ``scores`` ``[rows, ...]``,
    where row ``r`` counts ``counts[k, row_items[r]]`` times in resample ``k`` (``counts``: ``[resamples, items]``,
    :func:`~inactive_heads.stats.bootstrap.resample_counts`). Equal to the thresholds of the repeated rows, without
    building them: one sort serves every resample. NaN where a resample draws only NaN scores."""
    ps = _check(inactive_when, targets)
    sign = np.float32(1 if inactive_when == "below" else -1)  # x > t  <=>  -x < -t (exact in float32)
    row_items = np.asarray(row_items)
    per_row = _as_float32(scores).reshape(len(row_items), -1) * sign
    values = per_row.reshape(-1)
    item = np.repeat(row_items, per_row.shape[1])
    known = ~np.isnan(values)
    order = np.argsort(values[known], kind="stable")
    s, item_sorted = values[known][order], item[known][order]
    if s.size == 0:
        raise InactiveHeadsError("no finite scores to take thresholds from")
    first = np.r_[True, s[1:] != s[:-1]]
    starts = np.flatnonzero(first)  # first sorted position of each distinct value
    distinct, group_of = s[starts], np.cumsum(first) - 1  # group_of: the distinct value at each sorted position
    out = np.empty((counts.shape[0], len(ps)))
    for k, c in enumerate(counts):
        # cum[j]: weight of the sorted positions up to j in this resample. Only values drawn (weight > 0) are
        # candidates, and the position where `cum` first reaches a weight is the last drawn one up to it.
        cum = np.cumsum(c.astype(np.int64)[item_sorted])
        drawn = int(cum[-1])
        if drawn == 0:  # only NaN rows drawn: no threshold
            out[k] = np.nan
            continue
        total = float(c[row_items].sum()) * per_row.shape[1]  # NaNs stay in the denominator, never counted
        last = int(group_of[np.searchsorted(cum, drawn)])
        # As in _below: the count the value above the largest passes (not all, when that value is +inf).
        top_count = _weight_below(cum, starts, last) if distinct[last] == np.inf else drawn
        top = (float(np.nextafter(distinct[last], np.float32(np.inf), dtype=np.float32)), top_count)
        for j, p in enumerate(ps):
            want = p * total
            # g: the first distinct value with at least `want` below it (every value at or before position i
            # has less below it, where cum[i] is the first to reach `want`).
            i = int(np.searchsorted(cum, want))
            g = 0 if want <= 0 else int(group_of[i]) + 1 if i < cum.size else distinct.size
            weight = _weight_below(cum, starts, g) if g < distinct.size else drawn
            # The nearest drawn candidates: the last one below `want` and the first at or above it.
            lower = int(group_of[np.searchsorted(cum, weight)]) if weight > 0 else None
            lower_count = _weight_below(cum, starts, lower) if lower is not None else None
            upper_at = int(np.searchsorted(cum, weight, side="right")) if g < distinct.size else cum.size
            upper = (float(distinct[group_of[upper_at]]), weight) if upper_at < cum.size else top
            if lower_count is not None and abs(lower_count - want) <= abs(upper[1] - want):  # ties: the smaller
                out[k, j] = float(distinct[lower])
            else:
                out[k, j] = upper[0]
    return out * float(sign)


def thresholds_for(
    scores: Mapping[str, torch.Tensor],
    targets: Iterable[float] = DEFAULT_TARGETS,
    names: Iterable[str] | None = None,
) -> dict[str, list[float]]:
    """Thresholds per registered score function recorded in ``scores`` (a :class:`HeadScores`): name -> list."""
    from ..scores import SCORE_FUNCTIONS

    ps = list(targets)
    chosen = list(scores) if names is None else list(names)
    return {n: thresholds_from_cdf(scores[n], SCORE_FUNCTIONS[n].inactive_when, ps) for n in chosen}
