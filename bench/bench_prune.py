"""What static pruning saves and costs: size, speed and memory against the unpruned model, and accuracy.

Per model: calibration scores on items disjoint from the evaluated ones (``--calibration-items`` each of PIQA and
ARC-Easy, context + gold answer), one static mask per (score, fraction) from them (``ih.static_mask``), and:

* ``speed``: for the AHON (LN) masks, parameters, prefill at S = 512 and 2048, decode at 2k and 8k context, KV-cache
  bytes and peak memory (parameters + the peak resident-set growth of a 2048-token prefill), each as a ratio to the
  unpruned model measured in the same process, the two alternating ``--repeats`` times. ``base-ih`` is the unpruned
  model on inactive-heads' attention function (which every pruned layer runs), to tell the kernel from the pruning.
* ``mask``: for every (score, fraction), parameters, KV-cache bytes and prefill speed at S = 512 (the frontier's
  x-axis), and accuracy on ``--limit`` items each of PIQA and ARC-Easy (``ih.evaluate``, 0-shot).

Speed is measured with one torch thread in process CPU time (``time.process_time``): the machine is shared, and wall
time mostly measures what share of the cores this process got. Every measured row is written at once to ``--state``
(JSON), and a restarted run skips the rows it has; ``--write`` renders the tables of ``bench/RESULTS.md`` and
``bench/prune_frontier.png`` from the state.

    python bench/bench_prune.py [--models smollm2 qwen] [--qwen-gguf FILE] [--state /tmp/bench_prune.json]
    python bench/bench_prune.py --write
    python bench/bench_prune.py --quick        # a tiny random model, 4 items, into a temporary copy of RESULTS.md
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import ctypes.util
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from _quick import tiny
from _results import results_file, update_table  # bench/ is the script's directory, first on sys.path

import inactive_heads as ih
from inactive_heads.atomic import atomic_write_bytes, atomic_write_json
from inactive_heads.loading import demo_model_path
from inactive_heads.pruning import cost as speed
from inactive_heads.pruning import pruned_mask
from inactive_heads.report.figures import figure, png
from inactive_heads.runs.directory import score_label
from inactive_heads.stats.curves import TABLE2_TOLERANCE
from inactive_heads.tasks import DATA_ENV, get_task, subset

ROOT = Path(__file__).resolve().parent.parent
TASKS = ("piqa", "arc_easy")
LABELS = {"smollm2": "SmolLM2-135M-Instruct", "qwen": "Qwen2.5-Coder-0.5B-Instruct", "tiny": "tiny random Llama"}
SPEED_SCORE = "ahon_ln"


class State:
    """Measured rows by key, saved atomically after every new row."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}

    def __contains__(self, key: str) -> bool:
        return key in self.rows

    def put(self, key: str, row: Any) -> None:
        self.rows[key] = row
        atomic_write_json(self.path, self.rows)
        print(key, json.dumps(row)[:300], flush=True)

    def all(self, keys: Mapping[str, str]) -> dict[str, Any] | None:
        """The row of each of ``keys``' values, by its key; None if one is missing."""
        found = {k: self.rows.get(key) for k, key in keys.items()}
        return None if any(row is None for row in found.values()) else found


def frontier_figure(panels: Sequence[tuple[str, float, Sequence[Mapping[str, Any]]]]) -> Any:
    """Accuracy against measured speed-up of statically pruned models, one panel per ``(title, baseline accuracy,
    points)``; a point is ``{"score", "fraction", "speedup", "accuracy"}`` and each score's points are joined in
    order of fraction. The unpruned model is the point (1, baseline)."""
    import matplotlib

    colors = matplotlib.colormaps["tab10"]
    cols = min(2, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = figure(4.6 * cols, 3.4 * rows)
    for k, (title, baseline, points) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, k + 1)
        names = list(dict.fromkeys(str(p["score"]) for p in points))
        for i, name in enumerate(names):
            mine = sorted((p for p in points if p["score"] == name), key=lambda p: float(p["fraction"]))
            xs = [1.0, *(float(p["speedup"]) for p in mine)]
            ys = [100 * baseline, *(100 * float(p["accuracy"]) for p in mine)]
            style = {"color": "black", "ls": "--"} if name == "random" else {"color": colors(i % 10)}
            ax.plot(xs, ys, marker="o", ms=3.5, lw=1.2, label=score_label(name), **style)
            for p, x, y in zip(mine, xs[1:], ys[1:], strict=True):
                ax.annotate(
                    f"{100 * float(p['fraction']):.0f}%", (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points"
                )
        ax.axhline(100 * baseline, color="grey", lw=0.8, ls=":")
        ax.axhline(100 * (baseline - TABLE2_TOLERANCE), color="grey", lw=0.8, ls=":")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("speed-up over the unpruned model (×)", fontsize=8)
        ax.set_ylabel("accuracy (%)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if k == 0:
            ax.legend(fontsize=7)
    fig.suptitle("Static pruning: accuracy against speed-up (labels: % of heads removed)", fontsize=10)
    fig.tight_layout()
    return fig


def _load(name: str, qwen_gguf: Path | None) -> tuple[Any, Any]:
    if name == "tiny":
        return tiny()
    if name == "smollm2":
        return ih.load_model(demo_model_path())
    if name == "qwen":
        if qwen_gguf is None:
            raise SystemExit("--qwen-gguf FILE is needed (../shared/MODELS.md says how to assemble it)")
        return ih.load_model(qwen_gguf)
    raise SystemExit(f"unknown model {name!r}")


def _calibration(model: Any, tok: Any, args: argparse.Namespace, path: Path) -> ih.HeadScores:
    if path.is_file():
        return ih.HeadScores.load(path)
    texts = []
    for name in TASKS:
        items = get_task(name, args.data_dir).items
        evaluated = {it.id for it in subset(items, args.limit, 0)}
        rest = [it for it in items if it.id not in evaluated]
        for it in subset(rest, args.calibration_items, 1):
            context, answer = it.answered()
            texts.append(f"{context} {answer}")
    scores = ih.record_scores(model, tok, texts, batch_size=8, max_length=256)
    scores.save(path)
    return scores


def _single_thread_cpu(fn: Any) -> Any:
    def run() -> float:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn()
        finally:
            torch.set_num_threads(threads)

    return run


def _ratios(base: list[float], other: list[float]) -> dict[str, float]:
    """Speed-up base/other (time ratio) per repeat pair: median, min, max."""
    pairs = [b / o for b, o in zip(base, other, strict=True)]
    return {"median": statistics.median(pairs), "min": min(pairs), "max": max(pairs), "base_s": statistics.median(base),
            "other_s": statistics.median(other)}  # fmt: skip


def _on_ih(model: Any, fn: Any) -> Any:
    """``fn`` with the model's own implementation switched to inactive-heads' attention function."""

    def run() -> float:
        before = model.config._attn_implementation
        model.set_attn_implementation("inactive_heads")
        try:
            return fn()
        finally:
            model.set_attn_implementation(before)

    return run


def _speed_row(model: Any, other: Any, args: argparse.Namespace, base_is_ih: bool = False) -> dict[str, Any]:
    clock = time.process_time
    row: dict[str, Any] = {}
    wrap = (lambda f: _on_ih(other, f)) if base_is_ih else (lambda f: f)
    for length in (512, 2048):
        runs = {
            "base": _single_thread_cpu(lambda m=model, s=length: speed.prefill_seconds(m, s, clock=clock)),
            "other": _single_thread_cpu(wrap(lambda m=other, s=length: speed.prefill_seconds(m, s, clock=clock))),
        }
        _single_thread_cpu(lambda: speed.prefill_seconds(model, 64))()  # warm-up
        got = speed.interleaved(runs, args.repeats, warmup=False)
        row[f"prefill_{length}"] = _ratios(got["base"], got["other"])
    for context in (2048, 8192):
        runs = {
            "base": _single_thread_cpu(lambda m=model, c=context: speed.decode_seconds(m, c, steps=6, clock=clock)),
            "other": _single_thread_cpu(
                wrap(lambda m=other, c=context: speed.decode_seconds(m, c, steps=6, clock=clock))
            ),
        }
        got = speed.interleaved(runs, args.repeats, warmup=False)
        row[f"decode_{context}"] = _ratios(got["base"], got["other"])
    peaks = {}
    for name, m in (("base", model), ("other", other)):
        fn = _single_thread_cpu(lambda m=m: speed.prefill_seconds(m, 2048))
        if base_is_ih and name == "other":
            fn = _single_thread_cpu(_on_ih(m, lambda m=m: speed.prefill_seconds(m, 2048)))
        growth = peak_rss_growth(fn)
        peaks[name] = speed.parameter_bytes(m) + (growth or 0)
    row["peak_bytes"] = peaks
    return row


def _rss_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_rss_growth(fn: Any) -> int | None:
    """Bytes by which the process's peak resident set exceeds its resident set before ``fn()`` ran (Linux only;
    None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    # Freed heap pages go back to the system first (glibc), so earlier work does not hide the peak.
    getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "malloc_trim", lambda _: None)(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM, the peak resident set, to the current one
    except OSError:
        return None
    before = _rss_kib("VmRSS")
    fn()
    peak = _rss_kib("VmHWM")
    if before is None or peak is None:
        return None
    return max(0, peak - before) * 1024


def _size_row(model: Any, other: Any) -> dict[str, Any]:
    return {
        "params": [speed.parameter_bytes(model), speed.parameter_bytes(other)],
        "kv_bytes_per_token": [speed.kv_cache_bytes(model, 1), speed.kv_cache_bytes(other, 1)],
    }


def _prefill_512(model: Any, other: Any, repeats: int) -> dict[str, float]:
    clock = time.process_time
    runs = {
        "base": _single_thread_cpu(lambda: speed.prefill_seconds(model, 512, clock=clock)),
        "other": _single_thread_cpu(lambda: speed.prefill_seconds(other, 512, clock=clock)),
    }
    got = speed.interleaved(runs, repeats, warmup=False)
    return _ratios(got["base"], got["other"])


def _accuracy(model: Any, tok: Any, task: str, args: argparse.Namespace) -> dict[str, Any]:
    result = ih.evaluate(model, tok, task, ih.EvalConfig(limit=args.limit, data_dir=args.data_dir))
    return {"acc": result.metrics["acc"], "n_items": result.n_items, "seconds": result.timing["total_s"]}


def measure(name: str, args: argparse.Namespace, state: State) -> None:
    model, tok = _load(name, args.qwen_gguf)
    cal = _calibration(model, tok, args, args.state.with_name(f"bench_prune-{name}-calibration.safetensors"))
    for task in TASKS:
        key = f"{name}/acc/{task}/base"
        if key not in state:
            state.put(key, _accuracy(model, tok, task, args))
    masks = {(score, f): ih.static_mask(cal, score=score, fraction=f) for score in args.scores for f in args.fractions}
    for (score, f), mask in masks.items():
        keys = {
            "mask": f"{name}/mask/{score}/{f}",
            **{task: f"{name}/acc/{task}/{score}/{f}" for task in TASKS},
        }
        if all(k in state for k in keys.values()):
            continue
        pruned = ih.prune_heads(copy.deepcopy(model), mask)
        assert torch.equal(pruned_mask(pruned), mask)
        if keys["mask"] not in state:
            row = {**_size_row(model, pruned), "prefill_512": _prefill_512(model, pruned, args.repeats)}
            row["removed"] = [torch.nonzero(r).flatten().tolist() for r in mask]
            state.put(keys["mask"], row)
        for task in TASKS:
            if keys[task] not in state:
                state.put(keys[task], _accuracy(pruned, tok, task, args))
        del pruned
    base_ih = f"{name}/speed/base-ih"
    if base_ih not in state:
        state.put(base_ih, _speed_row(model, model, args, base_is_ih=True))
    for f in args.fractions:
        key = f"{name}/speed/{SPEED_SCORE}/{f}"
        if key in state:
            continue
        pruned = ih.prune_heads(copy.deepcopy(model), masks[(SPEED_SCORE, f)])
        state.put(key, {**_speed_row(model, pruned, args), **_size_row(model, pruned)})
        del pruned


# ------------------------------------------------------------------------------------------------------ rendering
SPEED_HEADER = (
    "model", "pruned", "heads removed", "params", "KV cache", "peak memory", "prefill S=512", "prefill S=2048",
    "decode 2k", "decode 8k",
)  # fmt: skip
ACC_HEADER = (
    "model", "mask", "heads removed", "params", "KV cache", "prefill S=512", "PIQA acc", "Δ PIQA", "ARC-Easy acc",
    "Δ ARC-Easy",
)  # fmt: skip


def _x(r: dict[str, float]) -> str:
    """A speed-up with its spread over the repeats."""
    return f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"


def _ratio(pair: list[int]) -> str:
    return f"{pair[1] / pair[0]:.3f}"


def write(state: State, args: argparse.Namespace) -> None:
    rows, acc_rows, panels = [], [], []
    for name in args.models:
        label = LABELS[name]
        ih_row = state.rows.get(f"{name}/speed/base-ih")
        if ih_row is not None:
            rows.append(
                [label, "none, on inactive-heads attention", "0%", "1.000", "1.000",
                 _ratio([ih_row["peak_bytes"]["base"], ih_row["peak_bytes"]["other"]]),
                 *(_x(ih_row[k]) for k in ("prefill_512", "prefill_2048", "decode_2048", "decode_8192"))]
            )  # fmt: skip
        for f in args.fractions:
            row = state.rows.get(f"{name}/speed/{SPEED_SCORE}/{f}")
            if row is None:
                continue
            rows.append(
                [label, f"AHON (LN) {100 * f:.0f}%", f"{100 * f:.0f}%", _ratio(row["params"]),
                 _ratio(row["kv_bytes_per_token"]), _ratio([row["peak_bytes"]["base"], row["peak_bytes"]["other"]]),
                 *(_x(row[k]) for k in ("prefill_512", "prefill_2048", "decode_2048", "decode_8192"))]
            )  # fmt: skip
        base = state.all({t: f"{name}/acc/{t}/base" for t in TASKS})
        if base is None:
            continue
        points: dict[str, list[dict[str, Any]]] = {t: [] for t in TASKS}
        acc_rows.append([label, "none", "0%", "1.000", "1.000", "1.00x",
                         *(x for t in TASKS for x in (f"{100 * base[t]['acc']:.1f}", "–"))])  # fmt: skip
        for score in args.scores:
            for f in args.fractions:
                mask = state.rows.get(f"{name}/mask/{score}/{f}")
                accs = state.all({t: f"{name}/acc/{t}/{score}/{f}" for t in TASKS})
                if mask is None or accs is None:
                    continue
                cells = []
                for t in TASKS:
                    acc = accs[t]["acc"]
                    cells += [f"{100 * acc:.1f}", f"{100 * (acc - base[t]['acc']):+.1f}"]
                    points[t].append(
                        {"score": score, "fraction": f, "speedup": mask["prefill_512"]["median"], "accuracy": acc}
                    )
                acc_rows.append(
                    [label, ih.SCORE_FUNCTIONS[score].label, f"{100 * f:.0f}%", _ratio(mask["params"]),
                     _ratio(mask["kv_bytes_per_token"]), _x(mask["prefill_512"]), *cells]
                )  # fmt: skip
        for t in TASKS:
            n = base[t]["n_items"]
            panels.append((f"{label}: {t} ({n} items)", base[t]["acc"], points[t]))
    update_table("bench_prune_speed", SPEED_HEADER, rows, key=2, path=args.results)
    update_table("bench_prune_accuracy", ACC_HEADER, acc_rows, key=3, path=args.results)
    if panels:
        atomic_write_bytes(args.results.with_name("prune_frontier.png"), png(frontier_figure(panels)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["smollm2", "qwen"], choices=sorted(LABELS))
    parser.add_argument("--qwen-gguf", type=Path, default=None)
    parser.add_argument("--fractions", nargs="+", type=float, default=[0.1, 0.2, 0.3])
    parser.add_argument("--scores", nargs="+", default=["ahon_ln", "awft", "avvn_ln", "random"])
    parser.add_argument("--limit", type=int, default=200, help="evaluated items per task")
    parser.add_argument("--calibration-items", type=int, default=100, help="per task, disjoint from the evaluated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--data-dir", type=Path, default=Path(os.environ.get(DATA_ENV) or ROOT.parent / "shared" / "data")
    )
    parser.add_argument("--state", type=Path, default=Path("/tmp/bench_prune.json"))
    parser.add_argument("--results", type=Path, default=None, help="the results file (default: bench/RESULTS.md)")
    parser.add_argument("--write", action="store_true", help="only render RESULTS.md and the figure from --state")
    parser.add_argument("--quick", action="store_true", help="a smoke run: a tiny random model, one mask, 4 items")
    args = parser.parse_args()
    if args.quick:
        args.models, args.fractions, args.scores = ["tiny"], [0.25], ["ahon_ln", "random"]
        args.limit, args.calibration_items, args.repeats = 4, 4, 1
        args.state = Path(tempfile.mkdtemp(prefix="bench_prune-quick-")) / "state.json"
    args.results = results_file(args.results, args.quick)
    state = State(args.state)
    if not args.write:
        for name in args.models:
            measure(name, args, state)
    write(state, args)


if __name__ == "__main__":
    main()
