"""One decoding step's attention with statistics: the grouped single-query path against copying K and V out to
every query head and calling the CPU flash kernel (the path every step took before).

A decoding step under a policy that computes statistics (``step``, ``running``, ``recompute``) runs
:func:`inactive_heads.attention.attention_with_stats` with one query per row over the whole cache. Synthetic float32
tensors in the shapes of SmolLM2-135M (9 query heads over 3 KV heads) and Qwen2.5-Coder-0.5B (14 over 2), head
dimension 64, batch 8, a left-padded mask, the raw statistics of AHON (LN) and AWFT. Both paths run in one process,
alternating, median of repeats; the table gives milliseconds per layer call and the ratio, in the
``bench_decode`` section of ``bench/RESULTS.md``.

    python bench/bench_decode.py [--lengths 256 1024 2048] [--repeats 20]
    python bench/bench_decode.py --quick     # one short cache, a few repeats, into a temporary copy of RESULTS.md
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from _results import results_file, update_table  # bench/ is the script's directory, first on sys.path

from inactive_heads.attention import attention_with_stats
from inactive_heads.kernels import lse_kernel

SHAPES = {"SmolLM2-135M": (9, 3), "Qwen2.5-Coder-0.5B": (14, 2)}
NEEDS = frozenset({"ahon", "lthon", "awft"})


def _copied(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The former path: K and V copied to every query head, the CPU flash kernel with log-sum-exp, the same
    statistics (output norms, weight on the first key)."""
    heads = q.shape[1]
    index = torch.arange(heads) // (heads // k.shape[1])
    k, v = k.index_select(1, index), v.index_select(1, index)
    kernel = lse_kernel(q.device, None)
    assert kernel is not None
    out, lse, _ = kernel.run(q, k.contiguous(), v.contiguous(), mask, False, 0.125, True, False)
    assert lse is not None
    first = torch.exp(0.125 * (q @ k[:, :, :1].transpose(-1, -2)).squeeze(-1) - lse)
    return out.norm(dim=-1) + first


def _time(fn: Callable[[], Any], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048], help="cache lengths")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="a 64-token cache, 3 repeats, into a temporary copy")
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.repeats = [64], 3
    path = results_file(args.results, args.quick)
    torch.manual_seed(0)
    rows: list[list[str]] = []
    for model, (heads, kv_heads) in SHAPES.items():
        for length in args.lengths:
            q = torch.randn(8, heads, 1, 64)
            k, v = torch.randn(8, kv_heads, length, 64), torch.randn(8, kv_heads, length, 64)
            allowed = torch.ones(8, 1, 1, length, dtype=torch.bool)
            allowed[1::2, :, :, : length // 4] = False  # every other row left-padded by a quarter
            paths = (
                partial(attention_with_stats, q, k, v, allowed, scale=0.125, needs=NEEDS),
                partial(_copied, q, k, v, allowed),
            )
            for path_fn in paths:  # warm-up: first-call allocations are not what a decoding loop pays
                path_fn()
            grouped, copied = [], []
            for _ in range(args.repeats):  # alternating, so drift in the machine's load hits both alike
                grouped += _time(paths[0], 1)
                copied += _time(paths[1], 1)
            new, old = statistics.median(grouped), statistics.median(copied)
            rows.append([model, f"{heads} / {kv_heads}", str(length), f"{1e3 * old:.2f}", f"{1e3 * new:.2f}",
                         f"{old / new:.1f}x"])  # fmt: skip
            print(" | ".join(rows[-1]), flush=True)
    header = ["shape", "query / KV heads", "cache length", "copied K, V + flash (ms)", "grouped (ms)", "speed-up"]
    update_table("bench_decode", header, rows, key=3, path=path)


if __name__ == "__main__":
    main()
