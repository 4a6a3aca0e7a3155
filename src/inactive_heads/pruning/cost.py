"""What running a model costs, measured: parameters, prefill and decode time, KV-cache bytes.

Every measurement runs batch-1 inputs of random token ids (speed does not depend on the text). Prefill is one
forward over ``length`` tokens that fills a KV cache and computes the logits of the last position, as generation's
first step does. Decode is one new token over a KV cache of ``context`` random keys and values (decode speed does
not depend on their content either, and a real ``context``-token prefill would cost minutes on a CPU). Compare
models with :func:`interleaved`, which alternates them so that drifting machine speed hits all alike. ``clock`` is
wall-clock time by default; on a machine shared with other work, ``time.process_time`` with one torch thread counts
the work done rather than the share of the machine this process got.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from transformers import PreTrainedModel

from .. import _compat

__all__ = [
    "decode_seconds",
    "interleaved",
    "kv_cache_bytes",
    "parameter_bytes",
    "prefill_seconds",
]


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters (tied ones once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():  # parameters() yields a shared parameter once; storage ids catch views
        key = p.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += p.numel() * p.element_size()
    return total


def _ids(model: PreTrainedModel, length: int, seed: int) -> torch.Tensor:
    vocab = int(_compat.text_config(model).vocab_size)
    gen = torch.Generator().manual_seed(seed)
    device = _compat.input_embedding_weight(model).device
    return torch.randint(min(4, vocab - 1), vocab, (1, length), generator=gen).to(device)


def _last_logits(model: PreTrainedModel) -> dict[str, int]:
    import inspect

    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


Clock = Callable[[], float]


@torch.no_grad()
def prefill_seconds(model: PreTrainedModel, length: int, *, seed: int = 0, clock: Clock = time.perf_counter) -> float:
    """Seconds of one prefill of ``length`` tokens (KV cache filled, logits of the last position)."""
    ids = _ids(model, length, seed)
    start = clock()
    model(input_ids=ids, use_cache=True, **_last_logits(model))
    return clock() - start


@torch.no_grad()
def _synthetic_cache(
    model: PreTrainedModel, context: int, seed: int
) -> tuple[Any, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A KV cache of ``context`` random positions per layer, shaped as the model's own (pruned layers included)."""
    out = model(input_ids=_ids(model, 1, seed), use_cache=True, **_last_logits(model))
    cache = _compat.output_cache(out)
    gen = torch.Generator().manual_seed(seed)
    states = []
    for keys, values in _compat.cache_states(cache):
        shape = (keys.shape[0], keys.shape[1], context, keys.shape[3])
        states.append((torch.randn(shape, generator=gen).to(keys), torch.randn(shape, generator=gen).to(values)))
    return cache, states


def kv_cache_bytes(model: PreTrainedModel, context: int) -> int:
    """Bytes of the model's KV cache after ``context`` tokens (batch 1)."""
    _, states = _synthetic_cache(model, 1, 0)
    per_token = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in states)
    return per_token * context


@torch.no_grad()
def decode_seconds(
    model: PreTrainedModel, context: int, *, steps: int = 8, seed: int = 0, clock: Clock = time.perf_counter
) -> float:
    """Median seconds of one decoding step over a KV cache of ``context`` tokens (``steps`` steps timed)."""
    cache, states = _synthetic_cache(model, context, seed)
    token = _ids(model, 1, seed + 1)
    kwargs = {_compat.cache_kwarg(model): cache, "use_cache": True, **_last_logits(model)}
    times = []
    for _ in range(steps):
        _compat.set_cache_states(cache, states)  # back to ``context`` tokens: the step appends one
        start = clock()
        model(input_ids=token, **kwargs)
        times.append(clock() - start)
    return statistics.median(times)


def interleaved(
    runs: Mapping[str, Callable[[], float]], repeats: int, *, warmup: bool = True
) -> dict[str, list[float]]:
    """Each run's measurements: ``repeats`` rounds of every run in turn, after one untimed round if ``warmup``."""
    if warmup:
        for run in runs.values():
            run()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            samples[name].append(run())
    return samples
