"""Paired bootstrap over items: intervals for accuracy differences, the Table-2 value and the rank of each score.

Every cell of a run is evaluated on the same items, so one resample of item indices is applied to all cells at
once (a *paired* bootstrap): the interval of a difference to the baseline reflects the items on which the two
differ, not the spread of either accuracy alone. A resample recomputes each curve's accuracies, hence its Table-2
value (max fraction zeroed within one point of the resampled baseline), its AUC and the ranking. The fractions of
heads zeroed stay as measured: they are a property of the policy on these items, not of which items are drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InactiveHeadsError
from .curves import TABLE2_TOLERANCE, Curve, Table2Row, table2
from .distances import wasserstein1

__all__ = [
    "Bootstrap",
    "CascadeIntervals",
    "Interval",
    "bootstrap_cascade",
    "bootstrap_difference",
    "bootstrap_run",
    "bootstrap_wasserstein",
    "independent_counts",
    "item_index",
    "percentile_interval",
    "resample_counts",
]

DEFAULT_RESAMPLES = 1000


@dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile interval."""

    value: float
    low: float
    high: float

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


@dataclass(frozen=True)
class Bootstrap:
    """Intervals for one run. ``cells[(score, fraction)]``: accuracy minus baseline accuracy; ``max_zeroed``,
    ``auc`` and ``rank`` per score (descriptive: pairs of functions are tested on their fitted crossings,
    :func:`~inactive_heads.stats.crossing.compare_crossings`)."""

    n_items: int
    n_resamples: int
    level: float
    cells: dict[tuple[str, float], Interval]
    max_zeroed: dict[str, Interval]
    auc: dict[str, Interval]
    rank: dict[str, Interval]


def resample_counts(n_items: int, n_resamples: int, seed: int) -> np.ndarray:
    """``[n_resamples, n_items]``: how often each item is drawn in each resample (items drawn with replacement)."""
    if n_items < 1 or n_resamples < 1:
        raise InactiveHeadsError(
            f"need at least one item and one resample, got {n_items} items, {n_resamples} resamples"
        )
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n_items, size=(n_resamples, n_items))
    counts = np.zeros((n_resamples, n_items), dtype=np.int32)
    np.add.at(counts, (np.arange(n_resamples)[:, None], draws), 1)
    return counts


def independent_counts(n_items: Sequence[int], n_resamples: int, seed: int) -> list[np.ndarray]:
    """:func:`resample_counts` for several samples of items drawn independently (one seed stream each)."""
    streams = np.random.SeedSequence(seed).spawn(len(n_items))
    return [resample_counts(n, n_resamples, int(s.generate_state(1)[0])) for n, s in zip(n_items, streams, strict=True)]


def percentile_interval(point: float, samples: np.ndarray, level: float = 0.95, *, observed: bool = False) -> Interval:
    """``point`` with the percentile interval of its bootstrap ``samples`` (NaN samples ignored). ``observed``: the
    ends are sample values (the wider neighbours), for discrete statistics such as ranks, where an interpolated end
    like 6.025 names no possible value."""
    tail = (1 - level) / 2 * 100
    if np.isnan(samples).all():  # e.g. an AUC, undefined when every resample has a zero baseline
        return Interval(float(point), float("nan"), float("nan"))
    if observed:
        low = np.nanpercentile(samples, tail, method="lower")
        high = np.nanpercentile(samples, 100 - tail, method="higher")
    else:
        low, high = np.nanpercentile(samples, [tail, 100 - tail])
    return Interval(float(point), float(low), float(high))


def bootstrap_difference(
    a: Sequence[bool] | np.ndarray,
    b: Sequence[bool] | np.ndarray,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> Interval:
    """Mean of ``a`` minus mean of ``b`` (per-item correctness of two evaluations of the same items, in the same
    order) with its paired bootstrap interval: one resample of items serves both."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise InactiveHeadsError(f"need two vectors over the same items, got shapes {x.shape} and {y.shape}")
    counts = resample_counts(x.shape[0], n_resamples, seed)
    return percentile_interval(float(np.mean(x - y)), counts @ (x - y) / x.shape[0], level)


@dataclass(frozen=True)
class CascadeIntervals:
    """A generative cell against its unintervened run, each with its paired bootstrap interval over items:
    ``delta`` (exact match minus the unintervened one), ``identical`` (share of outputs equal token for token) and
    the ``quartiles`` of the first token where the others diverge (over the items that diverge; NaN without any)."""

    delta: Interval
    identical: Interval
    quartiles: tuple[Interval, Interval, Interval]


def bootstrap_cascade(
    correct: Sequence[bool] | np.ndarray,
    baseline_correct: Sequence[bool] | np.ndarray,
    first_divergence: Sequence[int | None],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> CascadeIntervals:
    """:class:`CascadeIntervals` of one cell: one resample of items serves every statistic (``first_divergence``
    per item, None where the output equals the unintervened one, as
    :func:`~inactive_heads.generation.cascade` gives it)."""
    delta = np.asarray(correct, dtype=float) - np.asarray(baseline_correct, dtype=float)
    first = np.array([np.nan if k is None else float(k) for k in first_divergence])
    if delta.ndim != 1 or delta.shape != first.shape:
        raise InactiveHeadsError(f"need per-item vectors of one length, got {delta.shape} and {first.shape}")
    n = delta.shape[0]
    counts = resample_counts(n, n_resamples, seed)
    same = np.isnan(first).astype(float)
    qs = (0.25, 0.5, 0.75)

    def quartiles(weights: np.ndarray) -> list[float]:
        keep = ~np.isnan(first) & (weights > 0)
        if not keep.any():
            return [np.nan] * 3
        values = np.repeat(first[keep], weights[keep].astype(np.int64))
        return [float(v) for v in np.quantile(values, qs)]

    point = quartiles(np.ones(n))
    resampled = np.array([quartiles(c) for c in counts])
    return CascadeIntervals(
        delta=percentile_interval(float(delta.mean()), counts @ delta / n, level),
        identical=percentile_interval(float(same.mean()), counts @ same / n, level),
        quartiles=(
            percentile_interval(point[0], resampled[:, 0], level),
            percentile_interval(point[1], resampled[:, 1], level),
            percentile_interval(point[2], resampled[:, 2], level),
        ),
    )


def bootstrap_run(
    baseline: Sequence[bool] | np.ndarray,
    curves: Mapping[str, Sequence[tuple[float, Sequence[bool] | np.ndarray]]],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
    tol: float = TABLE2_TOLERANCE,
) -> Bootstrap:
    """Paired bootstrap of one run: ``baseline`` is the per-item correctness of the baseline, ``curves[score]`` the
    cells of a score as ``(fraction zeroed, per-item correctness)``, every vector over the same items in the same
    order. Table-2 values and ranks follow :func:`~inactive_heads.stats.curves.table2` on each resample."""
    if not 0 < level < 1:
        raise InactiveHeadsError(f"level must be in (0, 1), got {level}")
    base = np.asarray(baseline, dtype=float)
    names = list(curves)
    flat = [(name, frac, np.asarray(c, dtype=float)) for name in names for frac, c in curves[name]]
    for name, _, c in flat:
        if c.shape != base.shape:
            raise InactiveHeadsError(f"score {name}: {c.shape[0]} items, but the baseline has {base.shape[0]}")
    n = base.shape[0]
    counts = resample_counts(n, n_resamples, seed).astype(float)
    matrix = np.stack([base] + [c for _, _, c in flat]) if flat else base[None]
    acc = counts @ matrix.T / n  # [resamples, 1 + cells]
    point = matrix.mean(axis=1)

    def rows(accs: np.ndarray) -> list[Table2Row]:
        at, out = 1, []
        for name in names:
            pts = [(frac, float(accs[at + i])) for i, (frac, _) in enumerate(curves[name])]
            at += len(pts)
            out.append(Curve(name, pts, float(accs[0])))
        return table2(out, tol) if out else []

    def by_score(accs: np.ndarray) -> dict[str, Table2Row]:
        return {r.score: r for r in rows(accs)}

    observed = by_score(point)
    samples = [by_score(a) for a in acc]
    cells = {}
    for j, (name, frac, _) in enumerate(flat, start=1):
        cells[(name, frac)] = percentile_interval(point[j] - point[0], acc[:, j] - acc[:, 0], level)

    def metric(value: Callable[[Table2Row], float], discrete: bool = False) -> dict[str, Interval]:
        return {
            s: percentile_interval(
                value(observed[s]), np.array([value(r[s]) for r in samples]), level, observed=discrete
            )
            for s in names
        }

    max_zeroed, auc = metric(lambda r: r.max_zeroed), metric(lambda r: r.auc)
    return Bootstrap(n, n_resamples, level, cells, max_zeroed, auc, metric(lambda r: r.rank, discrete=True))


def _flat(values: np.ndarray, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values flattened per row with the item of each value; NaNs dropped."""
    values = np.asarray(values, dtype=np.float64)
    items = np.asarray(items)
    if values.ndim == 0 or values.shape[0] != items.shape[0]:
        raise InactiveHeadsError(
            f"{items.shape[0]} row items for values of shape {values.shape}; give one item per row"
        )
    per_row = values.reshape(values.shape[0], -1)
    item_of = np.broadcast_to(items[:, None], per_row.shape)
    keep = ~np.isnan(per_row)
    return per_row[keep], item_of[keep]


def item_index(row_items: Sequence[int] | np.ndarray) -> tuple[np.ndarray, int]:
    """Each row's item as ``0 .. n-1`` (the columns of :func:`resample_counts`), and ``n``."""
    ids, index = np.unique(np.asarray(row_items), return_inverse=True)
    return index.reshape(-1), ids.size


# A block of resamples, [resamples, values] in float64, holds at most 8 MB so it stays in cache; each row is
# contiguous along the cumulative sum.
_W1_BLOCK_VALUES = 2**20


def _resampled_w1(
    va: np.ndarray, da: np.ndarray, counts_a: np.ndarray, vb: np.ndarray, db: np.ndarray, counts_b: np.ndarray
) -> np.ndarray:
    """W1 between ``va`` and ``vb`` once per resample: value ``i`` of side a weighs ``counts_a[r, da[i]]``, the
    count of its item in resample ``r`` (``counts_*``: ``[resamples, items]``, :func:`resample_counts`)."""
    # W1 = sum over the merged sorted sample of |F_a - F_b| times the gap to the next value; a resample only
    # reweights the values, so one sort serves every resample.
    merged = np.concatenate([va, vb])
    order = np.argsort(merged, kind="stable")
    gaps = np.diff(merged[order])
    na = counts_a.shape[1]
    column = np.concatenate([da, db + na])[order]  # each sorted value's column of the per-item weights below
    size_a = np.bincount(da, minlength=na)  # values per item
    size_b = np.bincount(db, minlength=counts_b.shape[1])
    out = np.empty(counts_a.shape[0])
    step = max(1, _W1_BLOCK_VALUES // order.size)  # resamples per block
    for lo in range(0, counts_a.shape[0], step):
        a, b = counts_a[lo : lo + step].astype(np.float64), counts_b[lo : lo + step].astype(np.float64)
        weights = np.concatenate([a / (a @ size_a)[:, None], -b / (b @ size_b)[:, None]], axis=1)
        cdf_gap = np.take(weights, column, axis=1)  # [resamples, values]
        np.cumsum(cdf_gap, axis=1, out=cdf_gap)  # F_a - F_b at each sorted value
        np.abs(cdf_gap, out=cdf_gap)
        out[lo : lo + step] = cdf_gap[:, :-1] @ gaps
    return out


def bootstrap_wasserstein(
    values_a: np.ndarray,
    items_a: Sequence[int] | np.ndarray,
    values_b: np.ndarray,
    items_b: Sequence[int] | np.ndarray,
    *,
    paired: bool = False,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> Interval:
    """W1 between two pooled samples and its bootstrap interval over items.

    ``values_*``: ``[rows, ...]`` (e.g. one score's ``[rows, layers, heads]``), ``items_*[r]``: the item of row ``r``.
    A resample draws items with replacement and keeps every value of a drawn item as often as it is drawn, so the
    heads and choices of one input move together. ``paired``: both sides hold the same items (same ids), and one
    resample of item ids serves both, as when two models read the same inputs; otherwise each side is resampled on
    its own. W1 is never negative, so its bootstrap is biased upward where the true distance is near zero; read
    small distances against the interval's width.
    """
    if not 0 < level < 1:
        raise InactiveHeadsError(f"level must be in (0, 1), got {level}")
    va, ia = _flat(values_a, np.asarray(items_a))
    vb, ib = _flat(values_b, np.asarray(items_b))
    if va.size == 0 or vb.size == 0:
        raise InactiveHeadsError("empty sample (or all NaN)")
    point = wasserstein1(va, vb)
    if paired:
        ids, index = np.unique(np.concatenate([ia, ib]), return_inverse=True)
        if not (np.isin(ids, ia).all() and np.isin(ids, ib).all()):
            raise InactiveHeadsError("paired=True needs both sides to hold the same items")
        da, db = index[: ia.size], index[ia.size :]
        counts_a = counts_b = resample_counts(ids.size, n_resamples, seed)
    else:
        (da, na), (db, nb) = item_index(ia), item_index(ib)
        counts_a, counts_b = independent_counts([na, nb], n_resamples, seed)
    return percentile_interval(point, _resampled_w1(va, da, counts_a, vb, db, counts_b), level)
