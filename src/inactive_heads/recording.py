"""Recording every registered score of many texts: batched, longest first, rows returned in the given order."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from . import _compat
from ._tensors import inverse_permutation, pad_right
from .engine import watch
from .errors import InactiveHeadsError
from .scores import HeadScores

__all__ = ["record_scores"]


@torch.no_grad()
def record_scores(
    model: PreTrainedModel,
    tokenizer: Any,
    texts: Sequence[str] | Sequence[Sequence[int]],
    batch_size: int = 8,
    *,
    max_length: int | None = None,
) -> HeadScores:
    """All registered scores of each text, float32 [len(texts), n_layers, n_heads], rows in the order of ``texts``.

    ``texts`` may also be token id lists (then ``tokenizer`` is not used and may be None).
    """
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of strings, not one string; wrap it in a list")
    if batch_size < 1:
        raise InactiveHeadsError(f"batch_size must be >= 1, got {batch_size}")
    ids = [list(t) if not isinstance(t, str) else tokenizer(t, add_special_tokens=True)["input_ids"] for t in texts]
    if max_length is not None:
        ids = [x[:max_length] for x in ids]
    if any(len(x) == 0 for x in ids):
        raise InactiveHeadsError("an input tokenised to zero tokens; remove empty texts")
    limit = _compat.max_length(model, tokenizer)
    longest = max((len(x) for x in ids), default=0)
    if longest > limit:
        # Past its trained positions a model (RoPE, learned positions) gives finite but meaningless scores.
        raise InactiveHeadsError(
            f"an input has {longest} tokens, more than the model's {limit} positions; pass max_length={limit} "
            "(keeps each input's first tokens) or shorten the texts"
        )
    # Longest first, so padding is small and the first batch shows whether memory suffices.
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    # transformers types get_input_embeddings() as nn.Module, whose __getattr__ stub gives .weight as Tensor | Module.
    device: torch.device = model.get_input_embeddings().weight.device  # type: ignore[assignment]
    # Scores need no logits: the LM head on one position instead of all (a fifth of a small model's forward).
    head = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    with watch(model, record=True) as w:
        for start in range(0, len(order), batch_size):
            chunk = [ids[i] for i in order[start : start + batch_size]]
            input_ids, attention_mask = pad_right(chunk, device=device)
            model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **head)
        parts = w.scores
    assert parts is not None  # record=True
    result = parts.select(inverse_permutation(order))
    result.meta = {"n_texts": len(texts), "max_length": max_length}
    return result
