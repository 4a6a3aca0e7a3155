""":func:`evaluate`: build the requests, run them (under a policy or recording if asked), score the items."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from .. import _compat
from .._tensors import inverse_permutation
from ..engine import Policy, watch
from ..errors import InactiveHeadsError
from ..tasks import Task, get_task, subset
from .batching import _run, _sharing
from .config import EvalConfig
from .generative import _evaluate_generative
from .metrics import _accuracy, _check_finite, _gold_loglikelihood, _per_item, _predictions, _zeroed_fractions
from .requests import _build, _chat_fn
from .result import EvalResult, _provenance, _timing

__all__ = ["evaluate"]


def evaluate(
    model: PreTrainedModel,
    tokenizer: Any,
    task: str | Task,
    config: EvalConfig | None = None,
    *,
    policy: Policy | None = None,
    record: bool = False,
    progress: bool | Callable[[int], Any] = False,
    checkpoint: str | Path | None = None,
    scores_only: bool = False,
    **options: Any,
) -> EvalResult:
    """Evaluate ``model`` on ``task`` as lm-eval 0.4.x does: by log-likelihood, or for a generative task (GSM8K)
    by greedy generation and exact match (``config.generation_mode`` says how a policy decides while decoding).

    ``task``: a registered name (see :data:`inactive_heads.tasks.TASKS`) or a loaded :class:`Task`.
    ``config``: what to evaluate and how (:class:`EvalConfig`: shots, limit, seed, batch_size, data source, chat
    template, prefix sharing); ``options``: any of its fields by name, applied on top of ``config``.
    ``policy``: zero heads during evaluation; ``record``: also record every score of every row (``result.scores``).
    Under a policy or recording every sequence runs whole, so each row's scores see its entire input.
    ``progress``: show a progress bar over sequences; True for tqdm's, or a factory ``progress(total)`` of a
    tqdm-like bar (``update(n)``, ``close()``), so a caller can nest it under its own or show it from another process.
    ``checkpoint``: a directory where a generative evaluation keeps each finished batch of generation and from which
    an interrupted one resumes (:class:`~inactive_heads.generation.BatchCheckpoint`; the caller keys it by
    everything else that decides the output). Log-likelihood tasks, whose batches take seconds, do not use it.
    ``scores_only`` (with ``record`` and no policy): a generative task records the scores of its prompts' pass and
    generates nothing (a calibration needs no answers; its metrics are then empty).
    """
    if scores_only and (not record or policy is not None):
        raise InactiveHeadsError("scores_only=True needs record=True and no policy")
    config = EvalConfig.from_options(config, **options)
    if config.share_prefix and (policy is not None or record):
        raise InactiveHeadsError(
            "share_prefix=True needs policy=None and record=False: rows must see their whole input"
        )
    t0 = time.perf_counter()
    if isinstance(task, str):
        task = get_task(task, config.data_dir, config.source)
    shots = config.shots_for(task)
    items = subset(task.items, config.limit, config.seed)
    if task.generation is not None:
        return _evaluate_generative(
            model, tokenizer, task, items, shots, config, policy, record, progress, t0, checkpoint, scores_only
        )
    chat = _chat_fn(tokenizer) if config.apply_chat_template else None
    seqs = _build(
        task, items, shots, tokenizer, _compat.max_length(model, tokenizer), chat, config.fewshot_as_multiturn
    )
    t_build = time.perf_counter()

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    was_training = model.training
    model.eval()
    scores = zeroed = None
    try:
        if policy is None and not record:
            share = _sharing(model, config.share_prefix)
            lls_seq, greedy_seq, order, n_forward = _run(model, seqs, config.batch_size, pad_id, progress, share)
        else:
            with watch(model, policy=policy, record=record) as w:
                lls_seq, greedy_seq, order, n_forward = _run(model, seqs, config.batch_size, pad_id, progress, None)
            # Rows arrive in forward (length-sorted) order; put them back in sequence order.
            inverse = inverse_permutation(order)
            if record and w.scores is not None:
                scores = w.scores.select(inverse)
            if policy is not None and w.zeroed is not None:
                zeroed = w.zeroed[inverse]
    finally:
        model.train(was_training)
    t_run = time.perf_counter()

    lls, greedy = _per_item(items, seqs, lls_seq, greedy_seq)
    _check_finite(task.name, items, lls, next(model.parameters()).dtype)
    pred, pred_norm = _predictions(items, lls)
    metrics, group_metrics = _accuracy(items, pred, pred_norm, "acc_norm" in task.metrics)
    zeroed_fraction, zeroed_per_layer, zeroed_per_head = _zeroed_fractions(zeroed)
    timing = _timing(
        t0,
        t_build,
        t_run,
        items=len(items),
        sequences=len(seqs),
        tokens=sum(len(s.tokens) for s in seqs),
        forward_tokens=n_forward,
    )
    return EvalResult(
        task=task.name,
        metrics=metrics,
        n_items=len(items),
        item_ids=[it.id for it in items],
        groups=[it.group for it in items],
        gold=[it.gold for it in items],
        pred=pred,
        pred_norm=pred_norm,
        loglikelihoods=lls,
        is_greedy=greedy,
        gold_loglikelihood=_gold_loglikelihood(items, lls),
        group_metrics=group_metrics,
        rows=[(s.item, s.choice) for s in seqs],
        timing=timing,
        config=_provenance(task, config, shots, policy, record, model),
        zeroed_fraction=zeroed_fraction,
        zeroed_per_layer=zeroed_per_layer,
        zeroed_per_head=zeroed_per_head,
        scores=scores,
        zeroed=zeroed,
    )
