"""Parity with lm-evaluation-harness 0.4.x on a real model: same items, same per-choice log-likelihoods.

lm-eval runs its own default task YAMLs (``include:``-d from its package; only the dataset is swapped for local
JSON files built from the raw ../shared/data files, see ``bench/bench_eval.py``) through an HFLM that wraps the
very model object our evaluator uses (SmolLM2-135M-Instruct from its GGUF, fp32). MMLU: 40 items, 5-shot, drawn
stratified from the 10 subjects with the shortest prompts to fit the CI budget (our side then reuses the shared
few-shot KV prefix, lm-eval runs every prompt whole). PIQA and ARC-Easy: 40 stratified items, 0-shot.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm_eval not installed (group parity)"),
    pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present"),
]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_eval", ROOT / "bench" / "bench_eval.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def smollm2():
    from _real import smollm2_gguf

    from inactive_heads.loading import load_model

    return load_model(smollm2_gguf())


def _task(name: str):
    from inactive_heads.tasks import get_task

    task = get_task(name, DATA)
    if name == "mmlu":
        subjects = _bench().SHORT_MMLU_SUBJECTS
        task = dataclasses.replace(task, items=[it for it in task.items if it.group in subjects])
    return task


@pytest.mark.parametrize(("name", "shots"), [("mmlu", 5), ("piqa", 0), ("arc_easy", 0)])
def test_loglikelihoods_and_accuracy_match_lm_eval(smollm2, tmp_path, name, shots):
    from inactive_heads.evaluation import evaluate

    model, tok = smollm2
    ours = evaluate(model, tok, _task(name), shots=shots, limit=40, seed=0, batch_size=8)
    assert ours.n_items == 40
    if name == "mmlu":
        assert len(set(ours.groups)) == len(_bench().SHORT_MMLU_SUBJECTS)
    ref = _bench().run_lm_eval(model, tok, name, ours.item_ids, tmp_path, shots=shots, batch_size=8)
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
