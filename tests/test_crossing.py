"""The crossing's estimator, sequential test and search, on synthetic curves with a known crossing."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inactive_heads.stats.crossing import (
    Answer,
    Comparison,
    Crossing,
    CrossingResult,
    Probe,
    compare_crossings,
    confidence_sequence,
    fit_crossing,
    format_crossing,
    grid_crossing,
    holm,
    item_order,
    items_to_decide,
    items_to_separate,
    search_crossing,
)
from inactive_heads.stats.crossing import _isotonic_decreasing as isotonic

TOL = 0.01


def _curve(
    mu: Callable[[float], float], *, n: int = 1838, p: float = 0.6, churn: float = 0.1, seed: int = 0
) -> tuple[Callable[[float, np.ndarray], Answer], np.ndarray]:
    """``evaluate`` and the baseline of a curve with mean paired difference ``mu(x) <= 0`` at realised fraction ``x``
    (= the target): nested systematic losses, plus churn that flips both ways at equal rates (``mu`` unchanged)."""
    rng = np.random.default_rng(seed)
    base = rng.random(n) < p
    fragility = rng.random(n)

    def evaluate(target: float, items: np.ndarray) -> Answer:
        down = min(-mu(target), 0.3)
        c = churn * min(1.0, target / 0.05)
        fresh = np.random.default_rng([seed, round(target * 1e9), int(items[0])]).random(items.size)
        lose = (fragility[items] < down / p) | (fresh < c / (2 * p) / (1 - down / p))
        return Answer(np.where(base[items], ~lose, fresh < c / (2 * (1 - p))), target)

    return evaluate, base


def _power(crossing: float, k: float = 3.0) -> Callable[[float], float]:
    return lambda x: -TOL * (x / crossing) ** k


def _covers(c: Crossing, truth: float) -> bool:
    return c.low <= truth <= (math.inf if c.high_censored else c.high)


def _same(a: CrossingResult, b: CrossingResult) -> bool:
    def key(p: Probe) -> tuple[object, ...]:
        return (p.target, p.fraction, p.items.tobytes(), p.difference.tobytes(), p.looks, p.decision, p.stop)

    return a.crossing == b.crossing and a.stop == b.stop and [key(p) for p in a.probes] == [key(p) for p in b.probes]


def _probe(fraction: float, difference: np.ndarray, items: np.ndarray | None = None) -> Probe:
    d = np.asarray(difference, dtype=np.int8)
    ids = np.arange(d.size, dtype=np.int64) if items is None else items
    return Probe(fraction, fraction, ids, d, (), "undecided", "budget")


def _differences(mean: float, n: int, rng: np.random.Generator, disagree: float = 0.1) -> np.ndarray:
    down = (disagree - mean) / 2
    u = rng.random(n)
    return np.where(u < down, -1, np.where(u < disagree, 1, 0)).astype(np.int8)


# --- the confidence sequence ---------------------------------------------------------------------------------------


def _slow_cs(d: np.ndarray, block: int, alpha: float) -> list[tuple[float, float]]:
    """Waudby-Smith & Ramdas's predictable plug-in EB sequence, item by item, weights and centre fixed per block."""
    x = (d + 1) / 2
    log_term = math.log(2 / alpha)
    out, lam, centre = [], 0.0, 0.5
    num = den = var_sum = dev_sum = xsum = 0.0
    for i, xi in enumerate(x):
        if i % block == 0:
            centre = (0.5 + xsum) / (i + 1)
            sigma2 = (0.25 + dev_sum) / (i + 1)
            lam = min(math.sqrt(2 * log_term / (sigma2 * (i + 1) * math.log(i + 2))), 0.5)
        dev = (xi - centre) ** 2
        num, den = num + lam * xi, den + lam
        var_sum += 4 * dev * (-math.log(1 - lam) - lam) / 4
        dev_sum, xsum = dev_sum + dev, xsum + xi
        if (i + 1) % block == 0 or i + 1 == x.size:
            half = (log_term + var_sum) / den
            out.append((2 * max(0.0, num / den - half) - 1, 2 * min(1.0, num / den + half) - 1))
    return out


def test_confidence_sequence_matches_the_item_by_item_formula():
    d = _differences(-0.02, 730, np.random.default_rng(3))
    low, high = confidence_sequence(d, block_size=100, alpha=0.05)
    assert np.allclose(np.column_stack([low, high]), _slow_cs(d, 100, 0.05), rtol=0, atol=1e-12)
    assert np.all(np.diff(high - low) < 0)  # each block narrows it here


def test_confidence_sequence_covers_the_mean_at_every_look_at_once():
    rng = np.random.default_rng(0)
    sequences, mean, alpha = 400, -0.02, 0.05
    missed = 0
    for _ in range(sequences):
        low, high = confidence_sequence(_differences(mean, 2000, rng, 0.15), block_size=100, alpha=alpha)
        missed += bool(np.any((low > mean) | (high < mean)))
    assert missed / sequences <= alpha  # anytime-valid bounds are conservative: in practice far fewer misses


def _first_decided(d: np.ndarray, block: int) -> int | None:
    """The items read when ``confidence_sequence`` over ``d`` first excludes -TOL (None: never)."""
    low, high = confidence_sequence(d, block_size=block, alpha=0.05)
    decided = np.flatnonzero((low > -TOL) | (high < -TOL))
    return None if decided.size == 0 else min((int(decided[0]) + 1) * block, d.size)


def _exact(mean: float, n: int = 1838, disagree: float = 0.2, seed: int = 5) -> np.ndarray:
    """Differences in a seeded order with exactly the shares of ``mean`` and ``disagree`` (so the mean is known)."""
    down, up = round(n * (disagree - mean) / 2), round(n * (disagree + mean) / 2)
    d = np.array([-1] * down + [1] * up + [0] * (n - down - up), dtype=np.int8)
    return np.random.default_rng(seed).permutation(d)


@pytest.mark.parametrize("mean", [-0.03, -0.02, 0.0, 0.01])
def test_items_to_decide_continues_the_test_with_the_observed_shares(mean):
    d = _exact(mean, n=1800)
    n = items_to_decide(_probe(0.2, d), tolerance=TOL, block_size=100)
    assert _first_decided(d, 100) is None and n is not None and n > d.size  # undecided on its own items
    # Reference: the continuation written out item by item (value by where (i + 1/2) * golden ratio falls among
    # the observed shares), appended, and the test run over the whole.
    share_down, share_same = float(np.mean(d == -1)), float(np.mean(d == 0))
    golden = (math.sqrt(5) - 1) / 2
    tail = []
    for i in range(d.size, n + 10_000):
        u = ((i + 0.5) * golden) % 1.0
        tail.append(-1 if u < share_down else 0 if u < share_down + share_same else 1)
    assert _first_decided(np.concatenate([d, np.array(tail, dtype=np.int8)]), 100) == n
    # It plans for a typical continuation: random draws in the same shares decide after about as many items.
    draws = []
    for seed in range(9):
        rest = np.random.default_rng(seed).choice(
            [-1, 0, 1], size=4 * n, p=[share_down, share_same, 1 - share_down - share_same]
        )
        draws.append(_first_decided(np.concatenate([d, rest.astype(np.int8)]), 100) or 5 * n)
    assert 0.75 * n <= np.median(draws) <= 1.33 * n, (n, sorted(draws))


def test_items_to_decide_grows_as_the_mean_nears_the_tolerance():
    needs = [items_to_decide(_probe(0.2, _exact(mean)), tolerance=TOL, block_size=100) for mean in (-0.1, -0.04, 0.02)]
    assert needs[0] == _first_decided(_exact(-0.1), 100) and needs[0] <= 1838  # type: ignore[operator]
    farther = [items_to_decide(_probe(0.2, _exact(mean)), tolerance=TOL, block_size=100) for mean in (-0.025, 0.0)]
    assert needs[1] < farther[0] and needs[2] < farther[1]  # type: ignore[operator]
    at_edge = _exact(-TOL, n=1000, disagree=0.1)  # mean exactly -TOL: never decided
    assert items_to_decide(_probe(0.2, at_edge), tolerance=TOL, block_size=100, limit=50_000) is None


def _pair(share: float, significant: bool = False) -> Comparison:
    return Comparison("a", "b", 0.05, share, 2 * (1 - share), 2 * (1 - share), 0.0, 1000, True, significant)


@pytest.mark.parametrize(("delta", "sigma", "pairs"), [(0.02, 0.3, 3), (0.05, 0.4, 1), (0.01, 0.25, 10)])
def test_items_to_separate_is_the_sample_size_of_a_normal_mean(delta, sigma, pairs):
    # A difference whose bootstrap spread is sigma / sqrt(n): at n items its share is Phi(delta sqrt(n) / sigma),
    # and the n at which a two-sided test at alpha / pairs rejects is (z sigma / delta)^2.
    n = 400
    share = 0.5 * (1 + math.erf(delta * math.sqrt(n) / sigma / math.sqrt(2)))
    z = {3: 2.393980, 1: 1.959964, 10: 2.807034}[pairs]
    planned = items_to_separate(_pair(share), n, pairs)
    assert planned is not None and abs(planned - max(n, (z * sigma / delta) ** 2)) <= 1


def test_items_to_separate_needs_a_direction_and_grows_as_the_share_falls():
    assert items_to_separate(_pair(0.5), 500, 3) is None and items_to_separate(_pair(0.3), 500, 3) is None
    assert items_to_separate(_pair(0.999, significant=True), 500, 3) == 500
    needs = [items_to_separate(_pair(share), 500, 3) for share in (0.6, 0.8, 0.95, 0.995)]
    assert needs == sorted(needs, reverse=True) and needs[-1] == 500  # type: ignore[type-var]


# --- the estimator --------------------------------------------------------------------------------------------------


def _pava(values: list[float], weights: list[float]) -> list[float]:
    blocks = [[v, w, 1] for v, w in zip(values, weights, strict=True)]
    i = 0
    while i < len(blocks) - 1:
        if blocks[i][0] < blocks[i + 1][0]:  # an increase: pool
            (v1, w1, n1), (v2, w2, n2) = blocks[i], blocks[i + 1]
            blocks[i : i + 2] = [[(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2]]
            i = max(i - 1, 0)
        else:
            i += 1
    return [v for v, _, n in blocks for _ in range(int(n))]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-1, 1), st.floats(0.1, 10)), min_size=1, max_size=9))
def test_isotonic_fit_is_pool_adjacent_violators(points):
    values, weights = (list(t) for t in zip(*points, strict=True))
    got = isotonic(np.array([values]) * np.array([weights]), np.array([weights]))[0]
    assert got == pytest.approx(_pava(values, weights), abs=1e-9)


def test_point_estimate_interpolates_the_fit_from_the_anchor():
    n = 400
    flat, down = np.zeros(n), np.r_[-np.ones(8), np.zeros(n - 8)]  # means 0 and -0.02
    c = fit_crossing([_probe(0.1, flat), _probe(0.2, down)], n_resamples=200)
    assert c.state == "estimated" and c.value == pytest.approx(0.15)
    assert (c.low, c.high) == (0.1, 0.2)  # monotone-only: from the last probe within to the first below
    # A first probe already below: between the anchor (0, 0) and it.
    c = fit_crossing([_probe(0.2, down)], n_resamples=200)
    assert c.value == pytest.approx(0.1)


def test_violations_are_pooled_not_read_as_crossings():
    rng = np.random.default_rng(1)
    probes = [_probe(0.1, _differences(-0.015, 2000, rng)), _probe(0.2, _differences(0.0, 2000, rng))]
    c = fit_crossing(probes)
    # Raw points cross at 0.1 and come back; pooled, the two say about -0.75 points: within up to 0.2.
    mean = np.mean(np.concatenate([p.difference for p in probes]))
    assert (c.state == "censored") == (mean >= -TOL)


@settings(max_examples=25, deadline=None)
@given(st.permutations(range(5)), st.floats(0.2, 1.0))
def test_fit_ignores_probe_order_and_scales_with_the_fractions(order, scale):
    rng = np.random.default_rng(5)
    probes = [_probe(0.1 * (k + 1), _differences(-0.006 * k, 300, rng)) for k in range(5)]
    c = fit_crossing(probes, n_resamples=200)
    assert fit_crossing([probes[i] for i in order], n_resamples=200) == c
    scaled = fit_crossing([_probe(p.fraction * scale, p.difference) for p in probes], n_resamples=200)
    assert scaled.state == c.state
    assert (scaled.value, scaled.low, scaled.high) == pytest.approx((c.value * scale, c.low * scale, c.high * scale))


def test_no_heads_zeroed_is_not_applicable():
    c = fit_crossing([_probe(0.0, np.zeros(100))])
    assert c.state == "not_applicable" and math.isnan(c.value) and format_crossing(c) == "n/a"
    assert fit_crossing([]).state == "not_applicable"


def test_format():
    est = Crossing("estimated", 0.123, 0.101, 0.14, False, 0.95, TOL)
    assert format_crossing(est) == "12.3% [10.1, 14.0]" and format_crossing(est, interval=False) == "12.3%"
    assert format_crossing(Crossing("estimated", 0.123, 0.101, 0.3, True, 0.95, TOL)) == "12.3% [10.1, > 30.0]"
    cens = Crossing("censored", 0.34, 0.281, 0.34, True, 0.95, TOL)
    assert format_crossing(cens, interval=False) == "> 34.0%" and format_crossing(cens) == "> 34.0% [28.1, > 34.0]"


# --- the sequential test on one probe --------------------------------------------------------------------------------


def _one_probe(mu: float, churn: float) -> Probe:
    evaluate, base = _curve(lambda x: mu, churn=churn, seed=2)
    return grid_crossing(evaluate, base, [0.3], sequential=True, n_resamples=10).probes[0]


def test_a_probe_far_below_stops_within_a_few_blocks():
    probe = _one_probe(-0.2, 0.1)
    assert probe.decision == "below" and probe.stop == "decided" and len(probe.looks) <= 3
    assert [look.decision for look in probe.looks][:-1] == ["undecided"] * (len(probe.looks) - 1)


def test_a_probe_far_inside_stops_early():
    probe = _one_probe(0.0, 0.01)  # few disagreements: the mean is pinned near 0, a point above the edge
    assert probe.decision == "within" and probe.stop == "decided" and probe.items.size <= 1838 * 2 / 3


def test_a_probe_at_the_edge_runs_to_the_budget():
    probe = _one_probe(-TOL, 0.1)
    assert probe.decision == "undecided" and probe.stop == "budget" and probe.items.size == 1838
    assert [look.items for look in probe.looks] == [*range(100, 1838, 100), 1838]


def test_items_come_in_blocks_of_one_seeded_order():
    seen: list[np.ndarray] = []
    evaluate, base = _curve(_power(0.2))

    def spy(target: float, items: np.ndarray) -> Answer:
        seen.append(items)
        return evaluate(target, items)

    grid_crossing(spy, base, [0.1], block_size=300, max_items=700, seed=4, n_resamples=10)
    assert [s.size for s in seen] == [300, 300, 100]
    assert np.array_equal(np.concatenate(seen), item_order(base.size, 4)[:700])


def test_a_function_that_zeroes_no_heads_stops_after_one_block():
    evaluate, base = _curve(lambda x: 0.0)
    calls = []

    def none(target: float, items: np.ndarray) -> Answer:
        calls.append(target)
        return Answer(evaluate(target, items).correct, 0.0)

    result = search_crossing(none, base)
    assert result.stop == "not_applicable" and result.crossing.state == "not_applicable" and calls == [0.9]


def test_evaluate_must_answer_every_item():
    _, base = _curve(lambda x: 0.0)
    with pytest.raises(ValueError, match="answers for 100 items"):
        search_crossing(lambda t, items: Answer(np.ones(3, dtype=bool), t), base)


# --- the search on synthetic curves -----------------------------------------------------------------------------------


def _steep(centre: float) -> Callable[[float], float]:
    return lambda x: -0.2 / (1 + math.exp(-(x - centre) / 0.015))


def _truth(mu: Callable[[float], float]) -> float:
    xs = np.arange(0, 9001) / 1e4
    below = np.array([mu(x) for x in xs]) < -TOL
    return float(xs[np.argmax(below)]) if below.any() else math.inf


@pytest.mark.parametrize(
    ("name", "mu"),
    [
        ("steep", _steep(0.35)),
        ("smooth", _power(0.25)),
        # Half a point lost early, then flat, then the drop.
        ("plateau", lambda x: -0.005 * min(1.0, x / 0.05) - 0.15 / (1 + math.exp(-(x - 0.45) / 0.015))),
        # The true curve itself goes up and down by 0.4 points on its way down.
        ("non-monotone", lambda x: _power(0.3)(x) + 0.004 * math.sin(2 * math.pi * x / 0.12) * min(1.0, x / 0.05)),
    ],
)
def test_search_brackets_a_known_crossing(name, mu):
    evaluate, base = _curve(mu, seed=7)
    result = search_crossing(evaluate, base, seed=3)
    truth, c = _truth(mu), result.crossing
    assert c.state == "estimated" and _covers(c, truth), (name, truth, format_crossing(c))
    assert abs(c.value - truth) < 0.1
    # Probes far below the band stop early: the search costs less than its probes at full budget.
    assert any(p.stop == "decided" and p.decision == "below" for p in result.probes)
    assert result.items_evaluated < len(result.probes) * base.size


def test_a_steep_crossing_is_pinned_down():
    evaluate, base = _curve(_steep(0.2), seed=1)
    c = search_crossing(evaluate, base, seed=1).crossing
    assert c.high - c.low < 0.1 and _covers(c, _truth(_steep(0.2)))


@pytest.mark.parametrize(("name", "mu"), [("flat", lambda x: 0.0), ("beyond the range", _power(1.3))])
def test_a_curve_that_stays_in_the_band_is_censored(name, mu):
    evaluate, base = _curve(mu, seed=2)
    result = search_crossing(evaluate, base, seed=2)
    c = result.crossing
    assert c.state == "censored" and c.high_censored and c.value == max(p.fraction for p in result.probes)
    assert format_crossing(c, interval=False) == f"> {100 * c.value:.1f}%"


def test_the_grid_uses_the_same_estimator():
    evaluate, base = _curve(_steep(0.17), seed=4)
    grid = grid_crossing(evaluate, base, [0.05, 0.1, 0.15, 0.2, 0.25, 0.3], seed=4)
    assert [p.target for p in grid.probes] == [0.05, 0.1, 0.15, 0.2, 0.25, 0.3] and grid.stop == "grid"
    assert all(p.items.size == base.size for p in grid.probes)  # not sequential: every item
    assert grid.crossing == fit_crossing(grid.probes, seed=5)
    assert _covers(grid.crossing, _truth(_steep(0.17)))


# --- determinism and resume -----------------------------------------------------------------------------------------


def test_same_seed_same_result_and_the_seed_matters():
    evaluate, base = _curve(_power(0.3), seed=5)
    a, b = search_crossing(evaluate, base, seed=9), search_crossing(evaluate, base, seed=9)
    assert _same(a, b)
    assert not _same(a, search_crossing(evaluate, base, seed=10))


def test_replaying_stored_answers_resumes_after_a_kill():
    evaluate, base = _curve(_steep(0.3), seed=6)
    store: dict[tuple[float, int], Answer] = {}
    computed: list[tuple[float, int]] = []

    def caching(limit: float) -> Callable[[float, np.ndarray], Answer]:
        def call(target: float, items: np.ndarray) -> Answer:
            key = (target, int(items[0]))  # the block's first item names the block
            if key not in store:
                if len(computed) >= limit:
                    raise KeyboardInterrupt  # the kill
                computed.append(key)
                store[key] = evaluate(target, items)
            return store[key]

        return call

    whole = search_crossing(evaluate, base, seed=1)
    with pytest.raises(KeyboardInterrupt):
        search_crossing(caching(25), base, seed=1)
    assert len(store) == 25
    resumed = search_crossing(caching(math.inf), base, seed=1)
    assert _same(resumed, whole)
    assert len(computed) == len(set(computed)) == sum(len(p.looks) for p in whole.probes)  # no block twice
    # A pure replay, nothing new to evaluate, gives the same again.
    assert _same(search_crossing(caching(len(computed)), base, seed=1), whole)


# --- comparisons between score functions ---------------------------------------------------------------------------


def _slow_holm(p: list[float]) -> list[float]:
    """Holm's adjusted p by its definition: the largest (m - k + 1) p_(k) over the ranks up to the pair's, capped."""
    m = len(p)
    ranked = sorted(p)
    out = []
    for v in p:
        rank = ranked.index(v)  # ties: the first rank of the value, whose adjusted p the others share
        out.append(min(1.0, max((m - k) * ranked[k] for k in range(rank + 1))))
    return out


@given(st.lists(st.floats(0, 1), min_size=1, max_size=12))
def test_holm_matches_its_definition(p: list[float]) -> None:
    got = holm(p)
    assert got == pytest.approx(_slow_holm(p))
    assert all(a >= b for a, b in zip(got, p, strict=True))


def _grid(mu: Callable[[float], float], seed: int, targets: tuple[float, ...]) -> tuple[Probe, ...]:
    evaluate, base = _curve(mu, n=2000, seed=seed)
    return grid_crossing(evaluate, base, targets, seed=0).probes


_TARGETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)


def test_comparison_finds_a_clear_difference_and_none_between_equal_curves() -> None:
    # Items are shared (the same baseline and item order): a steep drop at 45% against one at 12%.
    late, early = _grid(_power(0.45, 8), 1, _TARGETS), _grid(_power(0.12, 8), 1, _TARGETS)
    found = compare_crossings({"early": early, "late": late, "same": late}, n_resamples=500)
    by_pair = {frozenset((c.a, c.b)): c for c in found}
    clear = by_pair[frozenset(("early", "late"))]
    assert (clear.a, clear.b, clear.significant) == ("late", "early", True)
    assert clear.difference == pytest.approx(0.33, abs=0.1)
    assert clear.p_holm <= 3 * clear.p and clear.stable
    equal = by_pair[frozenset(("late", "same"))]  # identical probes: never above each other
    assert (equal.share, equal.p, equal.significant) == (0.0, 1.0, False)


def test_comparison_leaves_out_functions_that_zero_nothing_and_orders_censored_ones() -> None:
    nothing = tuple(Probe(t, 0.0, p.items, p.difference, p.looks, p.decision, p.stop) for t, p in
                    zip(_TARGETS, _grid(lambda x: 0.0, 2, _TARGETS), strict=True))  # fmt: skip
    flat = _grid(lambda x: 0.0, 2, _TARGETS)  # censored above 60%
    early = _grid(_power(0.12, 8), 2, _TARGETS)
    found = compare_crossings({"nothing": nothing, "flat": flat, "early": early}, n_resamples=300)
    assert [(c.a, c.b) for c in found] == [("flat", "early")]
    assert found[0].significant and math.isnan(found[0].difference)  # only the order is known
    assert compare_crossings({"nothing": nothing, "flat": flat}) == []


def test_comparison_draws_more_resamples_near_the_cut() -> None:
    a, b = _grid(_power(0.30, 3), 3, _TARGETS), _grid(_power(0.29, 3), 3, _TARGETS)
    first = compare_crossings({"a": a, "b": b}, n_resamples=200, max_resamples=200)[0]
    assert first.resamples == 200
    # At an alpha equal to its p, the verdict is a coin flip of the seed: more resamples, then no claim.
    near = compare_crossings({"a": a, "b": b}, n_resamples=200, max_resamples=1000, alpha=first.p_holm)[0]
    assert near.resamples == 1000 and not near.stable and not near.significant
    assert isinstance(near, Comparison) and near.mc_se < first.mc_se


def test_comparison_verdicts_hold_across_seeds() -> None:
    late, early = _grid(_power(0.45, 8), 4, _TARGETS), _grid(_power(0.12, 8), 4, _TARGETS)
    mid = _grid(_power(0.40, 8), 4, _TARGETS)
    probes = {"early": early, "late": late, "mid": mid}
    verdicts = {
        tuple((c.a, c.b, c.significant) for c in compare_crossings(probes, seed=s, n_resamples=300)) for s in range(4)
    }
    assert len(verdicts) == 1
