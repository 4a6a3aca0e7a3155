"""What the bootstrap of calibration thresholds costs: ``ih.thresholds.resampled_thresholds`` against the obvious
computation, the thresholds of each resample's rows repeated by their item's count (``thresholds_from_cdf``).

The report's threshold-stability table bootstraps every (task, score) of a model's calibrations 1000 times, so this
is most of what writing a study's report costs. Inputs are shaped like the study's calibrations (rows x layers x
heads, two rows per item): continuous scores (distinct values) and scores with few distinct values (FTVVN (LN) on
inputs that share their first token). Both methods run in this process with one torch thread, alternating, in
process CPU time; every resample's thresholds are checked equal.

    python bench/bench_bootstrap.py [--resamples 50] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch
from _results import RESULTS, update_table  # bench/ is the script's directory, first on sys.path

from inactive_heads.thresholds import resampled_thresholds, thresholds_from_cdf
from inactive_heads.uncertainty import resample_counts

TARGETS = [0.05, 0.10, 0.15, 0.20, 0.25, 0.30]
SHAPES = {"SmolLM2 PIQA": (400, 30, 9), "SmolLM2 ARC-Easy": (739, 30, 9), "Qwen 0.5B PIQA": (400, 24, 14)}
HEADER = ["calibration", "scores", "values", "repeated rows ms/resample", "one sort ms/resample", "speed-up"]


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


def _cpu(fn: Callable[[], np.ndarray]) -> tuple[float, np.ndarray]:
    t0 = time.process_time()
    out = fn()
    return time.process_time() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resamples", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
