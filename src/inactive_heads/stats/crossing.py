"""The crossing of a (model, task, score function): the largest share of heads zeroed within a point of baseline.

Pure numpy; nothing here runs a model. A caller supplies ``evaluate(target, items) -> Answer`` (the per-item
correctness of the items asked for, with every head whose score passes the target's threshold zeroed, and the
fraction of heads that was zeroed on them) and the baseline's per-item correctness, computed once.

**Estimand.** With ``d_i = correct_i - baseline_i`` (in {-1, 0, 1}) on the same item and ``mu(x) = E[d | x]`` the
expected accuracy difference at a realised fraction ``x`` of heads zeroed, the crossing is the largest ``x`` up to
which ``mu`` stays within the tolerance, ``mu >= -tolerance`` (default one accuracy point).

**Estimator** (:func:`fit_crossing`, shared by both designs). Each probe gives a point (realised fraction, mean of
``d`` over its items). A weighted isotonic regression (non-increasing in the fraction, weights = items; probes at
the same fraction are pooled) is fitted through them, and the fit is read by linear interpolation from the exact
anchor ``(0, 0)`` (zeroing nothing changes nothing): the estimate is the first fraction where the interpolated fit
reaches ``-tolerance``. The shape constraint makes the answer unique and uses every probe, where the last crossing
of raw points jumps with each noisy point. If the fit stays within up to the largest fraction probed, ``X``, the
crossing is *censored*: ``> X``. If no probe zeroes a head, the crossing is *not applicable*: no number exists.

**Interval.** A paired bootstrap over items of the whole fit: one resample of the item pool reweights every probe
at once (probes share items; the realised fractions stay as measured) and is fitted as above. Each resample
brackets the crossing between the last fraction its fit keeps within the band (or 0) and the first it puts below;
the interval runs from the lower ``(1 - level) / 2`` quantile of the left ends to the upper one of the right ends
(both probed fractions). It thus assumes only monotonicity between probes: linear interpolation sets the point
estimate, never the interval, so a gap between probes widens it (a coarse grid cannot look more precise than its
spacing). A resample whose fit never leaves the band brackets the crossing above ``X``; where more than the upper
tail do, the upper end is the bound ``> X``. Chosen over inverting the per-probe sequential tests: those are
anytime-valid and so wider than needed once sampling has stopped, and each bounds one probe, while the bootstrap
pools the probes as the estimator does. It conditions on where the probes landed; its coverage under both designs
is measured in ``bench/bench_crossing.py`` (bench/RESULTS.md).

**Sequential test per probe.** Items are evaluated in blocks of one seeded random order of all items (every probe
reads the same order, so a probe's items are a prefix: a random sample, shared with the other probes). After each
block a two-sided empirical-Bernstein confidence sequence at level ``1 - alpha`` for the mean of ``d`` (Waudby-Smith
& Ramdas 2024, predictable plug-in, Theorem 2; bounds [-1, 1] mapped to [0, 1]) is updated; it holds at every look
at once, so the probe stops as soon as it excludes ``-tolerance``: *within* (lower end above) or *below* (upper end
below), each wrong with probability at most ``alpha / 2``. The betting weights and the centring mean are fixed per
block from earlier blocks only (predictable, so the bound stays valid). A probe still undecided at ``max_items`` is
*undecided* (it sits near the band's edge); a probe whose first block zeroes no head stops there (``no_heads``).

**Search** (:func:`search_crossing`). Probabilistic bisection (Horstein 1963; Waeber, Frazier & Henderson 2013):
a posterior over the crossing's target on a grid of step ``resolution`` up to ``max_fraction`` (plus one cell
"beyond"), uniform at first; each probe is placed at the posterior median and multiplies the mass on the side its
answer points to by ``p`` and the other side by ``1 - p``: ``p = 1 - alpha / 2`` for a decided probe, and for an
undecided one ``Phi(|mean + tolerance| / se)`` (a normal approximation, capped at ``1 - alpha / 2``) with the side
of its mean. Chosen because a wrong or uncertain answer only moves mass (plain bisection never returns to an
interval it dropped), it needs no slope of the curve (stochastic approximation's step sizes do), and with the
sequential test, probes far from the crossing cost a block or two while the probes near it run to budget. The
first probe is at ``max_fraction``: it tells censored curves and functions that zero no head apart at once. The
search stops after ``max_probes``, when the next median is a target already probed (converged to the
resolution), or when the first probe zeroes no head.

**Comparisons** (:func:`compare_crossings`). "Function A tolerates more zeroing than B" is tested on the paired
bootstrap: each resample reweights the items of every function at once and refits each crossing; the pair's p is
twice the share of resamples that do not put A's crossing above B's (a censored crossing is above only crossings
below its bound, so two censored functions are never ordered). Holm's step-down correction (Holm 1979) runs over
every pair of the functions compared; those that zero no head are left out. The Monte-Carlo error of each p is
reported; where an adjusted p lies within 5 such errors of alpha after the first resamples, many more are drawn at
once (two looks, so the stop cannot select a lucky draw), and a pair then within 3 errors is no claim either way.

**Resume.** The search is a deterministic function of the callback's answers: the ``k``-th call for a target
asks for block ``k`` of the order (``item_order(n, seed)`` split in ``block_size`` items), so a caller that stores
each answer under ``(target, k)`` and replays stored answers before evaluating anything new gets the same probes,
looks and result after a kill, without evaluating a stored block again. Targets are rounded to 12 decimals, so
they serve as keys.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from .bootstrap import DEFAULT_RESAMPLES

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_MAX_FRACTION",
    "DEFAULT_TOLERANCE",
    "Answer",
    "Comparison",
    "Crossing",
    "CrossingResult",
    "Decision",
    "Evaluate",
    "Look",
    "Probe",
    "ProbeStop",
    "SearchStop",
    "State",
    "compare_crossings",
    "confidence_sequence",
    "fit_crossing",
    "fitted_curve",
    "format_crossing",
    "grid_crossing",
    "holm",
    "item_order",
    "items_to_decide",
    "items_to_separate",
    "search_crossing",
]

DEFAULT_TOLERANCE = 0.01  # one accuracy point
DEFAULT_MAX_FRACTION = 0.9
DEFAULT_ALPHA = 0.05

Decision = Literal["within", "below", "undecided"]
ProbeStop = Literal["decided", "budget", "no_heads"]
SearchStop = Literal["converged", "max_probes", "not_applicable", "grid"]
State = Literal["estimated", "censored", "not_applicable"]

# The cap on the betting weight of the confidence sequence (the paper's c = 1/2).
_LAMBDA_CAP = 0.5
# The continuation of :func:`items_to_decide` takes its values at the multiples of the golden ratio's fractional part
# (a low-discrepancy sequence), so every block holds -1, 0 and +1 in shares close to the observed ones.
_GOLDEN = (math.sqrt(5) - 1) / 2
# A resampled probe that draws none of its items weighs this much, so its empty mean cannot move the fit.
_EMPTY_WEIGHT = 1e-12


@dataclass(frozen=True, eq=False)
class Answer:
    """``evaluate``'s reply for one block: per-item correctness (bool, the items in the order asked) and the
    fraction of heads zeroed on those items (realised, in [0, 1])."""

    correct: npt.NDArray[np.bool_]
    fraction: float


Evaluate = Callable[[float, npt.NDArray[np.int64]], Answer]


@dataclass(frozen=True)
class Look:
    """The state of a probe after one block: ``items`` evaluated so far, their realised ``fraction``, the ``mean``
    paired difference, its anytime-valid interval ``[low, high]`` and the ``decision`` it gives."""

    block: int
    items: int
    fraction: float
    mean: float
    low: float
    high: float
    decision: Decision


@dataclass(frozen=True, eq=False)
class Probe:
    """One target evaluated on a prefix of the item order: the ``items`` read, their paired ``difference``
    (cell minus baseline), every look, the final decision and why the probe stopped."""

    target: float
    fraction: float
    items: npt.NDArray[np.int64]
    difference: npt.NDArray[np.int8]
    looks: tuple[Look, ...]
    decision: Decision
    stop: ProbeStop

    @property
    def mean(self) -> float:
        return float(self.difference.mean()) if self.difference.size else math.nan


@dataclass(frozen=True)
class Crossing:
    """An estimated crossing (fractions in [0, 1]) with its ``level`` interval.

    ``censored``: ``value`` is the bound ``X`` (the crossing is above it). ``high_censored``: the interval's upper
    end is the bound ``> high``. ``not_applicable``: every number is NaN."""

    state: State
    value: float
    low: float
    high: float
    high_censored: bool
    level: float
    tolerance: float


@dataclass(frozen=True, eq=False)
class CrossingResult:
    """The crossing, every probe in the order run, and why the design stopped."""

    crossing: Crossing
    probes: tuple[Probe, ...]
    stop: SearchStop

    @property
    def items_evaluated(self) -> int:
        return sum(p.items.size for p in self.probes)


def format_crossing(crossing: Crossing, *, interval: bool = True, digits: int = 1) -> str:
    """In percent of heads: ``"12.3% [10.1, 14.0]"``, ``"12.3% [10.1, > 30.0]"``, ``"> 34.0% [28.1, > 34.0]"``,
    or ``"n/a"``; without ``interval`` the point alone (``"> 34.0%"``)."""
    if crossing.state == "not_applicable":
        return "n/a"

    def pct(v: float) -> str:
        return f"{100 * v:.{digits}f}"

    point = f"> {pct(crossing.value)}%" if crossing.state == "censored" else f"{pct(crossing.value)}%"
    if not interval:
        return point
    high = f"> {pct(crossing.high)}" if crossing.high_censored else pct(crossing.high)
    return f"{point} [{pct(crossing.low)}, {high}]"


def item_order(n_items: int, seed: int) -> npt.NDArray[np.int64]:
    """The seeded order in which every probe reads the items: any prefix is a random sample."""
    if n_items < 1:
        raise ValueError(f"need at least one item, got {n_items}")
    return np.random.default_rng(seed).permutation(n_items).astype(np.int64)


class _ConfidenceSequence:
    """The empirical-Bernstein confidence sequence for the mean of ``d`` in [-1, 1], updated block by block."""

    def __init__(self, alpha: float) -> None:
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        self.log_term = math.log(2 / alpha)
        self.t = 0
        self.sum_x = 0.0
        self.sum_dev2 = 0.0
        self.sum_lam = 0.0
        self.sum_lam_x = 0.0
        self.sum_v_psi = 0.0

    def update(self, d: npt.NDArray[np.int8]) -> tuple[float, float]:
        x = (d.astype(np.float64) + 1) / 2
        mu = (0.5 + self.sum_x) / (self.t + 1)
        var = (0.25 + self.sum_dev2) / (self.t + 1)
        lam = min(math.sqrt(2 * self.log_term / (var * (self.t + 1) * math.log(self.t + 2))), _LAMBDA_CAP)
        dev2 = float(np.sum((x - mu) ** 2))
        psi = (-math.log1p(-lam) - lam) / 4
        self.t += x.size
        self.sum_x += float(x.sum())
        self.sum_dev2 += dev2
        self.sum_lam += lam * x.size
        self.sum_lam_x += lam * float(x.sum())
        self.sum_v_psi += psi * 4 * dev2
        center = self.sum_lam_x / self.sum_lam
        half = (self.log_term + self.sum_v_psi) / self.sum_lam
        return 2 * max(0.0, center - half) - 1, 2 * min(1.0, center + half) - 1


def confidence_sequence(
    difference: Sequence[int] | npt.NDArray[np.integer], *, block_size: int, alpha: float = DEFAULT_ALPHA
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The probes' confidence sequence for the mean of ``difference`` (values in {-1, 0, 1}, in the order read),
    at the end of each block of ``block_size``: ``(low, high)``, one entry per block. With probability at least
    ``1 - alpha`` every interval of the sequence holds the mean at once."""
    d = np.asarray(difference, dtype=np.int8)
    cs = _ConfidenceSequence(alpha)
    bounds = np.array([cs.update(d[i : i + block_size]) for i in range(0, d.size, block_size)], dtype=np.float64)
    bounds = bounds.reshape(-1, 2)
    return bounds[:, 0], bounds[:, 1]


def items_to_decide(
    probe: Probe, *, tolerance: float, block_size: int, alpha: float = DEFAULT_ALPHA, limit: int = 1_000_000
) -> int | None:
    """The items after which ``probe``'s sequential test would decide, had the items beyond those it read kept the
    differences it observed: the test replayed on its own answers, then continued with blocks whose -1, 0 and +1
    are in the observed shares. A decided probe gives the items it read; None: not decided within ``limit``
    items (a mean at the tolerance's edge never is). A planning figure, no estimate: the observed mean is itself
    uncertain, and a true mean nearer the edge needs many more."""
    d = probe.difference
    if d.size == 0:
        raise ValueError("the probe read no item")
    cs = _ConfidenceSequence(alpha)
    for start in range(0, d.size, block_size):
        low, high = cs.update(d[start : start + block_size])
        if _decide(low, high, tolerance) != "undecided":
            return min(start + block_size, d.size)
    edges = np.cumsum([np.mean(d == -1), np.mean(d == 0)])
    values = np.array([-1, 0, 1], dtype=np.int8)
    for n in range(d.size, limit, block_size):
        u = ((np.arange(n, n + block_size) + 0.5) * _GOLDEN) % 1.0
        low, high = cs.update(values[np.searchsorted(edges, u, side="right")])
        if _decide(low, high, tolerance) != "undecided":
            return n + block_size
    return None


def _decide(low: float, high: float, tolerance: float) -> Decision:
    if low > -tolerance:
        return "within"
    if high < -tolerance:
        return "below"
    return "undecided"


def _baseline(baseline_correct: Sequence[bool] | npt.NDArray[np.bool_]) -> npt.NDArray[np.int8]:
    base = np.asarray(baseline_correct)
    if base.ndim != 1 or base.size == 0:
        raise ValueError(f"need the baseline's correctness as a non-empty vector, got shape {base.shape}")
    return base.astype(bool).astype(np.int8)


def _blocks(n_items: int, seed: int, block_size: int, max_items: int | None) -> list[npt.NDArray[np.int64]]:
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    budget = n_items if max_items is None else min(max_items, n_items)
    if budget < 1:
        raise ValueError(f"max_items must be positive, got {max_items}")
    order = item_order(n_items, seed)[:budget]
    return [order[i : i + block_size] for i in range(0, budget, block_size)]


def _run_probe(
    evaluate: Evaluate,
    base: npt.NDArray[np.int8],
    target: float,
    blocks: list[npt.NDArray[np.int64]],
    *,
    tolerance: float,
    alpha: float,
    sequential: bool,
) -> Probe:
    cs = _ConfidenceSequence(alpha)
    looks: list[Look] = []
    diffs: list[npt.NDArray[np.int8]] = []
    zeroed = 0.0  # realised fraction times items, summed over blocks
    n = total = 0
    stop: ProbeStop = "budget"
    for k, block in enumerate(blocks):
        answer = evaluate(target, block)
        correct = np.asarray(answer.correct)
        if correct.shape != block.shape:
            raise ValueError(f"target {target}, block {k}: {correct.shape} answers for {block.size} items")
        if not 0 <= answer.fraction <= 1:
            raise ValueError(f"target {target}, block {k}: realised fraction {answer.fraction} is not in [0, 1]")
        d = correct.astype(bool).astype(np.int8) - base[block]
        diffs.append(d)
        zeroed += answer.fraction * block.size
        low, high = cs.update(d)
        n, total = n + d.size, total + int(d.sum())
        decision = _decide(low, high, tolerance)
        looks.append(Look(k, n, zeroed / n, total / n, low, high, decision))
        if k == 0 and answer.fraction == 0:
            # Nothing zeroed: the cell is the baseline, whatever the test says after one block.
            looks[-1] = Look(k, n, 0.0, total / n, low, high, "within")
            stop = "no_heads"
            break
        if sequential and decision != "undecided":
            stop = "decided"
            break
    return Probe(
        target=target,
        fraction=looks[-1].fraction,
        items=np.concatenate(blocks[: len(looks)]),
        difference=np.concatenate(diffs),
        looks=tuple(looks),
        decision=looks[-1].decision,
        stop=stop,
    )


def _isotonic_decreasing(sums: npt.NDArray[np.float64], weights: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Weighted non-increasing least-squares fit of ``sums / weights`` along the last axis, one row per resample.

    ``fit_j = min over a <= j of max over b >= j of mean(a..b)``, the min-max form of the pool-adjacent-violators
    solution: O(k^2) per row for the few probes of a curve, and vectorised over rows."""
    k = sums.shape[-1]
    zero = np.zeros((*sums.shape[:-1], 1))
    cs = np.concatenate([zero, np.cumsum(sums, axis=-1)], axis=-1)
    cw = np.concatenate([zero, np.cumsum(weights, axis=-1)], axis=-1)
    a, b = np.triu_indices(k)
    avg = np.full((*sums.shape[:-1], k, k), -np.inf)
    avg[..., a, b] = (cs[..., b + 1] - cs[..., a]) / (cw[..., b + 1] - cw[..., a])
    # Suffix max along b: at [a, j], the max over b >= j; then min over a <= j.
    suffix = np.flip(np.maximum.accumulate(np.flip(avg, -1), axis=-1), -1)
    later_a, j = np.tril_indices(k, -1)
    suffix[..., later_a, j] = np.inf
    out: npt.NDArray[np.float64] = suffix.min(axis=-2)
    return out


def _crossings(
    fractions: npt.NDArray[np.float64], fit: npt.NDArray[np.float64], tolerance: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per row of ``fit`` (non-increasing, at ``fractions`` ascending): where the fit, linear between points from
    ``(0, 0)``, first reaches ``-tolerance``, and the bracket around it: the last fraction within (0 for the anchor)
    and the first below. A row that never leaves the band gives ``inf``, bracketed by the last fraction and ``inf``."""
    below = fit < -tolerance
    left = below.any(axis=-1)
    first = np.argmax(below, axis=-1)
    rows = np.arange(fit.shape[0])
    x1, m1 = fractions[first], fit[rows, first]
    prev = np.maximum(first - 1, 0)
    x0 = np.where(first > 0, fractions[prev], 0.0)
    m0 = np.where(first > 0, fit[rows, prev], 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        theta = x0 + (m0 + tolerance) / (m0 - m1) * (x1 - x0)
    return (
        np.where(left, theta, np.inf),
        np.where(left, x0, fractions[-1]),
        np.where(left, x1, np.inf),
    )


def fit_crossing(
    probes: Sequence[Probe],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    level: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Crossing:
    """The crossing of ``probes`` (any design, in any order) and its paired bootstrap interval (module docstring).

    Resamples draw ``n`` items with replacement from the ``n`` distinct items the probes read (seeded by ``seed``);
    a probe's resampled mean weighs each of its items by its count."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if tolerance <= 0:
        raise ValueError(f"tolerance must be positive, got {tolerance}")
    used = [p for p in probes if p.items.size]
    if not _applicable(used):
        nan = math.nan
        return Crossing("not_applicable", nan, nan, nan, False, level, tolerance)
    ids = np.unique(np.concatenate([p.items for p in used]))
    weights = np.vstack([np.ones(ids.size), _resample_counts(np.random.default_rng(seed), n_resamples, ids.size)])
    theta, last_within, first_below, bound = _fit_rows(used, ids, weights, tolerance)
    tail = (1 - level) / 2
    low = float(np.percentile(last_within[1:], 100 * tail, method="lower"))
    high = float(np.percentile(np.minimum(first_below[1:], bound), 100 * (1 - tail), method="higher"))
    # The upper quantile falls among resamples whose fit never leaves the band: the upper end is the bound "> X".
    high_censored = float(np.mean(np.isinf(first_below[1:]))) > tail
    if np.isinf(theta[0]):
        return Crossing("censored", bound, low, bound, True, level, tolerance)
    return Crossing(
        "estimated", float(theta[0]), low, bound if high_censored else high, high_censored, level, tolerance
    )


def fitted_curve(
    fractions: Sequence[float], means: Sequence[float], items: Sequence[int]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The estimator's fit through probes given by their realised fraction, mean paired difference and item count:
    the distinct fractions (ascending, from the anchor 0) and the weighted non-increasing fit there (0 at 0)."""
    xs, column = np.unique(np.asarray(fractions, dtype=np.float64), return_inverse=True)
    sums = np.zeros(xs.size)
    weights = np.zeros(xs.size)
    np.add.at(sums, column, np.asarray(means, dtype=np.float64) * np.asarray(items, dtype=np.float64))
    np.add.at(weights, column, np.asarray(items, dtype=np.float64))
    fit = _isotonic_decreasing(sums[None], np.maximum(weights, _EMPTY_WEIGHT)[None])[0]
    return np.concatenate([[0.0], xs]), np.concatenate([[0.0], fit])


def _applicable(probes: Sequence[Probe]) -> bool:
    """Whether some probe read items and zeroed a head (else the function has no crossing: not applicable)."""
    return any(p.fraction > 0 and p.items.size for p in probes)


def _resample_counts(rng: np.random.Generator, n_resamples: int, n: int) -> npt.NDArray[np.float64]:
    """[n_resamples, n]: how often each of ``n`` items is drawn by each bootstrap resample of ``n`` items."""
    draws = rng.integers(0, n, size=(n_resamples, n))
    counts = np.bincount((draws + n * np.arange(n_resamples)[:, None]).ravel(), minlength=n_resamples * n)
    return counts.reshape(n_resamples, n).astype(np.float64)


def _fit_rows(
    probes: Sequence[Probe], ids: npt.NDArray[np.int64], weights: npt.NDArray[np.float64], tolerance: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64], float]:
    """Per row of item ``weights`` (over ``ids``, a superset of the items the probes read): the fitted crossing
    (``inf``: censored), its bracket (:func:`_crossings`), and the largest fraction probed (the censoring bound)."""
    used = [p for p in probes if p.items.size]
    fractions, column = np.unique(np.array([p.fraction for p in used]), return_inverse=True)
    diff = np.zeros((ids.size, fractions.size))
    member = np.zeros((ids.size, fractions.size))
    for p, j in zip(used, column, strict=True):
        at = np.searchsorted(ids, p.items)
        np.add.at(diff[:, j], at, p.difference)
        np.add.at(member[:, j], at, 1.0)
    sums, size = weights @ diff, weights @ member
    empty = size == 0
    fit = _isotonic_decreasing(np.where(empty, 0.0, sums), np.where(empty, _EMPTY_WEIGHT, size))
    theta, last_within, first_below = _crossings(fractions, fit, tolerance)
    return theta, last_within, first_below, float(fractions[-1])


@dataclass(frozen=True)
class Comparison:
    """Whether score function ``a`` tolerates more zeroing than ``b`` (``a`` is the one most resamples favour).

    ``difference``: the crossings' difference ``a - b`` (fractions of heads; NaN when either is censored: only
    the order is known). ``share``: the resamples in which ``a``'s crossing lies above ``b``'s (a censored one
    counts as above only a crossing below its bound). ``p``: ``2 (1 - share)``, capped at 1; ``p_holm``: Holm's
    adjusted p over every pair of the family; ``mc_se``: the Monte-Carlo standard error of ``p_holm`` at
    ``resamples`` (that of ``p`` times the number of pairs, Holm's largest factor). ``stable``: ``p_holm`` is more
    than 3 Monte-Carlo errors from ``alpha`` (else the verdict could flip with the seed, and no claim is made).
    ``significant``: ``p_holm <= alpha`` and stable."""

    a: str
    b: str
    difference: float
    share: float
    p: float
    p_holm: float
    mc_se: float
    resamples: int
    stable: bool
    significant: bool


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the order given: the ``k``-th smallest times
    ``m - k + 1``, made non-decreasing, capped at 1."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def items_to_separate(c: Comparison, n_items: int, pairs: int, alpha: float = DEFAULT_ALPHA) -> int | None:
    """The items at which pair ``c`` (of a family of ``pairs`` compared on ``n_items`` items) would be called
    significant, had its crossings' difference held: with the bootstrap's spread shrinking as one over the root of
    the items, its z (the normal quantile of ``c.share``) grows to Holm's strictest cut, ``alpha / pairs``
    (two-sided). ``n_items`` for a pair already significant; None where the resamples show no direction
    (``share`` at most 1/2). A planning figure, no estimate."""
    if c.significant:
        return n_items
    if c.share <= 0.5:
        return None
    needed = statistics.NormalDist().inv_cdf(1 - alpha / (2 * pairs))
    observed = statistics.NormalDist().inv_cdf(min(c.share, 1 - 0.5 / c.resamples))  # a share of 1: its bound
    return max(n_items, math.ceil(n_items * (needed / observed) ** 2))


def compare_crossings(
    probes: Mapping[str, Sequence[Probe]],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    n_resamples: int = DEFAULT_RESAMPLES,
    max_resamples: int = 100 * DEFAULT_RESAMPLES,
    seed: int = 0,
) -> list[Comparison]:
    """Every pair of the score functions in ``probes`` (their probes on one run's items, item indices shared) that
    have a crossing, tested with one paired bootstrap over items and Holm's correction over the pairs.

    Each resample reweights the items of every function at once (the functions read the same items, so their
    crossings are compared on the same draw) and refits each crossing as :func:`fit_crossing` does. The pair's p
    is twice the share of resamples not favouring the leading function. ``n_resamples`` are drawn first; if some
    Holm-adjusted p lies within 5 Monte-Carlo errors of ``alpha``, the rest up to ``max_resamples`` are drawn, and a
    pair whose adjusted p then lies within 3 errors of ``alpha`` is reported unstable, never significant. Functions
    that zero no head are left out (not applicable: no crossing to compare). Pairs in the order of ``probes``."""
    names = [n for n, ps in probes.items() if _applicable([p for p in ps if p.items.size])]
    pairs = [(i, j) for i in range(len(names)) for j in range(i + 1, len(names))]
    if not pairs:
        return []
    used = {n: [p for p in probes[n] if p.items.size] for n in names}
    ids = np.unique(np.concatenate([p.items for ps in used.values() for p in ps]))
    point = [_fit_rows(used[n], ids, np.ones((1, ids.size)), tolerance) for n in names]
    bounds = np.array([pt[3] for pt in point])
    rng = np.random.default_rng(seed)
    above = np.zeros((len(names), len(names)))  # [i, j]: resamples with i's crossing above j's
    drawn = 0

    def draw(count: int) -> None:
        nonlocal drawn
        weights = _resample_counts(rng, count, ids.size)
        theta = np.stack([_fit_rows(used[n], ids, weights, tolerance)[0] for n in names])  # [functions, resamples]
        finite = np.isfinite(theta)
        for i, j in pairs:
            for a, b in ((i, j), (j, i)):
                # a above b: both estimated and a's higher, or a censored above a crossing of b below its bound.
                both = finite[a] & finite[b] & (theta[a] > theta[b])
                over = ~finite[a] & finite[b] & (theta[b] < bounds[a])
                above[a, b] += np.count_nonzero(both | over)
        drawn += count

    def tests() -> tuple[list[float], list[float], list[float], list[float]]:
        share = [max(above[i, j], above[j, i]) / drawn for i, j in pairs]
        p = [min(1.0, 2 * (1 - s)) for s in share]
        # The Monte-Carlo error of each p, on the adjusted scale (Holm multiplies a p by at most the pairs).
        se = [2 * len(pairs) * math.sqrt(s * (1 - s) / drawn) for s in share]
        return share, p, holm(p), se

    draw(n_resamples)
    share, p, adjusted, se = tests()
    # Two looks only, so the stop itself cannot pick a lucky draw: a wide window after the first resamples, then
    # every remaining resample at once, and the verdict's window at the end.
    if any(abs(q - alpha) <= 5 * e for q, e in zip(adjusted, se, strict=True)):
        while drawn < max_resamples:
            draw(min(n_resamples, max_resamples - drawn))
        share, p, adjusted, se = tests()
    near = [abs(q - alpha) <= 3 * e for q, e in zip(adjusted, se, strict=True)]
    out = []
    for (i, j), s, pv, q, e, close in zip(pairs, share, p, adjusted, se, near, strict=True):
        a, b = (i, j) if above[i, j] >= above[j, i] else (j, i)
        ta, tb = point[a][0][0], point[b][0][0]
        diff = float(ta - tb) if math.isfinite(ta) and math.isfinite(tb) else math.nan
        out.append(Comparison(names[a], names[b], diff, float(s), pv, q, e, drawn, not close, q <= alpha and not close))
    return out


def _targets(max_fraction: float, resolution: float) -> list[float]:
    if not 0 < max_fraction <= 1:
        raise ValueError(f"max_fraction must be in (0, 1], got {max_fraction}")
    if not 0 < resolution <= max_fraction:
        raise ValueError(f"resolution must be in (0, max_fraction], got {resolution}")
    steps = max(1, round(max_fraction / resolution))
    return [round(max_fraction * i / steps, 12) for i in range(1, steps + 1)]


def _normal_cdf(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def _response(probe: Probe, tolerance: float, alpha: float) -> tuple[bool, float]:
    """(whether the probe points above its target, the probability that it points the right way)."""
    sure = 1 - alpha / 2
    if probe.stop == "no_heads" or probe.decision != "undecided":
        return probe.decision == "within", sure
    d = probe.difference.astype(np.float64)
    gap = float(d.mean()) + tolerance
    se = float(d.std(ddof=1)) / math.sqrt(d.size) if d.size > 1 else math.inf
    p = sure if se == 0 else min(max(_normal_cdf(abs(gap) / se), 0.5), sure)
    return gap >= 0, p


def search_crossing(
    evaluate: Evaluate,
    baseline_correct: Sequence[bool] | npt.NDArray[np.bool_],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    max_fraction: float = DEFAULT_MAX_FRACTION,
    alpha: float = DEFAULT_ALPHA,
    block_size: int = 100,
    max_items: int | None = None,
    max_probes: int = 8,
    resolution: float = 0.01,
    level: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> CrossingResult:
    """The adaptive design (module docstring): probabilistic bisection over the target, a sequential test per
    probe, then :func:`fit_crossing` of every probe.

    ``baseline_correct``: the baseline's per-item correctness over all items; ``max_items``: items per probe (all
    by default); ``seed``: the item order (:func:`item_order`); the bootstrap is seeded with ``seed + 1``."""
    if max_probes < 1:
        raise ValueError(f"max_probes must be positive, got {max_probes}")
    base = _baseline(baseline_correct)
    blocks = _blocks(base.size, seed, block_size, max_items)
    targets = _targets(max_fraction, resolution)
    # mass[j]: the crossing's target lies in [targets[j-1], targets[j]) (targets[-1] = 0); mass[-1]: beyond the top.
    mass = np.full(len(targets) + 1, 1 / (len(targets) + 1))
    probes: list[Probe] = []
    probed: set[int] = set()
    at = len(targets)  # 1-based: the first probe is at max_fraction
    stop: SearchStop = "max_probes"
    while len(probes) < max_probes:
        probe = _run_probe(evaluate, base, targets[at - 1], blocks, tolerance=tolerance, alpha=alpha, sequential=True)
        probes.append(probe)
        probed.add(at)
        if probe.stop == "no_heads" and len(probes) == 1:
            stop = "not_applicable"
            break
        above, p = _response(probe, tolerance, alpha)
        mass[:at] *= 1 - p if above else p
        mass[at:] *= p if above else 1 - p
        mass /= mass.sum()
        below_target = np.cumsum(mass)[: len(targets)]  # mass below targets[i]
        at = int(np.argmin(np.abs(below_target - 0.5))) + 1
        if at in probed:
            stop = "converged"
            break
    crossing = fit_crossing(probes, tolerance=tolerance, level=level, n_resamples=n_resamples, seed=seed + 1)
    return CrossingResult(crossing, tuple(probes), stop)


def grid_crossing(
    evaluate: Evaluate,
    baseline_correct: Sequence[bool] | npt.NDArray[np.bool_],
    targets: Sequence[float],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    block_size: int = 100,
    max_items: int | None = None,
    sequential: bool = False,
    level: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> CrossingResult:
    """The fixed-grid design: a probe at every target (same blocks, looks and records as the search; with
    ``sequential``, each stops when decided) and the same :func:`fit_crossing`. For per-item answers already
    computed, pass an ``evaluate`` that looks them up. Seeds as in :func:`search_crossing`."""
    if not targets:
        raise ValueError("need at least one target")
    base = _baseline(baseline_correct)
    blocks = _blocks(base.size, seed, block_size, max_items)
    probes = tuple(
        _run_probe(evaluate, base, round(float(t), 12), blocks, tolerance=tolerance, alpha=alpha, sequential=sequential)
        for t in sorted(targets)
    )
    crossing = fit_crossing(probes, tolerance=tolerance, level=level, n_resamples=n_resamples, seed=seed + 1)
    return CrossingResult(crossing, probes, "grid")
