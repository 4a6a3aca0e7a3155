"""Accuracy-vs-zeroed curves: the Table-2 metric, AUC, rankings of score functions, and zeroing frequencies.

Fractions (of heads zeroed) and accuracies are in [0, 1] throughout; the Table-2 tolerance
(:data:`TABLE2_TOLERANCE`, 0.01) is one accuracy point.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..errors import InactiveHeadsError

__all__ = [
    "TABLE2_TOLERANCE",
    "Curve",
    "Table2Row",
    "common_fraction_range",
    "max_zeroed_within",
    "normalized_auc",
    "rank_scores",
    "spearman",
    "table2",
    "top_k_iou",
    "within_tolerance",
    "zero_frequency",
]

TABLE2_TOLERANCE = 0.01  # one accuracy point: how far below baseline a "within" accuracy may fall

Point = tuple[float, float]

# Accuracies are ratios of small integers, so "exactly on the line" must survive float rounding of baseline - tol.
_ON_LINE_EPS = 1e-9


def _sorted_points(points: Iterable[Sequence[float]]) -> list[Point]:
    pts = [(float(x), float(a)) for x, a in points]
    if not pts:
        raise InactiveHeadsError("a curve needs at least one point")
    return sorted(pts, key=lambda p: p[0])  # stable: equal fractions keep their given order


@dataclass
class Curve:
    """Accuracy vs fraction of heads zeroed for one score function, sorted by fraction.

    ``points`` includes the baseline ``(0.0, baseline)`` first unless a point at fraction 0 is already present.
    ``extra`` carries free metadata (e.g. the targets and thresholds behind the points).
    """

    score: str
    points: list[Point]
    baseline: float
    label: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        pts = _sorted_points(self.points)
        if not any(x == 0.0 for x, _ in pts):
            pts.insert(0, (0.0, float(self.baseline)))
        self.points = pts
        self.label = self.label or self.score

    @property
    def fractions(self) -> list[float]:
        return [x for x, _ in self.points]

    @property
    def accuracies(self) -> list[float]:
        return [a for _, a in self.points]

    def max_zeroed_within(self, tol: float = TABLE2_TOLERANCE) -> float:
        return max_zeroed_within(self.points, self.baseline, tol)

    def ends_within(self, tol: float = TABLE2_TOLERANCE) -> bool:
        """Whether the curve zeroes heads and is still within ``tol`` at its largest fraction: then
        :meth:`max_zeroed_within` is that fraction, a lower bound set by the targets measured."""
        x, acc = _sorted_points(self.points)[-1]
        return x > 0 and within_tolerance(acc, self.baseline, tol)

    def auc(self, x_max: float | None = None) -> float:
        """:func:`normalized_auc`; NaN when the baseline accuracy is 0 (nothing to normalise by)."""
        return normalized_auc(self.points, self.baseline, x_max) if self.baseline > 0 else math.nan


def max_zeroed_within(curve_points: Iterable[Sequence[float]], baseline: float, tol: float = TABLE2_TOLERANCE) -> float:
    """The Table-2 metric: the largest fraction of heads zeroed whose accuracy stays within ``tol`` of ``baseline``.

    With points sorted by fraction and the line ``c = baseline - tol`` (a point with ``acc >= c`` is *within*; a
    point exactly on the line counts as within):

    * every point within (the curve never drops below the line): the largest measured fraction;
    * the last point below the line: the **last** down-crossing, i.e. between the last within point ``j`` and the
      point after it, linearly interpolated: ``x_j + (a_j - c) / (a_j - a_{j+1}) * (x_{j+1} - x_j)``; a point ``j``
      exactly on the line gives ``x_j``. Earlier dips that recover do not count, later recoveries do;
    * the last point within after a dip: the largest measured fraction (the curve ends within);
    * no point within (below the line from the first point on): 0.

    With the baseline point ``(0, baseline)`` in the curve (as in :class:`Curve`) the first point is always within,
    so a first measured point below the line gives a value interpolated between 0 and that point's fraction.
    """
    pts = _sorted_points(curve_points)
    line = float(baseline) - float(tol)
    within = [within_tolerance(a, baseline, tol) for _, a in pts]
    if not any(within):
        return 0.0
    if within[-1]:
        return pts[-1][0]
    j = max(i for i, w in enumerate(within) if w)
    (x0, a0), (x1, a1) = pts[j], pts[j + 1]
    if a0 <= line:  # on the line (within eps): no interpolation, and no division by a tiny gap
        return x0
    return x0 + (a0 - line) / (a0 - a1) * (x1 - x0)


def within_tolerance(accuracy: float, baseline: float, tol: float = TABLE2_TOLERANCE) -> bool:
    """Whether ``accuracy`` is within ``tol`` of ``baseline`` (at least ``baseline - tol``, up to float rounding)."""
    return accuracy >= float(baseline) - float(tol) - _ON_LINE_EPS


def _interp_at(pts: list[Point], x: float) -> float:
    xs = np.array([p[0] for p in pts])
    ys = np.array([p[1] for p in pts])
    return float(np.interp(x, xs, ys))  # holds the end values outside the measured range


def normalized_auc(points: Iterable[Sequence[float]], baseline: float, x_max: float | None = None) -> float:
    """Area under ``accuracy / baseline`` vs fraction zeroed over ``[0, x_max]``, divided by ``x_max``.

    1.0 means the curve stays at baseline over the whole range; 0.5 is e.g. a straight fall to zero accuracy at
    ``x_max``. ``x_max`` defaults to the largest measured fraction; pass a common one
    (:func:`common_fraction_range`) to compare score functions, whose measured fractions differ. The curve is linear
    between points (trapezoids); a missing point at 0 is taken as ``(0, baseline)``; beyond the last point the last
    accuracy is held. ``x_max = 0`` gives the accuracy ratio at 0.
    """
    pts = _sorted_points(points)
    if pts[0][0] > 0.0:
        pts.insert(0, (0.0, float(baseline)))
    if baseline <= 0:
        raise InactiveHeadsError(f"baseline accuracy must be positive, got {baseline}")
    hi = pts[-1][0] if x_max is None else float(x_max)
    if hi <= 0.0:
        return _interp_at(pts, 0.0) / baseline
    # Deduplicate equal fractions by np.interp semantics, so the area matches the interpolated curve exactly.
    inner = sorted({x for x, _ in pts if 0.0 < x < hi})
    xs = np.array([0.0, *inner, hi])
    ys = np.array([_interp_at(pts, x) for x in xs])
    area = float(np.sum((ys[1:] + ys[:-1]) * np.diff(xs)) / 2)
    return area / hi / baseline


def common_fraction_range(curves: Iterable[Curve]) -> float:
    """The largest fraction every curve that zeroes any heads reaches: the range over which their AUCs are
    comparable. A curve that zeroes nothing (e.g. a score equal for every head of a layer) does not shrink it."""
    ends = [c.points[-1][0] for c in curves if c.points[-1][0] > 0]
    return min(ends) if ends else 0.0


def rank_scores(table: Mapping[str, float], higher_is_better: bool = True) -> dict[str, float]:
    """Rank 1 = best; tied values share the mean of their ranks; NaN ranks last."""
    names = list(table)
    vals = np.array([float(table[n]) for n in names], dtype=np.float64)
    key = -vals if higher_is_better else vals
    key = np.where(np.isnan(key), np.inf, key)
    order = np.argsort(key, kind="stable")
    ranks = np.empty(len(names))
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and key[order[j + 1]] == key[order[i]]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return {n: float(r) for n, r in zip(names, ranks, strict=True)}


def spearman(rank_a: Mapping[str, float], rank_b: Mapping[str, float]) -> float:
    """Spearman correlation over the keys both rankings share (re-ranked with averaged ties); NaN if undefined."""
    common = [k for k in rank_a if k in rank_b]
    if len(common) < 2:
        return math.nan
    ra = rank_scores({k: rank_a[k] for k in common}, higher_is_better=False)
    rb = rank_scores({k: rank_b[k] for k in common}, higher_is_better=False)
    x = np.array([ra[k] for k in common]) - (len(common) + 1) / 2
    y = np.array([rb[k] for k in common]) - (len(common) + 1) / 2
    denom = math.sqrt(float(x @ x) * float(y @ y))
    return float(x @ y) / denom if denom > 0 else math.nan


def _top(rank: Mapping[str, float], keys: list[str], k: int) -> set[str]:
    ordered = sorted(rank[n] for n in keys)
    cutoff = ordered[min(k, len(ordered)) - 1]
    return {n for n in keys if rank[n] <= cutoff}  # ties at the cut are all in


def top_k_iou(rank_a: Mapping[str, float], rank_b: Mapping[str, float], k: int = 5) -> float:
    """Intersection over union of the two top-``k`` sets (over shared keys; ties at rank ``k`` all included)."""
    if k < 1:
        raise InactiveHeadsError("k must be >= 1")
    common = [n for n in rank_a if n in rank_b]
    if not common:
        return math.nan
    a, b = _top(rank_a, common, k), _top(rank_b, common, k)
    return len(a & b) / len(a | b)


def zero_frequency(zeroed: torch.Tensor | np.ndarray) -> torch.Tensor:
    """How often each head was zeroed: the mean over rows of a bool ``[N, L, H]`` mask, float32 ``[L, H]``."""
    z = torch.as_tensor(zeroed)
    if z.dim() != 3:
        raise InactiveHeadsError(f"expected a [rows, layers, heads] mask, got shape {tuple(z.shape)}")
    return z.to(torch.float32).mean(dim=0)


@dataclass(frozen=True)
class Table2Row:
    """One curve's row of Table 2 (:func:`table2`): ``max_zeroed`` is a fraction; ``lower_bound``
    (:meth:`Curve.ends_within`): the curve never left the tolerance, so ``max_zeroed`` is only the largest fraction
    measured; ``auc`` is over the table's common range (NaN for a curve that zeroes no heads); ``rank`` 1 is best."""

    score: str
    label: str
    max_zeroed: float
    lower_bound: bool
    auc: float
    rank: float


def table2(curves: Iterable[Curve], tol: float = TABLE2_TOLERANCE, x_max: float | None = None) -> list[Table2Row]:
    """One :class:`Table2Row` per curve, best first.

    Ranking is by ``max_zeroed`` (higher is better), ties broken by AUC; ``x_max`` defaults to the common range.
    A curve that zeroes no heads has no AUC over a range it never enters (NaN).
    """
    curves = list(curves)
    hi = common_fraction_range(curves) if x_max is None else x_max
    measured = [
        (c, c.max_zeroed_within(tol), c.auc(hi) if c.points[-1][0] > 0 or hi <= 0 else math.nan) for c in curves
    ]
    # AUC is < ~1.5 in practice; scaling it below 1e-6 makes it a tie-breaker only.
    ranks = rank_scores({c.score: mz + (0.0 if math.isnan(auc) else 1e-6 * auc) for c, mz, auc in measured})
    measured.sort(key=lambda m: ranks[m[0].score])
    return [Table2Row(c.score, c.label, mz, c.ends_within(tol), auc, ranks[c.score]) for c, mz, auc in measured]
