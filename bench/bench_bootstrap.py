"""What the bootstraps of a study's report cost, each against the obvious computation in the same process.

- Calibration thresholds (``ih.thresholds.resampled_thresholds``) against the thresholds of each resample's rows
  repeated by their item's count (``thresholds_from_cdf``). The threshold-stability table bootstraps every (task,
  score) of a model's calibrations 1000 times. Inputs are shaped like the study's calibrations (rows x layers x
  heads, two rows per item): continuous scores (distinct values) and scores with few distinct values (FTVVN (LN) on
  inputs that share their first token).
- W1 between two models' calibration scores (``ih.uncertainty.bootstrap_wasserstein``, paired: both read the same
  items) against ``wasserstein1`` of each resample's values repeated by their item's count. The distribution
  comparisons bootstrap every score function of every model pair, pooled and per depth bin.

Methods alternate, one torch thread, process CPU time; results are checked equal (every resample's thresholds, and
the W1 intervals).

    python bench/bench_bootstrap.py [--resamples 50] [--repeats 3]
    python bench/bench_bootstrap.py --quick          # 2 resamples, 1 repeat, into a temporary copy of RESULTS.md
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import astuple
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from _results import results_file, update_table  # bench/ is the script's directory, first on sys.path

from inactive_heads.stats.bootstrap import Interval, bootstrap_wasserstein, percentile_interval, resample_counts
from inactive_heads.stats.distances import wasserstein1
from inactive_heads.stats.thresholds import resampled_thresholds, thresholds_from_cdf

_T = TypeVar("_T")
TARGETS = [0.05, 0.10, 0.15, 0.20, 0.25, 0.30]
SHAPES = {"SmolLM2 PIQA": (400, 30, 9), "SmolLM2 ARC-Easy": (739, 30, 9), "Qwen 0.5B PIQA": (400, 24, 14)}
HEADER = ["calibration", "scores", "values", "repeated rows ms/resample", "one sort ms/resample", "speed-up"]
#: Model pairs as in the study's distribution comparisons: (rows, layers, heads) of each side, two rows per item.
W1_PAIRS = {
    "Qwen 0.5B vs 1.5B PIQA": ((400, 24, 14), (400, 28, 12)),
    "SmolLM2 vs Qwen 0.5B ARC-Easy": ((739, 30, 9), (739, 24, 14)),
}
W1_HEADER = ["model pair", "values", "repeated values ms/resample", "one sort ms/resample", "speed-up"]


def _scores(shape: tuple[int, int, int], kind: str, rng: np.random.Generator) -> np.ndarray:
    if kind == "continuous":
        return rng.gamma(2.0, size=shape).astype(np.float32)
    per_head = rng.gamma(2.0, size=shape[1:]).astype(np.float32)  # one value per head, the same on every row
    return np.broadcast_to(per_head, shape).copy()


def _repeated(scores: np.ndarray, row_items: np.ndarray, counts: np.ndarray) -> np.ndarray:
    out = []
    for c in counts:
        rows = np.repeat(scores, c[row_items], axis=0)
        out.append(thresholds_from_cdf(rows, "below", TARGETS))
    return np.asarray(out)


def _cpu(fn: Callable[[], _T]) -> tuple[float, _T]:
    t0 = time.process_time()
    out = fn()
    return time.process_time() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resamples", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results", type=Path, default=None, help="the results file (default: bench/RESULTS.md)")
    parser.add_argument("--quick", action="store_true", help="a smoke run in seconds: 2 resamples, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.resamples, args.repeats = 2, 1
    args.results = results_file(args.results, args.quick)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    rows_out = []
    for label, shape in SHAPES.items():
        row_items = np.arange(shape[0]) // 2
        counts = resample_counts(int(row_items.max()) + 1, args.resamples, 0)
        for kind in ("continuous", "few distinct"):
            scores = _scores(shape, kind, rng)
            naive, fast = [], []
            for _ in range(args.repeats):
                t, expected = _cpu(partial(_repeated, scores, row_items, counts))
                naive.append(t)
                t, got = _cpu(partial(resampled_thresholds, scores, "below", TARGETS, row_items, counts))
                fast.append(t)
                if not np.array_equal(got, expected):
                    raise AssertionError(f"{label} {kind}: the two methods disagree")
            n, f = min(naive) / args.resamples * 1e3, min(fast) / args.resamples * 1e3
            row = [label, kind, f"{scores.size:,}", f"{n:.2f}", f"{f:.2f}", f"{n / f:.1f}x"]
            print(" | ".join(row), flush=True)
            rows_out.append(row)
    update_table("bench_bootstrap", HEADER, rows_out, key=2, path=args.results)
    update_table("bench_bootstrap_w1", W1_HEADER, _w1_rows(args.resamples, args.repeats, rng), key=2, path=args.results)


def _w1_repeated(a: np.ndarray, b: np.ndarray, row_items: np.ndarray, resamples: int) -> Interval:
    samples = []
    for c in resample_counts(int(row_items.max()) + 1, resamples, 0):
        rows = np.repeat(np.arange(row_items.size), c[row_items])
        samples.append(wasserstein1(a[rows], b[rows]))
    return percentile_interval(wasserstein1(a, b), np.asarray(samples))


def _w1_rows(resamples: int, repeats: int, rng: np.random.Generator) -> list[list[str]]:
    rows_out = []
    for label, (shape_a, shape_b) in W1_PAIRS.items():
        a, b = rng.gamma(2.0, size=shape_a), rng.gamma(2.2, size=shape_b)
        row_items = np.arange(shape_a[0]) // 2
        naive, fast = [], []
        for _ in range(repeats):
            t, expected = _cpu(partial(_w1_repeated, a, b, row_items, resamples))
            naive.append(t)
            fn = partial(bootstrap_wasserstein, a, row_items, b, row_items, paired=True, n_resamples=resamples, seed=0)
            t, got = _cpu(fn)
            fast.append(t)
            if not np.allclose(astuple(got), astuple(expected), rtol=1e-9, atol=0):
                raise AssertionError(f"{label}: the two methods disagree: {got} against {expected}")
        n, f = min(naive) / resamples * 1e3, min(fast) / resamples * 1e3
        row = [label, f"{a.size + b.size:,}", f"{n:.2f}", f"{f:.2f}", f"{n / f:.1f}x"]
        print(" | ".join(row), flush=True)
        rows_out.append(row)
    return rows_out


if __name__ == "__main__":
    main()
