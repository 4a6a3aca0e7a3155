"""Parity with lm-evaluation-harness 0.4.x on a real model: same items, same per-choice log-likelihoods.

lm-eval runs its own default task YAMLs (``include:``-d from its package; only the dataset is swapped for local
JSON files built from the raw ../shared/data files, see ``tests/_lm_eval.py``) through an HFLM that wraps the
very model object our evaluator uses (SmolLM2-135M-Instruct from its GGUF, fp32). MMLU: 40 items, 5-shot, drawn
stratified from the 10 subjects with the shortest prompts to fit the CI budget (our side then reuses the shared
few-shot KV prefix, lm-eval runs every prompt whole). PIQA and ARC-Easy: 40 stratified items, 0-shot.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
from _lm_eval import SHORT_MMLU_SUBJECTS, run_lm_eval

from inactive_heads.evaluation import evaluate
from inactive_heads.tasks import Task, get_task

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm_eval not installed (group parity)"),
]


def _task(name: str, data_dir) -> Task:
    task = get_task(name, data_dir)
    if name == "mmlu":
        task = dataclasses.replace(task, items=[it for it in task.items if it.group in SHORT_MMLU_SUBJECTS])
    return task


@pytest.mark.parametrize(("name", "shots"), [("mmlu", 5), ("piqa", 0), ("arc_easy", 0)])
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
