"""The seam into transformers: one registered attention function that records scores and zeroes heads.

Every supported model routes attention through ``transformers.AttentionInterface``. :func:`watch` switches the
model to the function registered here for the duration of a ``with`` block and restores the model's own
implementation on exit, also after an exception. Inside, each attention call computes the statistics the active
score functions need (see :mod:`inactive_heads.attention`), evaluates the zeroing policy on them for *this* input
and *this* layer, and zeroes heads before the output projection, so later layers see the intervention.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from . import _compat, _model
from ._memory import release_freed_memory
from .attention import Rows, attention_with_stats, output_of_pairs
from .errors import InactiveHeadsError, NonFiniteError, UnknownNameError, UnsupportedModelError, non_finite_hint
from .scores import RAW_STATS, SCORE_FUNCTIONS, HeadScores, LayerStats, ScoreSpec

__all__ = ["Policy", "RunningStats", "Watch", "watch", "zero_heads"]

IMPLEMENTATION = "inactive_heads"  # the name of the registered attention function
_SESSIONS: dict[int, _Session] = {}  # id(attention module) -> the watch it belongs to


@dataclass(frozen=True)
class Policy:
    """Which heads to zero: dynamically by ``score``/``threshold`` per input and layer, or by a static ``mask``.

    ``score="random"`` draws uniform scores in [0, 1) from ``seed``; a head is zeroed when its score passes the
    threshold on the side given by the score function's ``inactive_when``. A ``mask`` is bool [n_layers, n_heads]
    for every row, or [batch, n_layers, n_heads], one per row, for forwards of exactly ``batch`` rows (heads fixed per
    sequence, as when generating with decisions taken on the prompt).
    """

    score: str | None = None
    threshold: float | None = None
    mask: torch.Tensor | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.mask is None) == (self.score is None):
            raise InactiveHeadsError("give either score= and threshold= (dynamic zeroing) or mask= (static), not both")
        if self.score is not None:
            if self.score not in SCORE_FUNCTIONS:
                raise UnknownNameError(f"unknown score {self.score!r}; registered: {', '.join(SCORE_FUNCTIONS)}")
            if self.threshold is None:
                raise InactiveHeadsError(f"score={self.score!r} needs threshold=")
            # A NaN threshold passes no head and a string fails only inside the first forward: refuse both here.
            threshold: object = self.threshold  # annotated float, but callers pass anything
            if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
                raise TypeError(f"threshold must be a number, got {type(threshold).__name__} {threshold!r}")
            if not math.isfinite(threshold):
                raise InactiveHeadsError(f"threshold must be a finite number, got {self.threshold!r}")
        elif self.threshold is not None:
            raise InactiveHeadsError("threshold= applies to score=, not to a static mask=")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"seed must be an int, got {type(self.seed).__name__} {self.seed!r}")
        if self.mask is not None and (self.mask.dtype != torch.bool or self.mask.dim() not in (2, 3)):
            raise InactiveHeadsError(
                "mask must be a bool tensor [n_layers, n_heads] or [batch, n_layers, n_heads], got "
                f"{self.mask.dtype} {tuple(self.mask.shape)}"
            )

    @property
    def needs(self) -> frozenset[str]:
        return SCORE_FUNCTIONS[self.score].needs if self.score is not None else frozenset()


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    position_bias: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The registered attention function, with the signature of transformers' ``sdpa_attention_forward``.

    Causality follows SDPA's rule: a given mask decides alone; without one, ``is_causal`` (else the module's
    ``is_causal``, else True) chooses between causal attention and attention to every key. ``dropout`` is not
    applied: a :func:`watch` refuses a model in training mode.
    """
    session = _SESSIONS.get(id(module))
    if kwargs.get("s_aux") is not None:
        raise UnsupportedModelError(
            f"{type(module).__name__} uses attention sinks (s_aux); inactive-heads does not support them yet"
        )
    if position_bias is not None:
        raise UnsupportedModelError(
            f"{type(module).__name__} adds a position bias to its logits; inactive-heads does not support it yet"
        )
    scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    softcap = kwargs.get("softcap")
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    if session is None:  # outside a watch (a pruned model, or one left on this implementation): plain attention
        out, _, _ = attention_with_stats(
            query,
            key,
            value,
            attention_mask,
            scale=scale,
            needs=frozenset(),
            softcap=softcap,
            is_causal=causal,
            kv_index=_model.kv_index(module),
        )
        return out.to(query.dtype).transpose(1, 2).contiguous(), None
    return session.attend(module, query, key, value, attention_mask, scale, softcap, causal), None


@dataclass
class _LayerStep:
    """One layer's part of a forward, on that layer's device: raw statistics [len(RAW_STATS), B, H] (when recording),
    zeroing decisions [B, H] (under a policy) and ``finite`` [len(computed)] bool, whether each statistic it computed
    is finite on every real row (checked in flush(), so that the forward never waits for the device)."""

    raw: torch.Tensor | None
    zeroed: torch.Tensor | None
    finite: torch.Tensor
    computed: tuple[str, ...]
    dtype: torch.dtype


def _finite_flags(stats: LayerStats, real_rows: torch.Tensor) -> tuple[tuple[str, ...], torch.Tensor]:
    """The statistics present in ``stats`` and, for each, whether it is finite on every real row (bool [n])."""
    present = tuple(n for n in RAW_STATS if getattr(stats, n) is not None)
    if not present:
        return present, torch.ones(0, dtype=torch.bool, device=real_rows.device)
    values = torch.stack([getattr(stats, n) for n in present])  # [n, B, H]
    finite = torch.isfinite(values) | ~real_rows[None, :, None]  # pad rows (no real query) may hold anything
    return present, finite.flatten(1).all(1)


def _to_cpu(tensors: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
    """Same-shaped per-layer tensors on the CPU: stacked on each device they are on, one copy per device."""
    by_device: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}
    for i, t in enumerate(tensors):
        assert t is not None  # every layer holds one when any does
        by_device.setdefault(t.device, []).append((i, t))
    out: dict[int, torch.Tensor] = {}
    for pairs in by_device.values():
        host = torch.stack([t for _, t in pairs]).cpu()
        out.update(zip((i for i, _ in pairs), host, strict=True))
    return [out[i] for i in range(len(tensors))]


class RunningStats:
    """Per-row running means of the query-averaged statistics over successive forwards of one batch: what a zeroing
    decision sees while decoding with a KV cache in ``running`` mode (``watch(..., running=RunningStats())``, one per
    batch, its rows in the same order at every step).

    A cached step has only its new queries. The statistics averaged over queries (AWFT, AEQD, AHON, FHON) become the
    mean over every position so far, each position's value as computed at its own step; the others already cover the
    sequence (AVVN and FTVVN read every cached key, LTHON is the newest query). So while no head has been zeroed, a
    step's scores are those of one uncached forward over the whole sequence, every score function exactly. Once heads
    are zeroed they are not: past positions keep the values, and the hidden states, of the decisions of their step,
    where the paper's ``recompute`` re-runs them under the newest decision.
    """

    MEANS = ("awft", "aeqd", "ahon", "fhon")

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype  # of the sums; the means handed to the score functions keep the statistics' dtype
        self._sums: dict[int, dict[str, torch.Tensor]] = {}
        self._counts: dict[int, torch.Tensor] = {}

    def update(self, layer: int, stats: LayerStats, n_queries: torch.Tensor) -> None:
        """Fold this forward's ``stats`` of ``layer`` (``n_queries`` [B] real queries per row) into the running sums
        and replace its query means by the running means, in place."""
        n = n_queries.to(self.dtype)[:, None]
        before = self._counts.get(layer)
        if before is not None and before.shape[0] != n.shape[0]:
            raise InactiveHeadsError(
                f"running statistics of {before.shape[0]} rows applied to a forward of {n.shape[0]} rows; use one "
                "RunningStats per batch"
            )
        total = n if before is None else before + n
        sums = self._sums.setdefault(layer, {})
        for name in self.MEANS:
            value = getattr(stats, name)
            if value is None:
                continue
            added = value.to(self.dtype) * n
            running = added if name not in sums else sums[name] + added
            sums[name] = running
            setattr(stats, name, (running / total).to(value.dtype))
        self._counts[layer] = total

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows ``rows`` (long [k]), in that order: for a batch that rows have left."""
        for layer, count in self._counts.items():
            self._counts[layer] = count[rows.to(count.device)]
            for name, value in self._sums[layer].items():
                self._sums[layer][name] = value[rows.to(value.device)]

    def assign(self, rows: torch.Tensor, other: RunningStats) -> None:
        """Replace the sums of batch rows ``rows`` (long [k]) by those of ``other``, a batch of k rows (the same
        rows run again on their own)."""
        for layer, count in self._counts.items():
            count[rows.to(count.device)] = other._counts[layer].to(count.dtype)
            for name, value in self._sums[layer].items():
                value[rows.to(value.device)] = other._sums[layer][name].to(value.dtype)


class _Session:
    """State of one :func:`watch` block: per-layer buffers of the current forward, and finished forwards.

    On a pruned model every per-head tensor it hands out is in the original head indexing: ``kept[layer]`` names the
    heads a layer still has, recorded scores of removed heads are NaN and removed heads are never zeroed.
    """

    def __init__(
        self,
        layers: dict[int, int],
        n_heads: int,
        policy: Policy | None,
        record: bool,
        seed: int,
        kept: list[torch.Tensor | None] | None = None,
        running: RunningStats | None = None,
        kv_heads: list[int] | None = None,
        rows: Sequence[int] | None = None,
    ):
        self.layers = layers  # id(attention module) -> layer index
        self.n_layers = len(layers)
        self.n_heads = n_heads
        self.kept = kept if kept is not None else [None] * self.n_layers  # per layer: original heads left, or all
        self.kv_heads = kv_heads  # per layer: the module's KV heads (a cut cache holds other shapes)
        self.policy = policy
        self.record = record
        self.seed = seed
        self.running = running
        self.row_ids = None if rows is None else list(rows)
        self.needs = (frozenset(RAW_STATS) if record else frozenset()) | (policy.needs if policy else frozenset())
        self.grams: dict[int, torch.Tensor] = {}
        self.rows_seen = 0
        # Per layer of the current forward, on that layer's device until flush() gathers them to the CPU at once.
        self._step: dict[int, _LayerStep] = {}
        self._masks: dict[torch.device, torch.Tensor] = {}  # the static mask on each device it was used on
        self._raw: list[torch.Tensor] = []  # per finished forward: [len(RAW_STATS), B, n_layers, H]
        self._zeroed: list[torch.Tensor] = []
        # What zeroed()/scores() last returned; concatenating every forward again on each read is O(rows).
        self._zeroed_all: torch.Tensor | None = None
        self._scores_all: HeadScores | None = None
        self._scores_for: tuple[ScoreSpec, ...] = ()  # the registry _scores_all was derived with
        if policy is not None and policy.mask is not None and tuple(policy.mask.shape[-2:]) != (self.n_layers, n_heads):
            raise InactiveHeadsError(
                f"mask has shape {tuple(policy.mask.shape)} but the model has {self.n_layers} layers x {n_heads} heads"
            )

    def attend(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        scale: float,
        softcap: float | None,
        is_causal: bool,
    ) -> torch.Tensor:
        layer = self.layers[id(module)]
        if layer in self._step:  # a layer seen twice means a new forward started
            self.flush()
        batch = query.shape[0]
        kept = self.kept[layer]
        expected = self.n_heads if kept is None else len(kept)
        if query.shape[1] != expected:
            raise InactiveHeadsError(f"layer {layer} has {query.shape[1]} query heads, expected {expected}")
        needs = self.needs - {"random"}
        gram = self._gram(module, query.shape[1], value.shape[-1], value.device) if "fhon" in needs else None
        static = self._static_zero(layer, batch, kept, query.device)
        rows: Rows | None = None
        if self.kv_heads is not None and (key.shape[0], key.shape[1]) != (batch, self.kv_heads[layer]):
            out = self._attend_cut_cache(module, layer, static, query, key, value, mask, scale, softcap, is_causal)
            stats = LayerStats()
        else:
            out, stats, rows = attention_with_stats(
                query,
                key,
                value,
                mask,
                scale=scale,
                needs=needs,
                softcap=softcap,
                gram=gram,
                is_causal=is_causal,
                kv_index=_model.kv_index(module),
            )
        if "random" in self.needs:
            draws = self._random(layer, batch)  # drawn for every original head: a head's draw survives pruning
            stats.random = (draws if kept is None else draws[:, kept.cpu()]).to(out.device)
        real = rows.real_q.any(1) if rows is not None else torch.ones(batch, dtype=torch.bool, device=out.device)
        computed, finite = _finite_flags(stats, real)
        if self.running is not None:
            assert rows is not None  # refused above with a cut cache
            self.running.update(layer, stats, rows.n_q)

        zero = None
        if self.policy is not None:
            if static is not None:
                zero = static
            else:
                assert self.policy.score is not None and self.policy.threshold is not None  # see Policy
                spec = SCORE_FUNCTIONS[self.policy.score]
                zero = spec.passes(spec(stats), self.policy.threshold)
            # Zeroing o before the output projection; the projection's bias, if any, stays.
            out = out * (~zero).to(out.dtype)[:, :, None, None]
        # Score functions run once over all rows and layers when the scores are read (HeadScores.derive), not
        # per layer: 16 small calls per layer were a third of the recording overhead on short inputs.
        raw = torch.stack([getattr(stats, n) for n in RAW_STATS]) if self.record else None
        if kept is not None:  # back to the original head indexing: removed heads score NaN and are never zeroed
            raw = None if raw is None else _scatter_heads(raw, kept, self.n_heads, math.nan)
            zero = None if zero is None else _scatter_heads(zero, kept, self.n_heads, False)
        self._step[layer] = _LayerStep(raw, zero, finite, computed, query.dtype)
        last = len(self._step) == self.n_layers
        if last:
            self.flush()
        result = out.to(query.dtype).transpose(1, 2).contiguous()
        del out, stats, rows
        if last and query.device.type == "cpu":
            release_freed_memory()
        return result

    def flush(self) -> None:
        """Close the current forward: gather its layers to the CPU and stack them into [rows, layers, heads]."""
        if not self._step:
            return
        if len(self._step) != self.n_layers:
            missing = sorted(set(range(self.n_layers)) - set(self._step))
            self._step.clear()
            raise RuntimeError(f"a forward pass skipped attention layers {missing}; cannot attribute its scores")
        steps = [self._step[i] for i in range(self.n_layers)]
        self._step.clear()
        # The whole forward is queued by now: one device-to-host copy per device and kind, one wait per device.
        for layer, (step, finite) in enumerate(zip(steps, _to_cpu([s.finite for s in steps]), strict=True)):
            if not finite.all():
                name = step.computed[int((~finite).nonzero()[0])]
                raise NonFiniteError(
                    f"non-finite {name} statistic in attention layer {layer}; {non_finite_hint(step.dtype)}"
                )
        batch = 0
        if self.record:
            self._raw.append(torch.stack(_to_cpu([s.raw for s in steps]), 2))
            batch = self._raw[-1].shape[1]
        if self.policy is not None:
            self._zeroed.append(torch.stack(_to_cpu([s.zeroed for s in steps]), 1))
            batch = self._zeroed[-1].shape[0]
        self.rows_seen += batch
        self._zeroed_all = self._scores_all = None

    def _static_zero(
        self, layer: int, batch: int, kept: torch.Tensor | None, device: torch.device
    ) -> torch.Tensor | None:
        """A static mask policy's heads to zero in ``layer`` (bool [B, heads the module has]); None without one."""
        if self.policy is None or self.policy.mask is None:
            return None
        if device not in self._masks:
            self._masks[device] = self.policy.mask.to(device)
        static = self._masks[device]
        if static.dim() == 3 and static.shape[0] != batch:
            raise InactiveHeadsError(f"a per-row mask for {static.shape[0]} rows applied to a forward of {batch} rows")
        zero = static[layer].expand(batch, -1) if static.dim() == 2 else static[:, layer]
        return zero if kept is None else zero[:, kept.to(zero.device)]  # the mask is in the original indexing

    def _attend_cut_cache(
        self,
        module: torch.nn.Module,
        layer: int,
        static: torch.Tensor | None,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        scale: float,
        softcap: float | None,
        is_causal: bool,
    ) -> torch.Tensor:
        """Attention over a KV cache cut to the (row, KV head) pairs the static mask ``static`` leaves read
        (generation's prompt mode; :func:`~inactive_heads._model.cache_pairs`)."""
        assert self.kv_heads is not None
        n_kv = self.kv_heads[layer]
        if static is None or self.needs or self.running is not None:
            raise InactiveHeadsError(
                f"layer {layer}'s KV cache holds {tuple(key.shape[:2])} (rows, KV heads) for a batch of "
                f"{query.shape[0]} rows and {n_kv} KV heads: a cut cache works only under the static mask that cut "
                "it, without recording or running statistics"
            )
        reads = _model.reads(module, query.shape[1], n_kv)
        rows, heads = _model.cache_pairs(_model.kv_heads_read(static, reads, n_kv))
        if len(rows) != key.shape[0]:
            raise InactiveHeadsError(
                f"layer {layer}'s KV cache holds {key.shape[0]} pairs, but this mask reads {len(rows)}"
            )
        return output_of_pairs(
            query, key, value, mask, scale=scale, softcap=softcap, is_causal=is_causal, reads=reads, rows=rows,
            heads=heads,
        )  # fmt: skip

    def _random(self, layer: int, batch: int) -> torch.Tensor:
        # One generator per (seed, row, layer): a row's draws do not depend on how rows were batched.
        draws = []
        ids = range(self.rows_seen, self.rows_seen + batch) if self.row_ids is None else self.row_ids
        if len(ids) != batch:
            raise InactiveHeadsError(f"watch(rows=) names {len(ids)} rows, but a forward has {batch}")
        for row in ids:
            gen = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}/{row}/{layer}".encode()))
            draws.append(torch.rand(self.n_heads, generator=gen))
        return torch.stack(draws)

    def _gram(self, module: torch.nn.Module, heads: int, head_dim: int, device: torch.device) -> torch.Tensor:
        key = id(module)
        if key not in self.grams:
            weight = _model.output_projection(module, heads * head_dim)  # [d_model, H*D]
            per_head = weight.detach().to(torch.float32).reshape(weight.shape[0], heads, head_dim)
            self.grams[key] = torch.einsum("mhd,mhe->hde", per_head, per_head).to(device)
        return self.grams[key]

    def zeroed(self) -> torch.Tensor | None:
        self.flush()
        if self.policy is None:
            return None
        if self._zeroed_all is None:
            empty = torch.zeros(0, self.n_layers, self.n_heads, dtype=torch.bool)
            self._zeroed_all = torch.cat(self._zeroed) if self._zeroed else empty
        return self._zeroed_all

    def scores(self) -> HeadScores | None:
        self.flush()
        if not self.record:
            return None
        specs = tuple(SCORE_FUNCTIONS.values())
        if self._scores_all is None or specs != self._scores_for:  # a score registered since is derived too
            self._scores_all, self._scores_for = self._all_scores(), specs
        return self._scores_all

    def _all_scores(self) -> HeadScores:
        if not self._raw:
            shape = (0, self.n_layers, self.n_heads)
            return HeadScores({n: torch.zeros(shape) for n in SCORE_FUNCTIONS})
        raw = torch.cat(self._raw, 1)
        if any(k is not None for k in self.kept):
            return self._pruned_scores(raw)
        # Every raw statistic is also the score of the same name; derive computes the others from them.
        derived = HeadScores(dict(zip(RAW_STATS, raw, strict=True))).derive(SCORE_FUNCTIONS)
        return HeadScores({n: derived[n] for n in SCORE_FUNCTIONS})

    def _pruned_scores(self, raw: torch.Tensor) -> HeadScores:
        # Layer-normalised scores average over the heads a layer has: derive per layer over its remaining heads.
        out = {n: torch.full((raw.shape[1], self.n_layers, self.n_heads), math.nan) for n in SCORE_FUNCTIONS}
        for layer, kept in enumerate(self.kept):
            heads = torch.arange(self.n_heads) if kept is None else kept.cpu()
            layer_raw = raw[:, :, layer][:, :, heads][:, :, None]  # [stats, rows, 1, kept]
            derived = HeadScores(dict(zip(RAW_STATS, layer_raw, strict=True))).derive(SCORE_FUNCTIONS)
            for name in SCORE_FUNCTIONS:
                out[name][:, layer, heads] = derived[name][:, 0]
        return HeadScores(out)


def _scatter_heads(x: torch.Tensor, kept: torch.Tensor, n_heads: int, fill: float | bool) -> torch.Tensor:
    """``x [..., H_kept]`` placed at the original heads ``kept`` of ``[..., n_heads]``; ``fill`` elsewhere."""
    full = torch.full((*x.shape[:-1], n_heads), fill, dtype=x.dtype, device=x.device)
    full[..., kept.to(x.device)] = x
    return full


def in_watch(model: torch.nn.Module) -> bool:
    """Whether ``model`` is inside a :func:`watch` block now."""
    return any(id(m) in _SESSIONS for m in _model.attention_modules(model))


class Watch:
    """Handle returned by :func:`watch` / :func:`zero_heads`; readable during and after the block."""

    def __init__(self, session: _Session):
        self._session = session

    @property
    def zeroed(self) -> torch.Tensor | None:
        """bool [rows_seen, n_layers, n_heads]: which heads were zeroed on each row (forward-call order)."""
        return self._session.zeroed()

    @property
    def fraction_zeroed(self) -> float:
        """Fraction of (row, layer, head) triples zeroed; 0.0 without a policy or rows."""
        zeroed = self.zeroed
        return float(zeroed.float().mean()) if zeroed is not None and zeroed.numel() else 0.0

    @property
    def scores(self) -> HeadScores | None:
        """Every registered score of every row seen, [rows_seen, n_layers, n_heads] each (when ``record=True``)."""
        return self._session.scores()

    @property
    def rows_seen(self) -> int:
        self._session.flush()
        return self._session.rows_seen


@contextlib.contextmanager
def watch(
    model: PreTrainedModel,
    policy: Policy | None = None,
    *,
    record: bool = False,
    running: RunningStats | None = None,
    rows: Sequence[int] | None = None,
) -> Iterator[Watch]:
    """Within the block, every forward of ``model`` records all scores (``record``) and/or applies ``policy``.

    The model's attention implementation is restored on exit. With ``record=True`` under a policy, the scores are
    those of the intervened forward. ``running``: decide (and record) on running means over this and earlier
    forwards of the same batch, for decoding with a KV cache (see :class:`RunningStats`). ``rows``: ids of the
    rows of every forward in the block, which seed the ``random`` score's draws (default: rows counted from 0 over
    the block's forwards), so one input draws the same wherever it is batched.
    """
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"expected a transformers PreTrainedModel, got {type(model).__name__}")
    if not _compat.can_set_attn_implementation(model):
        raise UnsupportedModelError(
            f"{type(model).__name__} does not route attention through transformers' AttentionInterface, "
            "so inactive-heads cannot hook it"
        )
    if model.training:
        raise InactiveHeadsError("model is in training mode (dropout would randomise scores); call model.eval() first")
    modules = _model.attention_modules(model)
    layers = {id(m): i for i, m in enumerate(modules)}
    if any(i in _SESSIONS for i in layers):
        raise RuntimeError("this model is already inside a watch/zero_heads block; nesting is not supported")
    kept = [_model.query_heads(m) for m in modules]
    kv_heads = [_model.kv_count(m, _compat.kv_heads(model)) for m in modules]
    seed = policy.seed if policy else 0
    session = _Session(layers, _compat.model_shape(model)[1], policy, record, seed, kept, running, kv_heads, rows)
    with _compat.set_attn_implementation(model, IMPLEMENTATION):
        try:
            _SESSIONS.update(dict.fromkeys(layers, session))
            yield Watch(session)
            session.flush()
        finally:
            for i in layers:
                _SESSIONS.pop(i, None)


def zero_heads(
    model: PreTrainedModel,
    *,
    score: str | None = None,
    threshold: float | None = None,
    mask: torch.Tensor | None = None,
    seed: int = 0,
) -> contextlib.AbstractContextManager[Watch]:
    """Zero heads during the block: per input and layer by ``score``/``threshold``, or statically by ``mask``."""
    return watch(model, Policy(score=score, threshold=threshold, mask=mask, seed=seed))


_compat.register_attention(IMPLEMENTATION, _attention)
