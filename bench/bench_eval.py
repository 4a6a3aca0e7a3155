"""Items/second, work and accuracy of ``inactive_heads.evaluate`` beside lm-evaluation-harness's HFLM: same model
object, task and items.

The lm-eval side (its default task files on exactly our items) is ``tests/_lm_eval.py``, shared with the parity
test. Each measured row goes into its section of ``bench/RESULTS.md`` at once (``bench_eval_speed``,
``bench_eval_work`` and ``bench_eval_accuracy``), replacing the row of the same model, task and items. A task is
``name`` (its default shots: 5 for MMLU, else 0) or ``name:shots``.

    python bench/bench_eval.py --repeats 3                                     # every built-in task, alternating
    python bench/bench_eval.py --tasks winogrande:5 --repeats 3 --limit 100    # one task
    python bench/bench_eval.py --tasks --full piqa arc_easy --mmlu-limit 200   # accuracy runs, ours beside lm-eval
    python bench/bench_eval.py --quick     # speed and accuracy on 4 PIQA items, into a temporary copy of RESULTS.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the lm-eval side lives with the parity test; bench/ is already first

from _lm_eval import SHORT_MMLU_SUBJECTS, run_lm_eval  # noqa: E402
from _results import read_table, results_file, update_table  # noqa: E402
from _work import Work, minimal_work  # noqa: E402

from inactive_heads.tasks import DATA_ENV  # noqa: E402

SPEED_HEADER = (
    "model", "task", "items", "ours bs", "lm-eval bs", "repeats", "ours s", "ours items/s", "lm-eval s",
    "lm-eval items/s", "speed-up", "max abs Δll", "acc ours / lm-eval",
)  # fmt: skip
WORK_HEADER = (
    "model", "task", "items", "tokens lm-eval", "tokens ours", "tokens min", "head rows lm-eval", "head rows ours",
    "head rows min", "TFLOP lm-eval", "TFLOP ours", "TFLOP min", "FLOP ratio", "bound", "speed-up",
    "speed-up / bound",
)  # fmt: skip
#: Every built-in benchmark task with its shots (``recall`` has no lm-eval counterpart).
ALL_TASKS = ("mmlu", "piqa", "arc_easy", "arc_challenge", "winogrande", "winogrande:5", "hellaswag", "boolq")
ACCURACY_HEADER = (
    "model", "run", "items", "ours bs", "lm-eval bs", "ours acc", "ours acc_norm", "ours s", "lm-eval acc",
    "lm-eval acc_norm", "lm-eval s", "max abs Δll",
)  # fmt: skip


def _smollm2() -> tuple[Any, Any]:
    from inactive_heads.loading import demo_model_path, load_model

    return load_model(demo_model_path())


def _max_delta(ours: dict[str, list[float]], theirs: dict[str, list[float]]) -> str:
    """Largest per-choice log-likelihood difference; "–" unless both sides scored the same items."""
    if set(ours) != set(theirs):
        return "–"
    return f"{max(abs(a - b) for iid, row in ours.items() for a, b in zip(row, theirs[iid], strict=True)):.1e}"


def _lls(result: Any) -> dict[str, list[float]]:
    return dict(zip(result.item_ids, result.loglikelihoods, strict=True))


def _load_lls(path: Path) -> dict[str, list[float]]:
    """Per-item log-likelihoods an earlier half of a split accuracy run saved (empty when there is none)."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _metric(metrics: dict[str, float], name: str) -> str:
    return f"{metrics[name]:.4f}" if name in metrics else "–"


def _task_shots(spec: str) -> tuple[str, int]:
    """``name`` or ``name:shots``; a bare name takes the task's lm-eval default (5 for MMLU, else 0)."""
    name, _, shots = spec.partition(":")
    return name, int(shots) if shots else (5 if name == "mmlu" else 0)


def _work_row(
    model: Any, label: str, n: int, ref: Work, ours: Work, least: Work, speed_up: float, spread: str
) -> list[str]:
    """A row of the work table: counts and FLOPs of each tool and of the least exact evaluation, the FLOP ratio
    lm-eval / ours, the bound lm-eval / least, and the measured speed-up against that bound."""
    flops = [w.flops(model) for w in (ref, ours, least)]
    bound = flops[0] / flops[2]
    return [
        *(label, str(n)),
        *(str(w.tokens) for w in (ref, ours, least)),
        *(str(w.head_rows) for w in (ref, ours, least)),
        *(f"{f / 1e12:.2f}" for f in flops),
        f"{flops[0] / flops[1]:.2f}x",
        f"{bound:.2f}x",
        f"{speed_up:.2f}x{spread}",
        f"{speed_up / bound:.2f}",
    ]


def main() -> None:
    from inactive_heads.evaluation import evaluate
    from inactive_heads.tasks import get_task, subset

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--tasks",
        nargs="*",
        default=list(ALL_TASKS),
        help="speed comparison tasks, NAME or NAME:SHOTS (default: every built-in task)",
    )
    ap.add_argument("--limit", type=int, default=100, help="speed runs: items per task (0: all)")
    ap.add_argument(
        "--mmlu-subjects",
        nargs="*",
        default=list(SHORT_MMLU_SUBJECTS),
        help="speed run of mmlu on these subjects only (none: all 57)",
    )
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument(
        "--lm-eval-batch-size",
        type=int,
        nargs="*",
        default=None,
        help="lm-eval batch sizes to time (default: the same as ours); accuracy runs use the first",
    )
    ap.add_argument(
        "--full", nargs="*", default=[], help="accuracy runs over the full task (ours and lm-eval), NAME[:SHOTS]"
    )
    ap.add_argument("--full-limit", type=int, default=None, help="accuracy runs of --full: this many items each")
    ap.add_argument("--mmlu-limit", type=int, default=0, help="accuracy run of mmlu 5-shot on this many items")
    ap.add_argument("--skip-lm-eval", action="store_true", help="accuracy runs: ours only")
    ap.add_argument(
        "--lm-eval-only",
        action="store_true",
        help="accuracy runs: lm-eval only (the other half of a --skip-lm-eval run with the same --out)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="speed runs: alternate ours and lm-eval this many times; median times and ratio",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="speed runs: skip a task whose work row (same model, task, items) is already in the results file",
    )
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument(
        "--model",
        default=None,
        help="a .gguf file, HF directory or id for load_model (default: the SmolLM2 package's GGUF)",
    )
    ap.add_argument("--model-label", default=None, help="the model's name in RESULTS.md (default: from --model)")
    ap.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get(DATA_ENV) or ROOT.parent / "shared" / "data"),
        help=f"benchmark files (default: ${DATA_ENV}, else ../shared/data beside the checkout)",
    )
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_eval"), help="lm-eval task files, per-item results")
    ap.add_argument("--results", type=Path, default=None, help="the results file (default: bench/RESULTS.md)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: speed and accuracy on 4 PIQA items")
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.limit, args.batch_size, args.repeats = ["piqa"], 4, 4, 1
        args.full, args.full_limit, args.mmlu_limit, args.lm_eval_batch_size = ["piqa"], 4, 0, None
        args.out = Path(tempfile.mkdtemp(prefix="bench_eval-quick-"))
    args.results = results_file(args.results, args.quick)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model is None:
        model, tok = _smollm2()
        model_label = args.model_label or "SmolLM2-135M-Instruct"
    else:
        from inactive_heads.loading import load_model

        model, tok = load_model(args.model)
        model_label = args.model_label or Path(args.model).name
    data = args.data_dir

    from inactive_heads.evaluation.requests import token_sequences

    if args.tasks:
        import lm_eval.models.huggingface  # noqa: F401  (imported before the first timed lm-eval run)

    done = {tuple(row[:3]) for row in read_table("bench_eval_work", args.results)[1]} if args.resume else set()
    for spec in args.tasks:
        task, shots = _task_shots(spec)
        task_obj = get_task(task, data)
        label = f"{task} {shots}-shot"
        if task == "mmlu" and args.mmlu_subjects:
            task_obj = dataclasses.replace(task_obj, items=[x for x in task_obj.items if x.group in args.mmlu_subjects])
            label += f", {len(args.mmlu_subjects)} subjects"
        items = subset(task_obj.items, args.limit or None)
        label += f", {'full' if len(items) == len(task_obj.items) else 'stratified'}"
        if (model_label, label, str(len(items))) in done:
            print(f"{label}: already measured, skipped", flush=True)
            continue
        evaluate(model, tok, task_obj, shots=shots, limit=8, batch_size=args.batch_size)  # warm-up, untimed
        least = minimal_work(token_sequences(model, tok, task_obj, items, shots))
        for lbs in args.lm_eval_batch_size or [args.batch_size]:
            # Ours and lm-eval alternate, so a drift in this shared machine's speed hits both sides alike.
            t_ours, t_ref = [], []
            for _ in range(args.repeats):
                with Work().count(model) as work_ours:
                    ours = evaluate(
                        model, tok, task_obj, shots=shots, limit=args.limit or None, batch_size=args.batch_size
                    )
                with Work().count(model) as work_ref:
                    ref = run_lm_eval(
                        model,
                        tok,
                        task,
                        ours.item_ids,
                        args.out / f"{task}_{shots}_{lbs}",
                        data=data,
                        shots=shots,
                        batch_size=lbs,
                    )
                t_ours.append(ours.timing["total_s"])
                t_ref.append(ref["wall_s"])
            ratios = sorted(r / o for o, r in zip(t_ours, t_ref, strict=True))
            spread = f" ({ratios[0]:.2f}-{ratios[-1]:.2f})" if len(ratios) > 1 else ""
            t_o, t_r = statistics.median(t_ours), statistics.median(t_ref)
            n = ours.n_items
            row = [
                model_label,
                label,
                str(n),
                str(args.batch_size),
                str(lbs),
                str(args.repeats),
                f"{t_o:.1f}",
                f"{n / t_o:.2f}",
                f"{t_r:.1f}",
                f"{n / t_r:.2f}",
                f"{statistics.median(ratios):.2f}x{spread}",
                _max_delta(_lls(ours), ref["loglikelihoods"]),
                f"{ours.metrics['acc']:.3f} / {ref['metrics']['acc']:.3f}",
            ]
            print(" | ".join(row), flush=True)
            # Each row is written at once, so an interrupted run keeps what it measured.
            update_table("bench_eval_speed", SPEED_HEADER, [row], key=5, path=args.results)
            work = _work_row(model, label, n, work_ref, work_ours, least, statistics.median(ratios), spread)
            print(" | ".join(work), flush=True)
            update_table("bench_eval_work", WORK_HEADER, [[model_label, *work]], key=3, path=args.results)

    runs = [(*_task_shots(t), args.full_limit) for t in args.full]
    runs += [("mmlu", 5, args.mmlu_limit)] if args.mmlu_limit else []
    # lm-eval keeps [batch, length, vocab] log-probs: Qwen's 152k vocabulary needs 24 GB for 5-shot MMLU at 8.
    acc_lbs = (args.lm_eval_batch_size or [args.batch_size])[0]
    args.out.mkdir(parents=True, exist_ok=True)
    for task, shots, limit in runs:
        ours_file, ref_file = args.out / f"ours_{task}_{shots}_lls.json", args.out / f"lm_eval_{task}_{shots}_lls.json"
        # Cells left empty (the other half of a --skip-lm-eval / --lm-eval-only pair) keep their values in RESULTS.
        cells = dict.fromkeys(ACCURACY_HEADER, "")
        cells.update({"model": model_label, "run": f"{task} {shots}-shot, {'stratified' if limit else 'full'}"})
        if args.lm_eval_only:
            ids = [x.id for x in subset(get_task(task, data).items, limit or None)]
            ours_lls = _load_lls(ours_file)
        else:
            ours = evaluate(model, tok, task, shots=shots, limit=limit, data_dir=data, batch_size=args.batch_size)
            ids, ours_lls = ours.item_ids, _lls(ours)
            ours_file.write_text(json.dumps(ours_lls), encoding="utf-8")
            cells.update({"ours bs": str(args.batch_size), "ours s": f"{ours.timing['total_s']:.0f}"})
            cells.update({"ours acc": _metric(ours.metrics, "acc"), "ours acc_norm": _metric(ours.metrics, "acc_norm")})
        if args.skip_lm_eval:
            ref_lls = _load_lls(ref_file)
        else:
            out = args.out / f"full_{task}_{shots}"
            ref = run_lm_eval(model, tok, task, ids, out, data=data, shots=shots, batch_size=acc_lbs)
            ref_lls = ref["loglikelihoods"]
            ref_file.write_text(json.dumps(ref_lls), encoding="utf-8")
            cells.update({"lm-eval bs": str(acc_lbs), "lm-eval s": f"{ref['wall_s']:.0f}"})
            cells.update({f"lm-eval {m}": _metric(ref["metrics"], m) for m in ("acc", "acc_norm")})
        cells["items"] = str(len(ids))
        cells["max abs Δll"] = _max_delta({i: ours_lls[i] for i in ids if i in ours_lls}, ref_lls)
        print(" | ".join(cells.values()), flush=True)
        update_table("bench_eval_accuracy", ACCURACY_HEADER, [list(cells.values())], key=3, path=args.results)


if __name__ == "__main__":
    main()
