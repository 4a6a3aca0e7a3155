"""Generative tasks (lm-eval ``generate_until``): prompts as lm-eval builds them, greedy decoding, exact match.

The prompt is lm-eval's few-shot context (examples drawn by the task's sampler, as for log-likelihood tasks) ending
in the item's context; decoding is :func:`inactive_heads.generation.generate_until`; each of the task's extraction
filters (lm-eval's ``regex`` + ``take_first``) turns the text into an answer scored by lm-eval's ``exact_match``.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from .. import _compat
from .._tensors import pad_left
from ..engine import Policy, watch
from ..errors import InactiveHeadsError
from ..generation import BatchCheckpoint, generate_until
from ..tasks import FEWSHOT_SEED, Extraction, Generation, Item, Task
from .config import EvalConfig
from .metrics import _zeroed_fractions
from .requests import _chat_fn, _encode
from .result import EvalResult, _provenance, _timing

__all__ = ["prompt_tokens"]


def _extract(text: str, ex: Extraction) -> str:
    """lm-eval's ``RegexFilter`` then ``take_first``."""
    found = re.findall(ex.pattern, text)
    if not found:
        return ex.fallback
    match = found[ex.group_select]
    if isinstance(match, tuple):
        parts = [m for m in match if m]
        match = parts[0] if parts else ex.fallback
    return str(match).strip()


def _exact_match(prediction: str, reference: str, spec: Generation) -> float:
    """lm-eval's ``exact_match_hf_evaluate`` for one pair."""
    for pattern in spec.regexes_to_ignore:
        prediction, reference = re.sub(pattern, "", prediction), re.sub(pattern, "", reference)
    if spec.ignore_case:
        prediction, reference = prediction.lower(), reference.lower()
    return float(prediction == reference)


def prompt_tokens(task: Task, items: list[Item], shots: int, config: EvalConfig, tokenizer: Any) -> list[list[int]]:
    """Token ids of the prompts a generative evaluation of ``items`` feeds the model, built and tokenised as lm-eval
    does: the few-shot context ending in each item's context (before any cut to the model's context length)."""
    return _encode(tokenizer, _prompts(task, items, shots, config, tokenizer))


def _prompts(task: Task, items: list[Item], shots: int, config: EvalConfig, tokenizer: Any) -> list[str]:
    rnd = random.Random(FEWSHOT_SEED)  # one sampler state, advanced in item order (lm-eval)
    chat = _chat_fn(tokenizer) if config.apply_chat_template else None
    out = []
    for item in items:
        examples = task.fewshot_examples(item, shots, rnd)
        # The context of the (single) request; its continuation is the target, never fed to the model.
        out.append(task.requests(item, examples, chat, config.fewshot_as_multiturn)[0][0])
    return out


@torch.no_grad()
def _record_prompts(model: PreTrainedModel, prompts: list[list[int]], batch_size: int, pad_id: int) -> Any:
    """Every score on every prompt (one row per item, in item order): the calibration of a generative task."""
    with watch(model, record=True) as w:
        device = next(model.parameters()).device
        for start in range(0, len(prompts), batch_size):
            ids, mask, pos = pad_left(prompts[start : start + batch_size], pad_id=pad_id, device=device)
            model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1)
    return w.scores


def _evaluate_generative(
    model: PreTrainedModel,
    tokenizer: Any,
    task: Task,
    items: list[Item],
    shots: int,
    config: EvalConfig,
    policy: Policy | None,
    record: bool,
    progress: bool | Callable[[int], Any],
    t0: float,
    checkpoint: str | Path | None = None,
    scores_only: bool = False,
) -> EvalResult:
    spec = task.generation
    assert spec is not None
    max_gen = config.max_gen_toks or spec.max_gen_toks
    prompts = prompt_tokens(task, items, shots, config, tokenizer)
    # lm-eval truncates the context from the left to leave room for the generated tokens.
    room = _compat.max_length(model, tokenizer) - max_gen
    if room <= 0:
        raise InactiveHeadsError(f"max_gen_toks={max_gen} leaves no room for a prompt in the model's context")
    prompts = [p[-room:] for p in prompts]
    t_build = time.perf_counter()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    scores = None
    if record:
        scores = _record_prompts(model, prompts, config.batch_size, pad_id)
    if scores_only:
        t_run = time.perf_counter()
        n = len(items)
        return EvalResult(
            task=task.name,
            metrics={},
            n_items=n,
            item_ids=[it.id for it in items],
            groups=[it.group for it in items],
            gold=[],
            pred=[],
            pred_norm=[],
            loglikelihoods=[],
            is_greedy=[],
            gold_loglikelihood=None,
            group_metrics={},
            rows=[(i, -1) for i in range(n)],
            timing=_timing(t0, t_build, t_run, items=n, sequences=n, tokens=sum(map(len, prompts)), forward_tokens=0),
            config=_provenance(task, config, shots, policy, record, model),
            scores=scores,
        )
    gen = generate_until(
        model,
        tokenizer,
        prompts,
        until=spec.until,
        max_gen_toks=max_gen,
        batch_size=config.batch_size,
        policy=policy,
        mode=config.generation_mode,  # type: ignore[arg-type]  # validated by EvalConfig
        progress=progress,
        checkpoint=None if checkpoint is None else BatchCheckpoint(checkpoint),
    )
    t_run = time.perf_counter()
    targets = [it.continuations[0] for it in items]
    answers = {ex.name: [_extract(t, ex) for t in gen.texts] for ex in spec.extractions}
    item_metrics = {
        f"exact_match,{name}": [_exact_match(a, ref, spec) for a, ref in zip(found, targets, strict=True)]
        for name, found in answers.items()
    }
    n = max(len(items), 1)
    metrics = {k: sum(v) / n for k, v in item_metrics.items()}
    first = next(iter(item_metrics.values()))
    metrics["acc"] = sum(first) / n
    zeroed_fraction, zeroed_per_layer, zeroed_per_head = _zeroed_fractions(gen.zeroed)
    timing = _timing(
        t0,
        t_build,
        t_run,
        items=len(items),
        sequences=len(items),
        tokens=sum(map(len, prompts)),
        forward_tokens=gen.forwards,
    )
    return EvalResult(
        task=task.name,
        metrics=metrics,
        n_items=len(items),
        item_ids=[it.id for it in items],
        groups=[it.group for it in items],
        gold=[1] * len(items),
        pred=[int(x) for x in first],
        pred_norm=[int(x) for x in first],
        loglikelihoods=[],
        is_greedy=[],
        gold_loglikelihood=None,
        group_metrics={"": {"n": len(items), **{k: v for k, v in metrics.items() if k != "acc"}}},
        rows=[(i, -1) for i in range(len(items))],
        timing=timing,
        config=_provenance(task, config, shots, policy, record, model),
        zeroed_fraction=zeroed_fraction,
        zeroed_per_layer=zeroed_per_layer,
        zeroed_per_head=zeroed_per_head,
        scores=scores,
        zeroed=gen.zeroed,
        generations=gen.texts,
        answers=answers,
        item_metrics=item_metrics,
        generation={
            "mode": gen.mode,
            "max_gen_toks": max_gen,
            "new_tokens": gen.new_tokens,
            "forwards": gen.forwards,
            "seconds": gen.seconds,
            "tokens_per_s": gen.tokens_per_s,
            "kv_bytes": gen.kv_bytes,
            "kv_bytes_droppable": gen.kv_bytes_droppable,
            "kv_bytes_dropped": gen.kv_bytes_dropped,
            "flips": gen.flips,
            "generated_tokens": gen.tokens,
        },
    )
