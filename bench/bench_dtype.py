"""float32 against bfloat16 on this CPU: evaluation speed under zeroing, and whether the answers change.

Per model, the GGUF file is loaded twice (de-quantised to float32 and to bfloat16) and both evaluate the same
``--limit`` items of ``--task`` (0-shot, a seeded subset) under ``--score`` at the threshold that zeroes
``--target`` of the heads on those items (recorded once, in float32, as a sweep calibrates on its evaluated items),
alternating, ``--repeats`` times, in one process. Rows go to ``bench_dtype`` in ``bench/RESULTS.md``: the median
seconds of each, the speed-up, the share of items whose chosen answer is the same, and bfloat16's accuracy minus
float32's with its paired bootstrap interval (1,000 resamples, seed 0). The CPU's bfloat16 support is printed with
the row: without ``avx512_bf16`` (or AMX) a bfloat16 matrix product has no instructions of its own and is not
expected to gain.

    python bench/bench_dtype.py --model FILE.gguf --name NAME [--limit 200] [--repeats 2]
    python bench/bench_dtype.py --quick    # the tests' tiny model on 8 items, into a temporary copy of RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _quick import tiny_dir
from _results import results_file, update_table  # bench/ is the script's directory, first on sys.path

import inactive_heads as ih
from inactive_heads.stats.bootstrap import bootstrap_difference
from inactive_heads.tasks import get_task

HEADER = [
    "model", "task", "items", "policy", "repeats", "float32 s", "bfloat16 s", "speed-up", "same answer",
    "acc float32", "acc bfloat16", "Δ acc [95%]", "CPU bf16",
]  # fmt: skip


def _cpu_bf16() -> str:
    """The CPU's bfloat16 instructions as /proc/cpuinfo names them ("none" without any)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return "unknown"
    found = sorted({f for f in flags.split() if "bf16" in f or f.startswith("amx")})
    return " ".join(found) or "none"


def _measure(spec: str, name: str, args: argparse.Namespace) -> list[str]:
    models = {dtype: ih.load_model(spec, dtype) for dtype in (torch.float32, torch.bfloat16)}
    task = get_task(args.task, args.data_dir)
    config = ih.EvalConfig(limit=args.limit, data_dir=args.data_dir, batch_size=args.batch_size)
    # Calibrated as a sweep calibrates on the evaluated items: every scored sequence, recorded in float32.
    recorded = ih.evaluate(*models[torch.float32], task, config, record=True).scores
    assert recorded is not None
    side = ih.SCORE_FUNCTIONS[args.score].inactive_when
    threshold = ih.thresholds_from_cdf(recorded[args.score], side, [args.target])[0]
    policy = ih.Policy(score=args.score, threshold=threshold)
    seconds: dict[torch.dtype, list[float]] = {d: [] for d in models}
    results = {}
    for _ in range(args.repeats):
        for dtype, (m, t) in models.items():
            start = time.perf_counter()
            results[dtype] = ih.evaluate(m, t, task, config, policy=policy)
            seconds[dtype].append(time.perf_counter() - start)
    a, b = results[torch.float32], results[torch.bfloat16]
    assert a.item_ids == b.item_ids
    right_a = np.array(a.pred) == np.array(a.gold)
    right_b = np.array(b.pred) == np.array(b.gold)
    delta = bootstrap_difference(right_b, right_a, n_resamples=1000, seed=0)
    fp32, bf16 = statistics.median(seconds[torch.float32]), statistics.median(seconds[torch.bfloat16])
    return [
        name, args.task, str(len(right_a)), f"{args.score} at {args.target:g}", str(args.repeats),
        f"{fp32:.1f}", f"{bf16:.1f}", f"{fp32 / bf16:.2f}x",
        f"{100 * float(np.mean(np.array(a.pred) == np.array(b.pred))):.1f}%",
        f"{100 * right_a.mean():.1f}", f"{100 * right_b.mean():.1f}",
        f"{100 * delta.value:+.1f} [{100 * delta.low:+.1f}, {100 * delta.high:+.1f}]", _cpu_bf16(),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a .gguf file or model directory (needed but with --quick)")
    parser.add_argument("--name", default=None, help="the model's name in RESULTS.md (default: the file's stem)")
    parser.add_argument("--task", default="piqa")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--score", default="ahon_ln")
    parser.add_argument("--target", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--data-dir", default=os.environ.get("INACTIVE_HEADS_DATA"))
    parser.add_argument("--results", type=Path, default=None, help="the results file (default: bench/RESULTS.md)")
    parser.add_argument("--quick", action="store_true", help="a smoke run on the tiny model and 8 items")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.quick:
        args.limit, args.repeats = 8, 1
        if args.model is None:
            folder = tiny_dir(Path(tempfile.mkdtemp(prefix="bench-dtype-")), max_positions=4096)  # PIQA in bytes
            args.model, args.name = str(folder), "tiny"
    if args.model is None:
        parser.error("--model is needed (a .gguf file or model directory), except with --quick")
    row = _measure(args.model, args.name or Path(args.model).stem, args)
    print(" | ".join(row), flush=True)
    update_table("bench_dtype", HEADER, [row], key=4, path=results_file(args.results, args.quick))


if __name__ == "__main__":
    main()
