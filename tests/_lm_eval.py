"""lm-evaluation-harness as the reference: its own default task files run on exactly the items we evaluate.

:func:`run_lm_eval` writes local lm-eval task YAMLs (``include:`` of lm-eval's own default task files, the dataset
overridden with local JSON files built straight from the raw benchmark files for exactly the given items, or for the
whole split with the given items picked where that split is also the few-shot pool) and runs
``lm_eval.simple_evaluate`` with an HFLM wrapping the already-loaded model. Used by ``test_parity_lm_eval.py``,
``test_tasks.py`` and ``bench/bench_eval.py``.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

# The datasets are local files: lm-eval (through ``datasets``) must not look for them on the hub.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

__all__ = [
    "SHORT_MMLU_SUBJECTS",
    "lm_eval_module",
    "lm_eval_tasks_dir",
    "run_lm_eval",
    "run_lm_eval_generate",
    "write_lm_eval_tasks",
]

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
    """lm-eval's ``tasks`` folder, found without importing lm-eval."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("lm_eval is not installed (dependency group 'parity')")
    return Path(next(iter(spec.submodule_search_locations))) / "tasks"


def lm_eval_module(relative: str) -> ModuleType:
    """One small lm-eval task helper module (``relative`` to its tasks folder), loaded by path.

    Loading by path avoids importing lm-eval's task index, which takes seconds.
    """
    name = "_lm_eval_" + relative.removesuffix(".py").replace("/", "_")
    spec = importlib.util.spec_from_file_location(name, lm_eval_tasks_dir() / relative)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"lm-eval has no task helper {relative}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dump(path: Path, rows: list[dict[str, Any]]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _local_task(out: Path, name: str, include: Path, files: dict[str, str], **overrides: Any) -> None:
    """Task YAML ``name``: lm-eval's own ``include`` with its dataset swapped for the local JSON ``files`` (split ->
    path); JSON is valid YAML, and lm-eval loads it with its own YAML loader."""
    cfg: dict[str, Any] = {
        "include": str(include),
        "task": name,
        "tag": [],
        "dataset_path": "json",
        "dataset_name": None,
    }
    cfg["dataset_kwargs"] = {"data_files": files}
    (out / f"{name}.yaml").write_text(json.dumps({**cfg, **overrides}, indent=1), encoding="utf-8")


def _line(path: Path, n: int, cache: dict[Path, list[str]]) -> str:
    if path not in cache:
        cache[path] = path.read_text(encoding="utf-8").split("\n")
    return cache[path][n - 1]


def _pool_split(
    item_ids: list[str], every: list[str], row: Callable[[str], dict[str, Any]], shots: int, path: Path
) -> tuple[str, list[str], list[int] | None]:
    """The evaluated split of a task whose few-shot pool is that split itself (WinoGrande, HellaSwag, BoolQ: no
    train split offline), written for lm-eval with its training split dropped, so that lm-eval draws ``shots + 1``
    examples from it and drops the evaluated doc, as :meth:`inactive_heads.tasks.Task.fewshot_examples` does.

    0-shot: only ``item_ids`` are written. k-shot: every item of the split (``every``, in file order), so that
    lm-eval's pool is ours, and lm-eval's ``samples`` picks the evaluated ones. Returns (file, item id per
    written doc, ``samples`` or None).
    """
    if not shots:
        return _dump(path, [row(i) for i in item_ids]), list(item_ids), None
    where = {iid: k for k, iid in enumerate(every)}
    picked = sorted(where[i] for i in item_ids)
    return _dump(path, [row(i) for i in every]), list(every), picked


def _gsm8k_generation(max_gen_toks: int) -> dict[str, Any]:
    # gsm8k.yaml's generation_kwargs with a smaller cap on new tokens.
    until = ["Question:", "</s>", "<|im_end|>"]
    return {"until": until, "do_sample": False, "temperature": 0.0, "max_gen_toks": max_gen_toks}


def write_lm_eval_tasks(
    task: str, item_ids: list[str], out: Path, data: Path, shots: int = 0, max_gen_toks: int | None = None
) -> tuple[dict[str, list[str]], dict[str, list[int]] | None]:
    """Local lm-eval tasks for exactly ``item_ids`` of ``task`` (every built-in task but ``recall``).
    ``max_gen_toks``: a generative task's cap on new tokens (None: lm-eval's).

    ``data`` is the benchmark folder (the layout of ``$INACTIVE_HEADS_DATA``). Returns lm-eval task name -> item ids
    in that task's doc order (the logged doc_id i is the i-th id), and lm-eval's ``samples`` (the doc ids to
    evaluate per task; None: every doc written).
    """
    tasks_dir = lm_eval_tasks_dir()
    cache: dict[Path, list[str]] = {}
    out.mkdir(parents=True, exist_ok=True)
    names: dict[str, list[str]] = {}
    samples: dict[str, list[int]] = {}
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
            _local_task(out, name, tasks_dir / "mmlu" / "default" / f"mmlu_{subject}.yaml", files)
            names[name] = ids
    elif task == "piqa":
        labels = (data / "piqa" / "valid-labels.lst").read_text().split("\n")
        rows = []
        for i in item_ids:
            n = int(i.split(":")[1])
            r = json.loads(_line(data / "piqa" / "valid.jsonl", n, cache))
            rows.append({**r, "label": int(labels[n - 1])})
        files = {"validation": _dump(out / "piqa.jsonl", rows)}
        _local_task(out, "local_piqa", tasks_dir / "piqa" / "piqa.yaml", files, training_split=None)
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
        include = tasks_dir / "arc" / f"{task}.yaml"
        _local_task(out, f"local_{task}", include, files, training_split=None, validation_split=None)
        names[f"local_{task}"] = list(item_ids)
    elif task == "gsm8k":
        # The evaluated items in order; train whole, lm-eval's few-shot split (its sampler draws from it).
        lines = {s: (data / "gsm8k" / f"{s}.jsonl").read_text(encoding="utf-8").splitlines() for s in ("test", "train")}
        test = [json.loads(lines["test"][int(i.split(":")[1]) - 1]) for i in item_ids]
        train = [json.loads(x) for x in lines["train"] if x.strip()]
        files = {"test": _dump(out / "gsm8k_test.jsonl", test), "train": _dump(out / "gsm8k_train.jsonl", train)}
        overrides = {} if max_gen_toks is None else {"generation_kwargs": _gsm8k_generation(max_gen_toks)}
        _local_task(out, "local_gsm8k", tasks_dir / "gsm8k" / "gsm8k.yaml", files, **overrides)
        names["local_gsm8k"] = list(item_ids)
    elif task in ("winogrande", "hellaswag", "boolq"):
        every, pool_row = _pool_rows(task, data)
        file, ids, picked = _pool_split(item_ids, every, pool_row, shots, out / f"{task}.jsonl")
        include = {
            "winogrande": tasks_dir / "winogrande" / "default.yaml",
            "hellaswag": tasks_dir / "hellaswag" / "hellaswag.yaml",
            "boolq": tasks_dir / "super_glue" / "boolq" / "default.yaml",
        }[task]
        _local_task(out, f"local_{task}", include, {"validation": file}, training_split=None)
        names[f"local_{task}"] = ids
        if picked is not None:
            samples[f"local_{task}"] = picked
    else:
        raise ValueError(f"no lm-eval counterpart written for {task!r}")
    return names, samples or None


def _pool_rows(task: str, data: Path) -> tuple[list[str], Callable[[str], dict[str, Any]]]:
    """Every item id of WinoGrande's, HellaSwag's or BoolQ's evaluated split in file order, and the lm-eval
    dataset row of an item id (the fields lm-eval's task file reads, from the raw file)."""
    from inactive_heads.tasks import get_task

    if task == "hellaswag":
        # The local file is the derived text format (one line "activity_label: context", see
        # ``inactive_heads.tasks.hellaswag``). lm-eval's query is preprocess(activity_label + ": " + ctx_a + " " +
        # ctx_b.capitalize()) and preprocess strips, so an empty ctx_b gives lm-eval exactly the context we score.
        by_id = {it.id: it for it in get_task("hellaswag", data).items}

        def swag(i: str) -> dict[str, Any]:
            it = by_id[i]
            label, _, ctx = it.contexts[0].partition(": ")
            return {
                "activity_label": label,
                "ctx_a": ctx,
                "ctx_b": "",
                "endings": list(it.continuations),
                "label": str(it.gold),
            }

        return list(by_id), swag
    folder, file, prefix = {
        "winogrande": ("winogrande", "dev.jsonl", "winogrande/dev"),
        "boolq": ("boolq", "val.jsonl", "boolq/val"),
    }[task]
    lines = (data / folder / file).read_text(encoding="utf-8").splitlines()
    # BoolQ's label comes in several spellings (bool, 0/1, "true"); the loader's reading of it is the label.
    gold = {it.id: it.gold for it in get_task("boolq", data).items} if task == "boolq" else {}

    def raw(i: str) -> dict[str, Any]:
        r = json.loads(lines[int(i.split(":")[1]) - 1])
        if task == "boolq":
            return {"question": r["question"], "passage": r["passage"], "label": gold[i]}
        return {key: r[key] for key in ("qID", "sentence", "option1", "option2", "answer")}

    return [f"{prefix}:{k + 1}" for k in range(len(lines))], raw


def _hflm_and_tasks(model: Any, tokenizer: Any, batch_size: int, out: Path) -> tuple[Any, Any]:
    """HFLM over the already-loaded model and a TaskManager that sees the local tasks written to ``out``."""
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=str(model.device))
    return lm, TaskManager(include_path=str(out))


def _simple_evaluate(lm: Any, tm: Any, names: dict[str, Any], samples: Any, shots: int) -> dict[str, Any]:
    """lm-eval's simple_evaluate on exactly ``samples`` of ``names``, every seed fixed, per-sample logs kept."""
    import lm_eval

    return lm_eval.simple_evaluate(
        model=lm,
        tasks=list(names),
        num_fewshot=shots,
        samples=samples,
        log_samples=True,
        task_manager=tm,
        bootstrap_iters=0,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=1234,
    )


def run_lm_eval_generate(
    model: Any,
    tokenizer: Any,
    task: str,
    item_ids: list[str],
    out: Path,
    *,
    data: Path,
    shots: int,
    batch_size: int,
    max_gen_toks: int,
) -> dict[str, Any]:
    """Run a generative lm-eval task on exactly ``item_ids``: per item the generated text and each metric."""
    names, samples = write_lm_eval_tasks(task, item_ids, out, data, shots, max_gen_toks)
    res = _simple_evaluate(*_hflm_and_tasks(model, tokenizer, batch_size, out), names, samples, shots)
    texts: dict[str, str] = {}
    prompts: dict[str, str] = {}
    metrics: dict[str, dict[str, float]] = {}
    for name, ids in names.items():
        for s in res["samples"][name]:
            # One sample per (doc, filter); the text and prompt are the doc's.
            iid = ids[s["doc_id"]]
            texts[iid] = s["resps"][0][0]
            prompts[iid] = s["arguments"][0][0]
            metrics.setdefault(iid, {})[f"exact_match,{s['filter']}"] = float(s["exact_match"])
    return {"texts": texts, "prompts": prompts, "metrics": metrics, "results": res["results"]}


def run_lm_eval(
    model: Any,
    tokenizer: Any,
    task: str,
    item_ids: list[str],
    out: Path,
    *,
    data: Path,
    shots: int,
    batch_size: int,
) -> dict[str, Any]:
    """Run lm-eval on exactly ``item_ids``; per-item choice log-likelihoods, accuracies and wall time."""
    names, samples = write_lm_eval_tasks(task, item_ids, out, data, shots)
    lm, tm = _hflm_and_tasks(model, tokenizer, batch_size, out)
    t0 = time.perf_counter()
    res = _simple_evaluate(lm, tm, names, samples, shots)
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
