"""GSM8K parity with lm-evaluation-harness 0.4.13's ``gsm8k`` on a real model: the same 5-shot prompts (its sampler
and seed), the same greedy text under its stop sequences, the same strict-match and flexible-extract scores.

lm-eval runs its own gsm8k.yaml (dataset swapped for local JSON files of the evaluated items and the whole train
split, ``max_gen_toks`` lowered to fit CI) through an HFLM wrapping the very model object our evaluator uses.
"""

from __future__ import annotations

import importlib.util

import pytest
from _lm_eval import run_lm_eval_generate

from inactive_heads.evaluation import evaluate
from inactive_heads.evaluation.config import EvalConfig
from inactive_heads.evaluation.generative import _prompts
from inactive_heads.tasks import get_task, subset

MAX_GEN_TOKS = 16


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm_eval not installed (group parity)")
def test_gsm8k_generations_and_metrics_match_lm_eval(data_dir, smollm2, tmp_path):
    model, tok = smollm2
    task = get_task("gsm8k", data_dir)
    ours = evaluate(model, tok, task, limit=3, seed=0, batch_size=3, max_gen_toks=MAX_GEN_TOKS)
    assert ours.n_items == 3 and ours.generations is not None and ours.item_metrics is not None
    ref = run_lm_eval_generate(
        model, tok, "gsm8k", ours.item_ids, tmp_path, data=data_dir, shots=5, batch_size=3, max_gen_toks=MAX_GEN_TOKS
    )
    prompts = _prompts(task, subset(task.items, 3, 0), 5, EvalConfig(), tok)
    for k, iid in enumerate(ours.item_ids):
        assert prompts[k] == ref["prompts"][iid], iid  # the same five examples, the same layout
        assert ours.generations[k] == ref["texts"][iid], iid
        for metric, values in ours.item_metrics.items():
            assert values[k] == ref["metrics"][iid][metric], (iid, metric)
    assert set(ref["metrics"][ours.item_ids[0]]) == set(ours.item_metrics)
