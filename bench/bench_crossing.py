"""The crossing's designs on synthetic curves with a known crossing: coverage, bias, interval width and cost.

Each curve has a true mean paired difference ``mu(x)`` (accuracy of the cell minus baseline, on the same items) as a
function of the realised fraction ``x`` of heads zeroed, and items with realistic structure: a baseline correct on
45-75% of them; an item's systematic flip is nested across fractions (a fixed per-item fragility against ``-mu(x)``),
and on top of it a churn that flips items both ways at equal rates (so it leaves ``mu`` alone) and draws afresh at
every target. Cell and baseline then disagree on 7.5-20% of the items near the crossing. The realised fraction is the
target times a per-curve factor in [0.9, 1.1]. Shapes (``mu`` <= 0, one accuracy point = 0.01):

- ``steep``: a logistic drop of 10-30 points, 1-3% of heads wide, centred at 5-70%;
- ``smooth``: ``-0.01 (x / c)^k``, ``k`` in [1.5, 4], ``c`` in [5, 70]%;
- ``plateau``: half a point lost by 2-10%, then flat, then a logistic drop of 5-20 points at 15-70%;
- ``bumpy``: ``smooth`` plus a wave of 0.3 points (period 15%): the true curve itself is not monotone;
- ``censored``: ``smooth`` with ``c`` beyond the range searched (it never leaves the band up to 90% of heads);
- ``flat``: no effect at all.

The true crossing is where ``mu`` first drops below -1 point (on a grid of 0.01% of heads); ``censored`` and ``flat``
have none in range. Designs, each with the same estimator and 1000 bootstrap resamples (``ih.crossing``):
``adaptive`` (``search_crossing``, defaults: up to 8 probes, blocks of 100 items, alpha 0.05, up to 90%);
``grid 5-30%`` (today's six targets, every item); the same with the sequential stop (``seq``); ``grid 15-90%``
(six targets over the search range, with the sequential stop). A 95% interval covers when it holds the true
crossing; an upper end ``> X`` holds everything above ``X``, so a curve with no crossing in range is covered by an
interval whose upper end is censored.

Comparisons (``bench_crossing_comparisons``): families of three score functions searched on the same items (one
baseline; each function's losses nested in one per-item fragility, so the functions' answers are correlated as on a
real model, with churn of its own), compared pair by pair by ``compare_crossings`` (one paired bootstrap, Holm over
the three pairs, resamples raised near the cut). ``equal``: the three true curves are the same power curve, so every
claim is false; ``apart``: crossings 8 and 16 points of heads apart (power curves of one shape), so the true order is
known. Per scenario: the share of families with any false claim (a claim where the curves are equal, or one in the
wrong direction; Holm bounds it at 5%), the share of true pairs claimed (power), and the share of families whose
verdicts differ between two bootstrap seeds.

    python bench/bench_crossing.py [--curves 1200] [--families 300] [--quick]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _results import results_file, update_table  # bench/ is the script's directory, first on sys.path

from inactive_heads.stats.crossing import Answer, CrossingResult, compare_crossings, grid_crossing, search_crossing

SHAPES = ("steep", "smooth", "plateau", "bumpy", "censored", "flat")
ITEMS = (1838, 2376)  # PIQA validation, ARC-Easy test
TOL, MAX_FRACTION = 0.01, 0.9
GRID_TODAY = [0.05, 0.10, 0.15, 0.20, 0.25, 0.30]
GRID_RANGE = [0.15, 0.30, 0.45, 0.60, 0.75, 0.90]
DESIGNS: dict[str, Callable[[Callable[[float, np.ndarray], Answer], np.ndarray, int], CrossingResult]] = {
    "adaptive": lambda ev, base, seed: search_crossing(ev, base, seed=seed),
    "adaptive, 5 probes": lambda ev, base, seed: search_crossing(ev, base, max_probes=5, seed=seed),
    "grid 5-30%": lambda ev, base, seed: grid_crossing(ev, base, GRID_TODAY, seed=seed),
    "grid 5-30% seq": lambda ev, base, seed: grid_crossing(ev, base, GRID_TODAY, sequential=True, seed=seed),
    "grid 15-90% seq": lambda ev, base, seed: grid_crossing(ev, base, GRID_RANGE, sequential=True, seed=seed),
}
HEADER = [
    "design",
    "shape",
    "curves",
    "coverage %",
    "bias (pts of heads)",
    "median half-width (pts)",
    "reported > X %",
    "items per curve",
    "vs grid 5-30%",
]


def _logistic(z: float) -> float:
    return 1 / (1 + math.exp(-max(min(z, 500.0), -500.0)))


def _shape(kind: str, rng: np.random.Generator) -> Callable[[float], float]:
    """A true curve ``mu(x)``, 0 at ``x = 0``."""
    if kind == "steep":
        depth, width, centre = rng.uniform(0.1, 0.3), rng.uniform(0.01, 0.03), rng.uniform(0.05, 0.7)
        return lambda x: -depth * (_logistic((x - centre) / width) - _logistic(-centre / width))
    if kind in ("smooth", "bumpy", "censored"):
        power = rng.uniform(1.5, 4)
        scale = rng.uniform(1.05, 2.0) * MAX_FRACTION * 1.1 if kind == "censored" else rng.uniform(0.05, 0.7)
        wave = 0.003 if kind == "bumpy" else 0.0
        return lambda x: -TOL * (x / scale) ** power + wave * math.sin(2 * math.pi * x / 0.15) * min(1.0, x / 0.05)
    if kind == "plateau":
        first, drop = rng.uniform(0.02, 0.1), rng.uniform(0.05, 0.2)
        second = rng.uniform(max(0.15, first + 0.05), 0.7)
        w1, w2 = rng.uniform(0.005, 0.01), rng.uniform(0.01, 0.02)
        return lambda x: (
            -0.005 * (_logistic((x - first) / w1) - _logistic(-first / w1))
            - drop * (_logistic((x - second) / w2) - _logistic(-second / w2))
        )
    if kind == "flat":
        return lambda x: 0.0
    raise ValueError(kind)


@dataclass(frozen=True)
class Curve:
    shape: str
    evaluate: Callable[[float, np.ndarray], Answer]
    baseline: np.ndarray
    truth: float  # inf: no crossing up to the largest realised fraction
    gain: float


def _curve(shape: str, seed: int) -> Curve:
    rng = np.random.default_rng(seed)
    mu = _shape(shape, rng)
    n = int(rng.choice(ITEMS))
    p = rng.uniform(0.45, 0.75)
    churn = rng.uniform(0.065, 0.19)
    gain = rng.uniform(0.9, 1.1)
    base = rng.random(n) < p
    fragility = rng.random(n)

    def loss(x: float) -> float:
        return min(max(-mu(x), 0.0), 0.35)  # the systematic loss, capped so every rate below stays a probability

    def evaluate(target: float, items: np.ndarray) -> Answer:
        x = gain * target
        down, c = loss(x), churn * (1 - math.exp(-x / 0.03))
        fresh = np.random.default_rng([seed, round(target * 1e9), int(items[0])]).random(items.size)
        lose = (fragility[items] < down / p) | (fresh < c / (2 * p) / (1 - down / p))
        gain_ = fresh < c / (2 * (1 - p))
        return Answer(np.where(base[items], ~lose, gain_), x)

    xs = np.arange(0, round(gain * MAX_FRACTION * 1e4) + 1) / 1e4
    below = np.array([-loss(x) for x in xs]) < -TOL
    truth = float(xs[np.argmax(below)]) if below.any() else math.inf
    return Curve(shape, evaluate, base, truth, gain)


@dataclass(frozen=True)
class Outcome:
    covered: bool
    error: float  # estimate - truth; NaN where either is censored
    half_width: float  # NaN where the upper end is censored
    censored: bool
    items: int


def _outcome(result: CrossingResult, truth: float) -> Outcome:
    c = result.crossing
    high = math.inf if c.high_censored else c.high
    covered = c.low <= truth <= high
    error = c.value - truth if c.state == "estimated" and math.isfinite(truth) else math.nan
    half = (c.high - c.low) / 2 if not c.high_censored else math.nan
    return Outcome(covered, error, half, c.state == "censored", result.items_evaluated)


def _rows(outcomes: dict[tuple[str, str], list[Outcome]]) -> list[list[str]]:
    rows = []
    for design in DESIGNS:
        for shape in (*SHAPES, "all"):
            got = [o for (d, s), os in outcomes.items() if d == design and shape in (s, "all") for o in os]
            grid = [o for (d, s), os in outcomes.items() if d == "grid 5-30%" and shape in (s, "all") for o in os]
            n = len(got)
            cover = np.mean([o.covered for o in got])
            mc = math.sqrt(cover * (1 - cover) / n)
            errors = np.array([o.error for o in got])
            halves = np.array([o.half_width for o in got])
            items = np.mean([o.items for o in got])
            rows.append(
                [
                    design,
                    shape,
                    str(n),
                    f"{100 * cover:.1f} ± {100 * mc:.1f}",
                    f"{100 * np.nanmean(errors):+.2f}" if np.isfinite(errors).any() else "",
                    f"{100 * np.nanmedian(halves):.1f}" if np.isfinite(halves).any() else "",
                    f"{100 * np.mean([o.censored for o in got]):.0f}",
                    f"{items:,.0f}",
                    f"{items / np.mean([o.items for o in grid]):.2f}",
                ]
            )
    return rows


def _family(
    scenario: str, seed: int
) -> tuple[dict[str, Callable[[float, np.ndarray], Answer]], np.ndarray, list[float]]:
    """Three functions' ``evaluate`` on shared items, their baseline and their true crossings (``scenario`` above)."""
    rng = np.random.default_rng(seed)
    power, first = rng.uniform(2, 4), rng.uniform(0.1, 0.4)
    crossings = [first] * 3 if scenario == "equal" else [first, first + 0.08, first + 0.16]
    n, p = int(rng.choice(ITEMS)), rng.uniform(0.45, 0.75)
    base, fragility = rng.random(n) < p, rng.random(n)
    churns = rng.uniform(0.065, 0.19, size=3)

    def make(k: int) -> Callable[[float, np.ndarray], Answer]:
        def evaluate(target: float, items: np.ndarray) -> Answer:
            down = min(TOL * (target / crossings[k]) ** power, 0.35)
            c = churns[k] * (1 - math.exp(-target / 0.03))
            fresh = np.random.default_rng([seed, k, round(target * 1e9), int(items[0])]).random(items.size)
            lose = (fragility[items] < down / p) | (fresh < c / (2 * p) / (1 - down / p))
            return Answer(np.where(base[items], ~lose, fresh < c / (2 * (1 - p))), target)

        return evaluate

    return {f"f{k}": make(k) for k in range(3)}, base, crossings


def _comparisons(families: int) -> list[list[str]]:
    """Rows of ``bench_crossing_comparisons`` (module docstring)."""
    rows = []
    for scenario in ("equal", "apart"):
        false_claim, claimed, pairs, flipped = 0, 0, 0, 0
        for i in range(families):
            evaluates, base, truth = _family(scenario, 10_000 + i)
            probes = {name: search_crossing(ev, base, seed=i).probes for name, ev in evaluates.items()}
            verdicts = [compare_crossings(probes, seed=s) for s in (0, 1)]
            order = {f"f{k}": truth[k] for k in range(3)}
            # Claims only: which of two tied functions is listed first may change with the seed, a claim may not.
            claimed_by = [{(c.a, c.b) for c in v if c.significant} for v in verdicts]
            claims = claimed_by[0]
            false_claim += any(order[a] <= order[b] for a, b in claims)
            if scenario == "apart":
                claimed += len(claims) - sum(order[a] <= order[b] for a, b in claims)
                pairs += 3
            flipped += claimed_by[0] != claimed_by[1]
        mc = math.sqrt(max(false_claim * (families - false_claim), 1) / families**3)
        rows.append([
            scenario, str(families), f"{100 * false_claim / families:.1f} ± {100 * mc:.1f}",
            f"{100 * claimed / pairs:.1f}" if pairs else "n/a", f"{100 * flipped / families:.1f}",
        ])  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--curves", type=int, default=1200, help="synthetic curves, spread evenly over the shapes")
    parser.add_argument("--families", type=int, default=300, help="families of three functions per scenario")
    parser.add_argument("--no-curves", action="store_true", help="only the comparisons table")
    parser.add_argument("--quick", action="store_true", help="12 curves, 4 families, into a temporary copy")
    parser.add_argument("--results", type=Path, default=None, help="default: bench/RESULTS.md")
    args = parser.parse_args()
    args.results = results_file(args.results, args.quick)
    curves = 0 if args.no_curves else 12 if args.quick else args.curves
    outcomes: dict[tuple[str, str], list[Outcome]] = {}
    t0 = time.process_time()
    families = 4 if args.quick else args.families
    rows = _comparisons(families)
    print(f"{families} families per scenario, {time.process_time() - t0:.0f} s CPU")
    header = ["scenario", "families", "families with a false claim % (± MC)", "true pairs claimed %",
              "claims changed by the seed %"]  # fmt: skip
    update_table("bench_crossing_comparisons", header, rows, key=1, path=args.results)
    if not curves:
        return
    for i in range(curves):
        curve = _curve(SHAPES[i % len(SHAPES)], seed=i)
        for design, run in DESIGNS.items():
            outcomes.setdefault((design, curve.shape), []).append(
                _outcome(run(curve.evaluate, curve.baseline, i), curve.truth)
            )
    rows = _rows(outcomes)
    for row in rows:
        print(" | ".join(row))
    print(f"{curves} curves, {time.process_time() - t0:.0f} s CPU")
    update_table("bench_crossing", HEADER, rows, key=2, path=args.results)


if __name__ == "__main__":
    main()
