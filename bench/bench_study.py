"""Scaling of one study across executors, and what the paper's grid would cost.

``scaling``: runs the study of ``bench/scaling.toml`` from scratch with each executor configuration (``local``;
``ray`` with 1 worker of 2 threads; ``ray`` with 2 workers of 1 thread each) into ``OUT/<config>`` and records the
wall time, cells per hour, the time spent inside evaluations (calibrations and cells, as their records say), and
the overhead: wall time minus evaluation time per worker, per cell. It also checks that every configuration
stored the same cells. A finished configuration is not run again (``OUT/results.json``); an interrupted one
starts over, so its time stays a from-scratch time.

``paper``: tokens per item of the paper's tasks (MMLU 5-shot, PIQA 0-shot, WinoGrande 5-shot) measured by
evaluating 100 items with SmolLM2 (every sequence whole, as under a zeroing policy), and SmolLM2's measured
CPU seconds per token; with ``examples/paper.toml``'s grid this gives the tokens of the whole study and a
GPU-hour estimate at an assumed sustained throughput (stated in the table).

Rows go to the ``bench_study_scaling`` and ``bench_study_paper`` tables of ``bench/RESULTS.md``.

    python bench/bench_study.py scaling [--out DIR] [--configs local ray-1x2 ray-2x1]
    python bench/bench_study.py paper
    python bench/bench_study.py --quick     # both on a tiny random model, 4 items, into a temporary copy of RESULTS.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from _quick import tiny, tiny_dir
from _results import results_file, update_table  # bench/ is the script's directory, first on sys.path

import inactive_heads as ih
from inactive_heads.atomic import atomic_write_json
from inactive_heads.runs.directory import load_run
from inactive_heads.studies.executors import RayExecutor

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {  # name -> (executor, workers per model, CPUs (= torch threads) per worker)
    "local": ("local", 1, None),
    "ray-1x2": ("ray", 1, 2.0),
    "ray-2x1": ("ray", 2, 1.0),
}
# Full evaluation sets of the paper's tasks (lm-eval's splits) and the few-shot counts it used.
PAPER_TASKS = {"mmlu": (5, 14042), "piqa": (0, 1838), "winogrande": (5, 1267)}
# Parameters of the paper's models (from their model cards), for the FLOPs of a forward.
PARAMS = {
    "Qwen/Qwen2.5-0.5B": 0.49e9,
    "Qwen/Qwen2.5-1.5B": 1.54e9,
    "Qwen/Qwen2.5-3B": 3.09e9,
    "Qwen/Qwen2.5-7B": 7.62e9,
    "Qwen/Qwen2.5-7B-Instruct": 7.62e9,
    "Qwen/Qwen2.5-14B": 14.7e9,
    "meta-llama/Llama-3.2-3B": 3.21e9,
    "meta-llama/Llama-3.2-3B-Instruct": 3.21e9,
    "meta-llama/Llama-3.1-8B": 8.03e9,
    "meta-llama/Llama-3.1-8B-Instruct": 8.03e9,
    "allenai/OLMo-2-1124-7B": 7.30e9,
    "allenai/OLMo-2-1124-7B-SFT": 7.30e9,
    "allenai/OLMo-2-1124-7B-DPO": 7.30e9,
    "allenai/OLMo-2-1124-7B-Instruct": 7.30e9,
}
# Assumed sustained dense bf16 throughput for the GPU-hour estimate: 30% of each GPU's datasheet peak.
GPUS = {"A6000": 0.3 * 154.8e12, "H100 SXM": 0.3 * 989e12}


def _cells(out: Path) -> dict[str, dict]:
    found = {}
    for run_dir in sorted((out / "runs").iterdir()):
        for key, cell in ((p.stem, json.loads(p.read_text())) for p in (run_dir / "cells").glob("*.json")):
            found[f"{run_dir.name}/{key}"] = cell
    return found


def _evaluation_seconds(out: Path) -> float:
    total = 0.0
    for run_dir in (out / "runs").iterdir():
        run = load_run(run_dir)
        total += sum(c.seconds for c in run.cells) + float(run.calibration_meta.get("seconds", 0.0))
    return total


def scaling(args: argparse.Namespace) -> None:
    study = ih.load_study(args.study)
    if args.limit:
        study = study.with_limit(args.limit)
    results_path = args.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for name in args.configs:
        executor, workers, cpus = CONFIGS[name]
        if name in results:
            continue
        out = args.out / name
        shutil.rmtree(out, ignore_errors=True)  # a from-scratch time: never resume a half-run configuration
        resources = dataclasses.replace(study.models[0].resources, workers=workers, cpus=cpus)
        spec = dataclasses.replace(
            study, models=tuple(dataclasses.replace(m, resources=resources) for m in study.models)
        )
        runner = RayExecutor(include_dashboard=False) if executor == "ray" else "local"
        result = ih.study(spec, out, executor=runner, progress=args.progress)
        evaluating = _evaluation_seconds(out)
        results[name] = {
            "wall_s": result.seconds,
            "cells": result.cells,
            "computed": result.computed,
            "calibrations": result.calibrated,
            "evaluation_s": evaluating,
            "workers": workers,
            "threads": cpus or os.cpu_count(),
            "items": max(t.limit or 0 for t in study.tasks),
            "when": time.strftime("%Y-%m-%d %H:%M"),
        }
        atomic_write_json(results_path, results)
        print(name, results[name], flush=True)

    stored = {name: _cells(args.out / name) for name in results if (args.out / name).is_dir()}
    same = None
    if len(stored) >= 2:
        strip = [{k: {f: v for f, v in c.items() if f != "seconds"} for k, c in s.items()} for s in stored.values()]
        same = all(s == strip[0] for s in strip[1:])
    local = results.get("local")
    rows = []
    for name, r in results.items():
        per_worker = r["evaluation_s"] / min(r["workers"], 2)  # at most 2 workers run at once on 2 cores
        overhead = (r["wall_s"] - per_worker) / r["cells"]
        ray_overhead = (
            "" if local is None or name == "local" else f"{(r['wall_s'] - local['wall_s']) / r['cells']:+.2f}"
        )
        rows.append(
            [
                name,
                f"{r['workers']} x {r['threads']:g}",
                f"{r.get('items', '')}",
                f"{r['cells']}",
                f"{r['wall_s'] / 60:.1f}",
                f"{3600 * r['cells'] / r['wall_s']:.0f}",
                f"{r['evaluation_s'] / (r['cells'] + r['calibrations']):.1f}",
                f"{overhead:.2f}",
                ray_overhead,
                "yes" if same else "no" if same is False else "",
                r["when"],
            ]
        )
    header = [
        "executor",
        "workers x threads",
        "items per task",
        "cells",
        "wall min",
        "cells/hour",
        "s per evaluation",
        "overhead s/cell",
        "vs local s/cell",
        "same cells",
        "measured",
    ]
    update_table("bench_study_scaling", header, rows, key=1, path=args.results)


def paper(args: argparse.Namespace) -> None:
    import torch

    from inactive_heads.loading import demo_model_path

    model, tokenizer = tiny() if args.quick else ih.load_model(demo_model_path())
    n_params = sum(p.numel() for p in model.parameters())
    grid = ih.load_study(ROOT / "examples" / "paper.toml")
    evals_per_run = grid.max_cells // (len(grid.models) * len(grid.tasks)) + 1  # cells + the calibration
    unknown = [m.name for m in grid.models if m.name not in PARAMS]
    if unknown:
        raise ValueError(f"parameter counts of {unknown} are not listed in PARAMS")
    rows = []
    for task, (shots, full) in PAPER_TASKS.items():
        torch.manual_seed(0)
        limit = 4 if args.quick else 100
        result = ih.evaluate(model, tokenizer, task, shots=shots, limit=limit, batch_size=8, share_prefix=False)
        per_item = result.timing["forward_tokens"] / result.n_items
        s_per_token = result.timing["forward_s"] / result.timing["forward_tokens"]
        tokens = per_item * full * evals_per_run
        flops = sum(2 * PARAMS[m.name] for m in grid.models) * tokens  # a forward costs about 2 FLOPs per weight
        rows.append(
            [
                f"{task} {shots}-shot",
                f"{full}",
                f"{per_item:.0f}",
                f"{1e6 * s_per_token:.0f}",
                f"{tokens * len(grid.models) / 1e9:.2f}",
                *(f"{flops / rate / 3600:.0f}" for rate in GPUS.values()),
            ]
        )
        print(rows[-1], flush=True)
    header = [
        "task",
        "items",
        "tokens per item (SmolLM2, padded)",
        f"SmolLM2 CPU µs/token ({n_params / 1e6:.0f}M)",
        f"study tokens (G, {evals_per_run} evaluations per run)",
        *(f"GPU-hours, {gpu} at 30% of peak" for gpu in GPUS),
    ]
    update_table("bench_study_paper", header, rows, key=1, path=args.results)


def _quick(args: argparse.Namespace) -> None:
    """``scaling`` on a study of the tiny model (local executor, 4 items), then ``paper`` on the tiny model."""
    root = Path(tempfile.mkdtemp(prefix="bench_study-quick-"))
    model = tiny_dir(root)
    study = root / "study.toml"
    study.write_text(
        f'name = "quick"\nscores = ["ahon_ln", "random"]\ntargets = [0.25]\n\n[[models]]\nname = "tiny"\n'
        f'spec = "{model}"\n\n[[tasks]]\nname = "recall"\nlimit = 4\n',
        encoding="utf-8",
    )
    scaling(argparse.Namespace(**vars(args), study=study, out=root / "out", configs=["local"], progress=False, limit=0))
    paper(args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=None, help="the results file (default: bench/RESULTS.md)")
    parser.add_argument("--quick", action="store_true", help="a smoke run of both on a tiny random model, 4 items")
    sub = parser.add_subparsers(dest="what")
    p = sub.add_parser("scaling")
    p.add_argument("--study", type=Path, default=ROOT / "bench" / "scaling.toml")
    p.add_argument("--out", type=Path, default=Path("/tmp/ih-bench-study"))
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--progress", action="store_true", help="show the study's progress bars")
    p.add_argument("--limit", type=int, default=0, help="items per task (0: the study file's)")
    p.set_defaults(fn=scaling)
    p = sub.add_parser("paper")
    p.set_defaults(fn=paper)
    args = parser.parse_args()
    args.results = results_file(args.results, args.quick)
    if args.quick:
        _quick(args)
    elif args.what is None:
        parser.error("choose scaling or paper (or --quick)")
    else:
        args.fn(args)


if __name__ == "__main__":
    main()
