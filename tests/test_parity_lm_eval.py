"""Parity with lm-evaluation-harness 0.4.x on a real model: same items, same per-choice log-likelihoods.

lm-eval runs its own default task YAMLs (``include:``-d from its package; only the dataset is swapped for local
JSON files built from the raw ../shared/data files, see ``tests/_lm_eval.py``) through an HFLM that wraps the
very model object our evaluator uses (SmolLM2-135M-Instruct from its GGUF, fp32), on every built-in benchmark task.
MMLU: 40 items, 5-shot, drawn stratified from the 10 subjects with the shortest prompts to fit the CI budget (our
side then reuses the shared few-shot KV prefix, lm-eval runs every prompt whole). The others: 40 stratified items
0-shot, and WinoGrande also 5-shot (the paper's setting: random examples from the evaluated split, a different
few-shot block per item, shared by its two choices). Between them they take every path of the evaluator: a
KV-cached few-shot prefix (MMLU), one sequence read for all choices (MMLU, BoolQ), choices packed behind their
common prefix (ARC, PIQA, HellaSwag) and partial scoring, whose choices differ inside the context (WinoGrande).
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
from _lm_eval import SHORT_MMLU_SUBJECTS, run_lm_eval

from inactive_heads.evaluation import evaluate
from inactive_heads.tasks import TASKS, Task, get_task

#: (task, shots) compared with lm-eval: every built-in benchmark task (``recall`` is ours alone).
CASES = [
    ("mmlu", 5),
    ("piqa", 0),
    ("arc_easy", 0),
    ("arc_challenge", 0),
    ("winogrande", 0),
    ("winogrande", 5),
    ("hellaswag", 0),
    ("boolq", 0),
]


def _task(name: str, data_dir) -> Task:
    task = get_task(name, data_dir)
    if name == "mmlu":
        task = dataclasses.replace(task, items=[it for it in task.items if it.group in SHORT_MMLU_SUBJECTS])
    return task


def test_every_builtin_benchmark_task_is_compared_with_lm_eval():
    # Built-in: registered by the package itself (tests and plugins may register more); MMLU's subjects are MMLU.
    loaders = {n: getattr(spec.fn, "func", spec.fn) for n, spec in TASKS.items()}  # unwrap functools.partial
    builtin = {n for n, fn in loaders.items() if fn.__module__.startswith("inactive_heads.tasks.")}
    # arc_easy_dev is arc_easy's prompts on the dev split, a calibration split lm-eval has no task for (test_tasks).
    builtin = {n for n in builtin if not n.startswith("mmlu_")} - {"recall", "arc_easy_dev"}
    # GSM8K, the generative task, is compared in test_parity_gsm8k.py.
    assert builtin == {name for name, _ in CASES} | {"gsm8k"}


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm_eval not installed (group parity)")
@pytest.mark.parametrize(("name", "shots"), CASES)
def test_loglikelihoods_and_accuracy_match_lm_eval(data_dir, smollm2, tmp_path, name, shots):
    model, tok = smollm2
    ours = evaluate(model, tok, _task(name, data_dir), shots=shots, limit=40, seed=0, batch_size=8)
    assert ours.n_items == 40
    if name == "mmlu":
        assert len(set(ours.groups)) == len(SHORT_MMLU_SUBJECTS)
    ref = run_lm_eval(model, tok, name, ours.item_ids, tmp_path, data=data_dir, shots=shots, batch_size=8)
    assert set(ref["loglikelihoods"]) == set(ours.item_ids)
    worst = 0.0
    for iid, lls in zip(ours.item_ids, ours.loglikelihoods, strict=True):
        theirs = ref["loglikelihoods"][iid]
        assert len(theirs) == len(lls)
        worst = max(worst, *(abs(a - b) for a, b in zip(lls, theirs, strict=True)))
    assert worst < 1e-3, f"largest per-choice log-likelihood difference {worst:.2e}"
    for iid, pred, gold in zip(ours.item_ids, ours.pred, ours.gold, strict=True):
        assert ref["acc"][iid] == float(pred == gold), iid
    assert ours.metrics["acc"] == ref["metrics"]["acc"]
    if "acc_norm" in ref["metrics"]:
        assert ours.metrics["acc_norm"] == ref["metrics"]["acc_norm"]
