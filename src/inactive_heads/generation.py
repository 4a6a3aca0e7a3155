"""Batched greedy generation as lm-eval's HFLM ``generate_until`` does it, with heads zeroed while decoding.

Prompts run in lm-eval's order (longest first), ``batch_size`` at a time, left-padded, with positions counted over
real tokens only, so each row decodes as it would alone. A row stops at an end-of-text token, when its decoded tail
contains a stop string (lm-eval's ``MultiTokenEOSCriteria`` look-back) or after ``max_gen_toks`` tokens; its text
is the decoded tokens (special tokens skipped) cut before the first stop string.

Under a policy, ``mode`` says what each zeroing decision sees:

- ``"recompute"`` (the paper's): no KV cache; every step re-runs the whole sequence, so the policy decides on
  statistics over all real positions of that pass. Quadratic in the generated length.
- ``"step"``: with a KV cache; the prompt's pass decides on the prompt's positions, every later step on the new
  token's single query (what :func:`~inactive_heads.engine.watch` does under ``model.generate``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from transformers import PreTrainedModel

from . import _compat
from .engine import Policy, watch

__all__ = ["MODES", "Generated", "generate_until"]

#: Zeroing modes during generation (see the module docstring).
MODES = ("recompute", "step")

Mode = Literal["recompute", "step"]


@dataclass
class Generated:
    """Outcome of :func:`generate_until`, per prompt in the order given.

    ``tokens``: generated ids up to and including the token that stopped the row. ``texts``: decoded and cut at the
    first stop string, as lm-eval returns them. ``zeroed``: bool [forward rows, layers, heads] of every forward
    under a policy (None without one). ``forwards``: model calls; ``new_tokens``: tokens generated over all rows.
    """

    texts: list[str]
    tokens: list[list[int]]
    seconds: float
    forwards: int
    new_tokens: int
    mode: str
    zeroed: torch.Tensor | None = field(default=None, repr=False)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / max(self.seconds, 1e-9)


def _eos_ids(model: PreTrainedModel, tokenizer: Any) -> set[int]:
    # HF generate stops a row at the generation config's end-of-sequence ids.
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    return set() if eos is None else {int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])}


def _stop_strings(tokenizer: Any, until: Sequence[str]) -> list[str]:
    """``until`` plus the tokenizer's end-of-text string, as lm-eval's ``handle_stop_sequences``."""
    out = list(until)
    tid = tokenizer.eos_token_id
    if tid is not None:
        eos = tokenizer.decode(tid, skip_special_tokens=False)
        if eos not in out:
            out.append(eos)
    return out


def _cut(text: str, stops: Sequence[str]) -> str:
    for s in stops:  # lm-eval's postprocess_generated_text: split at each stop in turn
        if s:
            text = text.split(s)[0]
    return text


def generate_until(
    model: PreTrainedModel,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    *,
    until: Sequence[str],
    max_gen_toks: int = 256,
    batch_size: int = 8,
    policy: Policy | None = None,
    mode: Mode = "step",
    progress: bool = False,
) -> Generated:
    """Greedy-decode every token-id prompt until a stop string (see the module docstring for ``mode``)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if max_gen_toks < 1 or batch_size < 1:
        raise ValueError("max_gen_toks and batch_size must be >= 1")
    stops = _stop_strings(tokenizer, until)
    # lm-eval's look-back: the stop string's token count plus 2, decoded from the row's newest tokens.
    lookback = max(len(tokenizer.encode(s, add_special_tokens=False)) for s in stops) + 2
    eos = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    # Longest first, ties by the token ids (lm-eval sorts by -length, then by the context string).
    order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), tokenizer.decode(prompts[i])))
    tokens: list[list[int]] = [[] for _ in prompts]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(prompts), desc=f"generating ({mode})", unit="prompt")
    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    forwards = 0
    ctx = watch(model, policy=policy) if policy is not None else None
    try:
        w = ctx.__enter__() if ctx is not None else None
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            out, n = _decode_batch(
                model, [prompts[i] for i in chunk], tokenizer, stops, lookback, eos, pad_id, max_gen_toks, mode
            )
            forwards += n
            for i, toks in zip(chunk, out, strict=True):
                tokens[i] = toks
            if bar is not None:
                bar.update(len(chunk))
        zeroed = w.zeroed if w is not None else None
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
        model.train(was_training)
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - t0
    texts = [_cut(tokenizer.decode(t, skip_special_tokens=True), stops) for t in tokens]
    return Generated(texts, tokens, seconds, forwards, sum(map(len, tokens)), mode, zeroed)


def _positions(mask: torch.Tensor) -> torch.Tensor:
    # As HF generate: positions count real tokens; pads get 0.
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)


@torch.no_grad()
def _decode_batch(
    model: PreTrainedModel,
    prompts: list[Sequence[int]],
    tokenizer: Any,
    stops: list[str],
    lookback: int,
    eos: set[int],
    pad_id: int,
    max_new: int,
    mode: Mode,
) -> tuple[list[list[int]], int]:
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        mask[r, width - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    cached = mode == "step"
    cache_kw = _compat.cache_kwarg(model)
    out = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask), use_cache=cached, logits_to_keep=1)
    forwards = 1
    past = _compat.output_cache(out) if cached else None
    pos = _positions(mask)[:, -1:]
    gen: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    for step in range(max_new):
        nxt = out.logits[:, -1].argmax(-1).tolist()
        for r, t in enumerate(nxt):
            if done[r]:
                nxt[r] = pad_id  # a finished row is fed padding, as HF generate does
                continue
            gen[r].append(t)
            tail = tokenizer.decode(gen[r][-lookback:], skip_special_tokens=False)
            done[r] = t in eos or any(s in tail for s in stops)
        if all(done) or step == max_new - 1:
            break
        new = torch.tensor(nxt, dtype=torch.long, device=device)[:, None]
        mask = torch.cat([mask, torch.ones_like(new)], dim=1)
        pos = pos + 1
        if cached:
            out = model(
                input_ids=new,
                attention_mask=mask,
                position_ids=pos,
                use_cache=True,
                logits_to_keep=1,
                **{cache_kw: past},
            )
            past = _compat.output_cache(out)
        else:
            ids = torch.cat([ids, new], dim=1)
            out = model(
                input_ids=ids, attention_mask=mask, position_ids=_positions(mask), use_cache=False, logits_to_keep=1
            )
        forwards += 1
    return gen, forwards
