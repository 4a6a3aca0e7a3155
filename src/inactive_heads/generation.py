"""Batched greedy generation as lm-eval's HFLM ``generate_until`` does it, with heads zeroed while decoding.

Prompts run in lm-eval's order (longest first), ``batch_size`` at a time, left-padded, with positions counted over
real tokens only, so each row decodes as it would alone. A row stops at an end-of-text token, when its decoded tail
contains a stop string (lm-eval's ``MultiTokenEOSCriteria`` look-back) or after ``max_gen_toks`` tokens; its text
is the decoded tokens (special tokens skipped) cut before the first stop string.

Under a policy, ``mode`` says what each zeroing decision sees:

- ``"recompute"`` (the paper's): every step decides, per row and layer, on statistics over all real positions of
  the whole sequence, as if it were re-run under that step's decisions. It runs with a KV cache and, per row, the
  float64 sums of the query-averaged statistics of the sequence so far. A step runs the new token alone, layer by
  layer, deciding each layer on the sums plus the new position's part. While every decision of a row equals its
  previous step's, that is the whole pass exactly: attention is causal, so the earlier positions' keys, values and
  statistics are those already computed under the same decisions. A row whose decisions change (a flip) is re-run
  whole under the new decisions, alone or with the other rows that flipped at that step, rebuilding its cache and
  sums (``Generated.flips`` counts those steps per prompt). Rows that stop leave the batch. Where the policy reads
  the first key or every key (AWFT, FTVVN, AVVN) of a model whose sliding window is shorter than the sequence, a
  step's window sees fewer keys than the whole pass does; such batches are re-run whole at every step.
- ``"step"``: with a KV cache; the prompt's pass decides on the prompt's positions, every later step on the new
  token's single query (what :func:`~inactive_heads.engine.watch` does under ``model.generate``).
- ``"running"``: with a KV cache; every step decides on per-row running means over all positions so far
  (:class:`~inactive_heads.engine.RunningStats`): the paper's statistics without re-running the sequence, exact
  while no head has been zeroed, and computed from each position's own step after that.
- ``"prompt"``: with a KV cache; the prompt's pass decides, per row, and those heads stay zeroed for every generated
  token. A KV head all of whose query heads a row zeroed is never read by that row again, so after the prompt's
  pass the cache keeps (``drop_kv``) only the (row, KV head) pairs still read, as a batch of single-head rows per
  layer. ``Generated`` counts, over the final cache's real positions, the bytes of every KV head (``kv_bytes``), of
  those each row leaves unread (``kv_bytes_droppable``) and of those cut (``kv_bytes_dropped``).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

import torch
from transformers import PreTrainedModel

from . import _compat, _model
from ._tensors import pad_left, real_positions
from .atomic import atomic_write_bytes
from .engine import Policy, RunningStats, watch
from .errors import InactiveHeadsError

__all__ = ["MODES", "BatchCheckpoint", "Generated", "cascade", "flip_share", "generate_until"]

#: Zeroing modes during generation (see the module docstring).
Mode = Literal["recompute", "step", "running", "prompt"]
MODES: tuple[Mode, ...] = ("recompute", "step", "running", "prompt")

#: ``recompute`` as the paper states it, without a cache: every step re-runs the whole sequence (quadratic). The
#: reference that ``recompute`` equals, for tests and benchmarks; not a mode of an evaluation.
NAIVE_RECOMPUTE: Final = "naive-recompute"
# Statistics of keys, not of the new query: a cached step over a sliding window sees fewer keys than a whole pass.
_KEY_STATS = frozenset({"awft", "ftvvn", "avvn"})


@dataclass
class Generated:
    """Outcome of :func:`generate_until`, per prompt in the order given.

    ``tokens``: generated ids up to and including the token that stopped the row. ``texts``: decoded and cut at the
    first stop string, as lm-eval returns them. ``zeroed``: bool [forward rows, layers, heads] of every forward
    under a policy (None without one); in ``recompute``, the decisions of each step, of the rows still decoding.
    ``forwards``: model calls; ``new_tokens``: tokens generated over all rows. ``flips`` (``recompute`` only): per
    prompt, the decoding steps after its prompt's pass at which some layer's decision changed.
    """

    texts: list[str]
    tokens: list[list[int]]
    seconds: float
    forwards: int
    new_tokens: int
    mode: str
    zeroed: torch.Tensor | None = field(default=None, repr=False)
    kv_bytes: int = 0
    kv_bytes_droppable: int = 0
    kv_bytes_dropped: int = 0
    flips: list[int] | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / max(self.seconds, 1e-9)

    @property
    def flip_share(self) -> float | None:
        """The share of decoding steps (after each prompt's pass) at which some decision flipped (``recompute``)."""
        return None if self.flips is None else flip_share(self.flips, self.tokens)


def flip_share(flips: Sequence[int], tokens: Sequence[Sequence[int]]) -> float:
    """The share of decoding steps at which some decision flipped: ``flips`` per row over the steps after each
    row's prompt pass (its generated tokens but the first)."""
    return sum(flips) / max(sum(len(t) - 1 for t in tokens), 1)


@dataclass
class _BatchResult:
    """What :func:`generate_until` keeps of one batch (and a :class:`BatchCheckpoint` stores)."""

    tokens: list[list[int]]
    flips: list[int]
    forwards: int
    zeroed: list[torch.Tensor]
    kv: list[int]
    seconds: float


class BatchCheckpoint:
    """A directory keeping each finished batch of a :func:`generate_until` (its tokens, flips, decisions, forwards,
    KV bytes and seconds; one file per batch, written atomically), so a run cut off resumes at its first unfinished
    batch with the same result. A batch is reused only for the same prompts in the same rows; the caller keys the
    directory by everything else that decides the output (model, policy, mode, budget)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    def _path(self, index: int) -> Path:
        return self.directory / f"batch-{index:05d}.pt"

    def load(self, index: int, rows: list[int], prompts: list[Sequence[int]]) -> _BatchResult | None:
        """Batch ``index`` as stored, or None when it is missing or was for other rows or prompts."""
        path = self._path(index)
        if not path.is_file():
            return None
        stored: dict[str, Any] = torch.load(path, weights_only=True)
        if stored.pop("rows") != rows or stored.pop("prompts") != [list(p) for p in prompts]:
            return None
        return _BatchResult(**stored)

    def save(self, index: int, rows: list[int], prompts: list[Sequence[int]], out: _BatchResult) -> None:
        buf = io.BytesIO()
        torch.save({"rows": rows, "prompts": [list(p) for p in prompts], **asdict(out)}, buf)
        atomic_write_bytes(self._path(index), buf.getvalue())


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
    mode: Mode | Literal["naive-recompute"] = "step",
    progress: bool | Callable[[int], Any] = False,
    drop_kv: bool = True,
    first_row: int = 0,
    checkpoint: BatchCheckpoint | None = None,
) -> Generated:
    """Greedy-decode every token-id prompt until a stop string (see the module docstring for ``mode``).

    ``progress``: True for a tqdm bar over prompts (with its ETA), or a factory ``progress(total)`` of a tqdm-like
    bar. A per-row static mask (``policy.mask`` [prompts, layers, heads]) applies to the prompts in the order
    given. The ``random`` score draws per prompt: prompt ``i`` as row ``first_row + i`` of
    :func:`~inactive_heads.engine.watch`, however it is batched. ``drop_kv``: in prompt mode, cut from the cache the
    KV heads each row never reads. ``mode=NAIVE_RECOMPUTE`` runs ``recompute`` without a cache (the reference).
    ``checkpoint``: keep each finished batch there and reuse those stored (:class:`BatchCheckpoint`); ``seconds``
    is then the sum of every batch's own time, stored ones included.
    """
    if mode not in (*MODES, NAIVE_RECOMPUTE):
        raise InactiveHeadsError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if max_gen_toks < 1 or batch_size < 1:
        raise InactiveHeadsError("max_gen_toks and batch_size must be >= 1")
    if policy is not None and policy.mask is not None and policy.mask.dim() == 3 and len(policy.mask) != len(prompts):
        raise InactiveHeadsError(
            f"a per-row mask has {len(policy.mask)} rows for {len(prompts)} prompts; give one per prompt"
        )
    stops = _stop_strings(tokenizer, until)
    # lm-eval's look-back: the stop string's token count plus 2, decoded from the row's newest tokens.
    lookback = max(len(tokenizer.encode(s, add_special_tokens=False)) for s in stops) + 2
    eos = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    # Longest first, ties by the token ids (lm-eval sorts by -length, then by the context string).
    order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), tokenizer.decode(prompts[i])))
    tokens: list[list[int]] = [[] for _ in prompts]
    bar = None
    if progress is True:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(prompts), desc=f"generating ({mode})", unit="prompt")
    elif progress:
        bar = progress(len(prompts))
    was_training = model.training
    model.eval()
    forwards, kv, seconds = 0, [0, 0, 0], 0.0
    zeroed: list[torch.Tensor] = []
    flips: list[int] | None = [0] * len(prompts) if mode in ("recompute", NAIVE_RECOMPUTE) else None
    try:
        for index, start in enumerate(range(0, len(order), batch_size)):
            chunk = order[start : start + batch_size]
            row_ids = [first_row + i for i in chunk]
            chunk_prompts = [prompts[i] for i in chunk]
            done = None if checkpoint is None else checkpoint.load(index, row_ids, chunk_prompts)
            if done is None:
                done = _run_batch(
                    model, tokenizer, chunk_prompts, row_ids, pad_id, _for_rows(policy, chunk), mode, drop_kv,
                    (stops, lookback, eos, max_gen_toks),
                )  # fmt: skip
                if checkpoint is not None:
                    checkpoint.save(index, row_ids, chunk_prompts, done)
            for k, i in enumerate(chunk):
                tokens[i] = done.tokens[k]
                if flips is not None:
                    flips[i] = done.flips[k]
            forwards += done.forwards
            zeroed += done.zeroed
            kv = [a + b for a, b in zip(kv, done.kv, strict=True)]
            seconds += done.seconds
            if bar is not None:
                bar.update(len(chunk))
    finally:
        model.train(was_training)
        if bar is not None:
            bar.close()
    texts = [_cut(tokenizer.decode(t, skip_special_tokens=True), stops) for t in tokens]
    rows = torch.cat(zeroed) if zeroed else None
    return Generated(
        texts, tokens, seconds, forwards, sum(map(len, tokens)), mode, rows, kv[0], kv[1], kv[2], flips
    )  # fmt: skip


def _run_batch(
    model: PreTrainedModel,
    tokenizer: Any,
    prompts: list[Sequence[int]],
    row_ids: list[int],
    pad_id: int,
    policy: Policy | None,
    mode: str,
    drop_kv: bool,
    stopping: tuple[list[str], int, set[int], int],
) -> _BatchResult:
    """Decode one batch."""
    t0 = time.perf_counter()
    batch: _Batch
    max_gen_toks = stopping[3]
    if mode == "recompute" and _cache_exact(model, policy, max(map(len, prompts)) + max_gen_toks):
        batch = _Recompute(model, prompts, row_ids, pad_id, policy)
    else:
        batch = _Batch(
            model, prompts, row_ids, pad_id, policy, NAIVE_RECOMPUTE if mode == "recompute" else mode, drop_kv
        )
    tokens = batch.run(tokenizer, *stopping)
    zeroed = [z.cpu() for z in batch.zeroed]
    return _BatchResult(tokens, batch.flips, batch.forwards, zeroed, list(batch.kv), time.perf_counter() - t0)


def _for_rows(policy: Policy | None, rows: Sequence[int]) -> Policy | None:
    """``policy`` for a batch of the prompts ``rows`` (a per-prompt mask cut to theirs)."""
    if policy is not None and policy.mask is not None and policy.mask.dim() == 3:
        return replace(policy, mask=policy.mask[list(rows)])
    return policy


def _cache_exact(model: PreTrainedModel, policy: Policy | None, length: int) -> bool:
    """Whether cached ``recompute`` steps see the whole pass's statistics for sequences up to ``length`` tokens."""
    window = _model.sliding_window(model)
    return policy is None or not policy.needs & _KEY_STATS or window is None or window >= length


class _Batch:
    """One left-padded batch decoded greedily under ``policy`` in ``mode``; collects its zeroing rows."""

    def __init__(
        self,
        model: PreTrainedModel,
        prompts: list[Sequence[int]],
        rows: list[int],
        pad_id: int,
        policy: Policy | None,
        mode: str,
        drop_kv: bool,
    ):
        self.model, self.pad_id, self.policy, self.mode, self.drop_kv = model, pad_id, policy, mode, drop_kv
        self.device = next(model.parameters()).device
        self.lengths = [len(p) for p in prompts]
        self.ids, self.mask, self.positions = pad_left(prompts, pad_id=pad_id, device=self.device)
        self.cache_kw = _compat.cache_kwarg(model)
        self.forwards = 0
        self.running = RunningStats() if mode == "running" else None
        self.row_ids = rows  # the prompts' ids: the random score's draws
        self.zeroed: list[torch.Tensor] = []
        self.kv = (0, 0, 0)  # Generated's kv_bytes, kv_bytes_droppable, kv_bytes_dropped
        self.read: list[torch.Tensor] = []  # prompt mode: per layer, the KV heads each row reads (see _kv_read)
        self.flips = [0] * len(prompts)  # recompute: per row, the steps whose decisions changed
        self.decided: torch.Tensor | None = None  # naive recompute: the last forward's decisions [B, L, H]

    def _forward(self, policy: Policy | None, **kwargs: Any) -> Any:
        self.forwards += 1
        if policy is None:
            return self.model(**kwargs, logits_to_keep=1)
        with watch(self.model, policy=policy, running=self.running, rows=self.row_ids) as w:
            out = self.model(**kwargs, logits_to_keep=1)
        assert w.zeroed is not None
        self.zeroed.append(w.zeroed)
        return out

    def _track(self, live: list[int]) -> None:
        """Naive recompute: count the flips of the rows ``live`` still decoding and keep only their decisions."""
        if self.policy is None:
            return
        now = self.zeroed.pop()
        if self.decided is not None:
            for r in live:
                self.flips[r] += not torch.equal(now[r], self.decided[r])
        self.decided = now
        self.zeroed.append(now[live])

    @torch.no_grad()
    def run(self, tokenizer: Any, stops: list[str], lookback: int, eos: set[int], max_new: int) -> list[list[int]]:
        cached = self.mode != NAIVE_RECOMPUTE
        mask = self.mask
        out = self._forward(
            self.policy, input_ids=self.ids, attention_mask=mask, position_ids=self.positions, use_cache=cached
        )
        if not cached:
            self._track(list(range(len(self.lengths))))
        past = _compat.output_cache(out) if cached else None
        # In prompt mode every later step keeps, per row, the heads the prompt's pass zeroed.
        steps = self.policy
        if self.mode == "prompt" and self.policy is not None:
            steps = Policy(mask=self.zeroed[-1].to(self.device))
            self.read = self._kv_read(self.zeroed[-1])
            self._drop_unread(past)
        ids, pos = self.ids, self.positions[:, -1:]
        gen: list[list[int]] = [[] for _ in self.lengths]
        done = [False] * len(gen)
        for step in range(max_new):
            nxt = out.logits[:, -1].argmax(-1).tolist()
            for r, t in enumerate(nxt):
                if done[r]:
                    nxt[r] = self.pad_id  # a finished row is fed padding, as HF generate does
                    continue
                gen[r].append(t)
                done[r] = _stopped(tokenizer, gen[r], lookback, eos, stops)
            if all(done) or step == max_new - 1:
                break
            new = torch.tensor(nxt, dtype=torch.long, device=self.device)[:, None]
            mask = torch.cat([mask, torch.ones_like(new)], dim=1)
            pos = pos + 1
            if cached:
                kw = {self.cache_kw: past}
                out = self._forward(steps, input_ids=new, attention_mask=mask, position_ids=pos, use_cache=True, **kw)
                past = _compat.output_cache(out)
            else:
                ids = torch.cat([ids, new], dim=1)
                out = self._forward(
                    steps, input_ids=ids, attention_mask=mask, position_ids=real_positions(mask), use_cache=False
                )
                self._track([r for r, stopped in enumerate(done) if not stopped])
        if cached:
            self.kv = self._count_kv([n + len(g) - 1 for n, g in zip(self.lengths, gen, strict=True)])
        return gen

    def _kv_read(self, zeroed: torch.Tensor) -> list[torch.Tensor]:
        """Per layer, bool [B, the layer's KV heads]: which KV heads each row reads under per-row ``zeroed`` [B, L, H]
        (original head indexing)."""
        n_kv = _compat.kv_heads(self.model)
        read = []
        for layer, module in enumerate(_model.attention_modules(self.model)):
            kept = _model.query_heads(module)
            zero = zeroed[:, layer] if kept is None else zeroed[:, layer, kept.cpu()]
            reads = _model.reads(module, zero.shape[1], n_kv).cpu()
            read.append(_model.kv_heads_read(zero, reads, _model.kv_count(module, n_kv)))
        return read

    def _drop_unread(self, cache: Any) -> None:
        """Prompt mode: cut from the cache, row by row, every KV head that row never reads again."""
        if not self.drop_kv:
            return
        for layer, read in enumerate(self.read):
            if not read.all():
                rows, heads = _model.cache_pairs(read.to(self.device))
                _compat.keep_cache_pairs(cache, layer, rows, heads)

    def _count_kv(self, positions: list[int]) -> tuple[int, int, int]:
        """Bytes of the final cache over real positions: of every KV head (``kv_bytes``), of the KV heads a row never
        reads after its prompt (prompt mode; ``kv_bytes_droppable``) and of those cut from the cache
        (``kv_bytes_dropped``: the same, less the one pair kept in a layer no row reads)."""
        config = _compat.text_config(self.model)
        heads = _compat.model_shape(self.model)[1]
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        per_position = 2 * head_dim * next(self.model.parameters()).element_size()  # a key and a value
        real = torch.tensor(positions, dtype=torch.float64)
        n_kv = _compat.kv_heads(self.model)
        stored = sum(_model.kv_count(m, n_kv) for m in _model.attention_modules(self.model))
        total = int(real.sum() * stored * per_position)
        if not self.read:
            return total, 0, 0
        unread = dropped = torch.zeros(len(positions), dtype=torch.float64)
        for read in self.read:
            unread = unread + (~read).sum(1)
            if self.drop_kv and not read.all():
                kept = torch.zeros_like(read).index_put_(_model.cache_pairs(read), torch.tensor(True))
                dropped = dropped + (~kept).sum(1)
        return total, int((unread * real).sum() * per_position), int((dropped * real).sum() * per_position)


class _Recompute(_Batch):
    """``recompute`` with a KV cache and per-row float64 running sums (see the module docstring)."""

    def __init__(
        self, model: PreTrainedModel, prompts: list[Sequence[int]], rows: list[int], pad_id: int, policy: Policy | None
    ):
        super().__init__(model, prompts, rows, pad_id, policy, "recompute", drop_kv=False)

    def _pass(self, live: list[int], sums: RunningStats | None, **kwargs: Any) -> tuple[Any, torch.Tensor | None]:
        """A cached forward of the rows ``live`` (indices of this batch's prompts): its output and, under a policy,
        its decisions (bool [rows, layers, heads])."""
        self.forwards += 1
        if self.policy is None:
            return self.model(**kwargs, use_cache=True, logits_to_keep=1), None
        rows = [self.row_ids[r] for r in live]
        with watch(self.model, policy=_for_rows(self.policy, live), running=sums, rows=rows) as w:
            out = self.model(**kwargs, use_cache=True, logits_to_keep=1)
        return out, w.zeroed

    def _sums(self) -> RunningStats | None:
        # Float64: a float32 running sum would round once per step, drifting over hundreds of steps from the whole
        # pass's float32 mean (one rounded sum over the positions). In float64 a step's mean, rounded to float32,
        # differs from the whole pass's only by that pass's own rounding and by the new position's values, which
        # a one-token step computes with products of other shapes (float32 rounding in the last bits). The sums of
        # a whole pass, its float32 mean times the count, are exact in float64, so it decides as the naive pass.
        return RunningStats(torch.float64) if self.policy is not None and self.policy.score is not None else None

    @torch.no_grad()
    def run(self, tokenizer: Any, stops: list[str], lookback: int, eos: set[int], max_new: int) -> list[list[int]]:
        live = list(range(len(self.lengths)))  # the prompts still decoding, in batch order
        ids, mask, pos = self.ids, self.mask, self.positions
        sums = self._sums()
        out, decided = self._pass(live, sums, input_ids=ids, attention_mask=mask, position_ids=pos)
        cache, logits, pos = _compat.output_cache(out), out.logits[:, -1], pos[:, -1:]
        gen: list[list[int]] = [[] for _ in live]
        for step in range(max_new):
            if decided is not None:
                self.zeroed.append(decided)
            nxt = logits.argmax(-1).tolist()
            for r, t in zip(live, nxt, strict=True):
                gen[r].append(t)
            going = [b for b, r in enumerate(live) if not _stopped(tokenizer, gen[r], lookback, eos, stops)]
            if not going or step == max_new - 1:
                break
            if len(going) < len(live):  # stopped rows leave the batch: nothing reads their states again
                keep = torch.tensor(going)  # on the CPU: it indexes cache layers on any device
                live, nxt = [live[b] for b in going], [nxt[b] for b in going]
                ids, mask, pos = ids[keep], mask[keep], pos[keep]
                _compat.set_cache_states(cache, [(k[keep], v[keep]) for k, v in _compat.cache_states(cache)])
                if sums is not None:
                    sums.select(keep)
                decided = None if decided is None else decided[going]
            new = torch.tensor(nxt, dtype=torch.long, device=self.device)[:, None]
            ids, mask, pos = torch.cat([ids, new], 1), torch.cat([mask, torch.ones_like(new)], 1), pos + 1
            out, now = self._pass(live, sums, input_ids=new, attention_mask=mask, position_ids=pos,
                                  **{self.cache_kw: cache})  # fmt: skip
            cache, logits = _compat.output_cache(out), out.logits[:, -1]
            if decided is None or now is None:
                continue
            # A row whose decisions all equal its previous step's had, layer by layer, the whole pass's scores and
            # states. From a row's first differing layer on, its states follow decisions the whole pass would not
            # take there (and its later decisions are moot): the row is re-run.
            flipped = (now != decided).flatten(1).any(1).nonzero().flatten()
            if len(flipped):
                self._rerun(flipped, live, ids, mask, cache, sums, now, logits)
            decided = now
        self.kv = self._count_kv([n + len(g) - 1 for n, g in zip(self.lengths, gen, strict=True)])
        return gen

    def _rerun(
        self,
        flipped: torch.Tensor,
        live: list[int],
        ids: torch.Tensor,
        mask: torch.Tensor,
        cache: Any,
        sums: RunningStats | None,
        decided: torch.Tensor,
        logits: torch.Tensor,
    ) -> None:
        """Re-run the batch rows ``flipped`` (long [k], on the CPU) whole, in the batch's padded layout, as the naive
        loop runs them, and write their cache, sums, decisions and last logits over the cached step's, in place."""
        rows, fresh = mask[flipped], self._sums()
        again, redone = self._pass(
            [live[b] for b in flipped.tolist()], fresh, input_ids=ids[flipped], attention_mask=rows,
            position_ids=real_positions(rows),
        )  # fmt: skip
        states = _compat.cache_states(_compat.output_cache(again))
        for (keys, values), (k, v) in zip(_compat.cache_states(cache), states, strict=True):
            keys[flipped], values[flipped] = k, v
        if sums is not None and fresh is not None:
            sums.assign(flipped, fresh)
        assert redone is not None  # under a policy
        decided[flipped] = redone
        logits[flipped] = again.logits[:, -1]
        for b in flipped.tolist():
            self.flips[live[b]] += 1


def _stopped(tokenizer: Any, tokens: list[int], lookback: int, eos: set[int], stops: list[str]) -> bool:
    """Whether a row's newest token stops it: an end-of-sequence id, or a stop string in its decoded tail."""
    tail = tokenizer.decode(tokens[-lookback:], skip_special_tokens=False)
    return tokens[-1] in eos or any(s in tail for s in stops)


def cascade(baseline: Sequence[Sequence[int]], intervened: Sequence[Sequence[int]]) -> dict[str, Any]:
    """How far zeroing changes generated outputs: per item, the first token position where ``intervened`` leaves
    ``baseline`` (None where the outputs are equal), the share of identical outputs, and the divergence positions'
    quartiles (over the items that diverge)."""
    first: list[int | None] = []
    for a, b in zip(baseline, intervened, strict=True):
        n = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        first.append(None if list(a) == list(b) else n)
    diverged = sorted(k for k in first if k is not None)

    def quantile(q: float) -> float | None:
        return float(torch.tensor(diverged, dtype=torch.float64).quantile(q)) if diverged else None

    return {
        "identical": sum(k is None for k in first) / max(len(first), 1),
        "first_divergence": first,
        "divergence_quartiles": [quantile(q) for q in (0.25, 0.5, 0.75)],
    }
