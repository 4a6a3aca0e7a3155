"""Requests as lm-evaluation-harness 0.4.x (HFLM) builds them: few-shot contexts, tokenisation, sequences.

Each (item, choice) becomes one sequence ``context + continuation[:-1]`` tokenised as lm-eval does (trailing
context spaces move into the continuation; the pair is encoded whole and split at the context's length). When
every continuation of an item is a single token after the same context (MMLU's " A".." D"), the item runs as one
sequence and all choices are read from its last position, as lm-eval's logits cache does.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedModel

from .. import _compat
from ..errors import InactiveHeadsError
from ..tasks import FEWSHOT_SEED, Item, Task, subset
from .config import EvalConfig

__all__ = ["check_request", "token_sequences"]


@dataclass
class _Seq:
    tokens: list[int]
    item: int  # position in the evaluated item list
    choice: int  # -1: all choices of the item are read from the last position
    conts: list[list[int]]  # continuation tokens per choice read from this sequence
    prefix_key: str = ""  # few-shot prefix text; sequences with the same key may share its KV cache


def _prefix_text(tokenizer: Any) -> str | None:
    # lm-eval's HFLM.prefix_token_id: BOS if the tokenizer has one, else EOS.
    tid = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    return None if tid is None else tokenizer.decode(tid)


def _encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids as lm-eval's ``tok_encode``: the tokenizer's default special tokens, none if text starts with BOS."""
    prefix = _prefix_text(tokenizer)
    out: list[list[int] | None] = [None] * len(texts)
    for special in (True, False):
        idx = [i for i, t in enumerate(texts) if bool(prefix and t.startswith(prefix)) != special]
        if idx:
            enc = tokenizer([texts[i] for i in idx], add_special_tokens=special)["input_ids"]
            for i, e in zip(idx, enc, strict=True):
                out[i] = list(e)
    return out  # type: ignore[return-value]


def _split_pairs(pairs: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    # lm-eval _encode_pair: trailing whitespace of the context belongs to the continuation.
    ctxs, wholes = [], []
    for ctx, cont in pairs:
        if not ctx:
            raise InactiveHeadsError("empty context: lm-eval would condition on the prefix token; not supported here")
        n = len(ctx) - len(ctx.rstrip())
        if n:
            ctx, cont = ctx[:-n], ctx[-n:] + cont
        ctxs.append(ctx)
        wholes.append(ctx + cont)
    return ctxs, wholes


def _build(
    task: Task,
    items: list[Item],
    shots: int,
    tokenizer: Any,
    max_length: int,
    chat: Callable[[list[dict[str, str]]], str] | None,
    fewshot_as_multiturn: bool,
) -> list[_Seq]:
    rnd = random.Random(FEWSHOT_SEED)  # one sampler state for the whole run, advanced in item order (lm-eval)
    pairs, owner, keys = [], [], []
    for i, item in enumerate(items):
        examples = task.fewshot_examples(item, shots, rnd)
        reqs = task.requests(item, examples, chat, fewshot_as_multiturn)
        pairs += reqs
        owner += [(i, c) for c in range(len(reqs))]
        # Sequences that may share a KV prefix: all items with the same fixed few-shot block (first_n), else
        # the choices of one item (their contexts agree up to the choice).
        if chat:
            key = ""
        elif examples and task.fewshot_sampler == "first_n":
            key = "fewshot:" + task.description(item) + "\0".join(x.id for x in examples)
        else:
            key = f"item:{i}"
        keys += [key] * len(reqs)
    ctxs, wholes = _split_pairs(pairs)
    unique = list(dict.fromkeys(ctxs + wholes))
    enc = dict(zip(unique, _encode(tokenizer, unique), strict=True))
    seqs: list[_Seq] = []
    k = 0
    while k < len(pairs):
        i = owner[k][0]
        n = items[i].n_choices
        ctx_toks = [enc[c] for c in ctxs[k : k + n]]
        conts = [enc[w][len(c) :] for w, c in zip(wholes[k : k + n], ctx_toks, strict=True)]
        if any(not c for c in conts):
            raise InactiveHeadsError(f"item {items[i].id}: a continuation tokenised to nothing")
        if all(len(c) == 1 for c in conts) and all(c == ctx_toks[0] for c in ctx_toks):
            seqs.append(_Seq(ctx_toks[0][-max_length:], i, -1, conts, keys[k]))
        else:
            for c in range(n):
                whole = (ctx_toks[c] + conts[c])[-(max_length + 1) :][:-1]
                seqs.append(_Seq(whole, i, c, [conts[c]], keys[k]))
        k += n
    return seqs


def _positions(seq: _Seq) -> list[int]:
    """Logit positions predicting the continuation tokens of ``seq``."""
    n = len(seq.tokens)
    if seq.choice == -1:
        return [n - 1]
    c = len(seq.conts[0])
    return list(range(n - c, n))


def token_sequences(
    model: PreTrainedModel, tokenizer: Any, task: Task, items: list[Item], shots: int
) -> list[tuple[list[int], list[int]]]:
    """The token sequences an evaluation of ``items`` (without a chat template) runs, each with the positions whose
    next-token log-probabilities it reads: the work any exact evaluator of the same requests must do."""
    seqs = _build(task, items, shots, tokenizer, _compat.max_length(model, tokenizer), None, True)
    return [(s.tokens, _positions(s)) for s in seqs]


def _chat_fn(tokenizer: Any) -> Callable[[list[dict[str, str]]], str]:
    def render(messages: list[dict[str, str]]) -> str:
        # lm-eval HFLM.apply_chat_template, including its retry without the system turn.
        kw = {"tokenize": False, "add_generation_prompt": True, "continue_final_message": False}
        try:
            return str(tokenizer.apply_chat_template(messages, **kw))
        except Exception:
            return str(tokenizer.apply_chat_template([m for m in messages if m["role"] != "system"], **kw))

    return render


def check_request(task: Task, config: EvalConfig) -> None:
    """Raise what evaluating ``task`` under ``config`` would raise about it, before anything runs or is written:
    more shots than some item's few-shot pool holds (the options themselves are checked by :class:`EvalConfig`)."""
    shots = config.shots_for(task)
    rnd = random.Random(FEWSHOT_SEED)  # the same draws as _build, so the same items fail
    for item in subset(task.items, config.limit, config.seed):
        task.fewshot_examples(item, shots, rnd)
