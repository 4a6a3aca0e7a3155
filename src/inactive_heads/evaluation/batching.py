"""Batching strategies: every sequence whole, a few-shot prefix shared as a KV cache, an item's choices packed.

Sequences are sorted by length (longest first), right-padded and passed with an attention mask; only the logits
of continuation positions are computed (:class:`~.forward._Forward`). Without a policy, a context shared by
several sequences can run once (``share_prefix`` of :class:`~.config.EvalConfig`): a long few-shot block common to
many items as a KV cache (:func:`_run_shared`), and each item's context packed with its choices behind it under a
tree mask (:func:`_run_packed`). :func:`_run` returns the order in which sequences ran, which is the order of the
rows an :func:`inactive_heads.engine.watch` around it sees.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedModel

from .. import _compat, _model
from .forward import _Forward, _Read, _reads, _score_rows
from .requests import _positions, _Seq

_AUTO_MIN_PREFIX = 64  # tokens; see _sharing()
_TREE_MASK_IMPLEMENTATIONS = ("sdpa", "eager")  # attention functions that take a custom 4D mask as is


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
    while free:
        width = free[-1][0]
        rows: list[list[int]] = []
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
    progress: bool | Callable[[int], Any],
    share: tuple[int, int] | None,
) -> tuple[list[list[float]], list[list[bool]], list[int], int]:
    """Per sequence: log-likelihood and greedy flag per continuation read from it; the forward order; and how many
    token positions (padding included) ran through the model.

    ``share`` = (min tokens of a few-shot prefix to run once and reuse as a KV cache, min tokens of the prefix
    shared by an item's sequences to run once in a packed row with their rest); None: run every sequence whole.
    ``progress``: True for a tqdm bar over sequences, or a factory ``progress(total)`` of a tqdm-like bar.
    """
    fwd = _Forward(model, pad_id)
    lls: list[list[float]] = [[] for _ in seqs]
    greedy: list[list[bool]] = [[] for _ in seqs]
    bar = None
    if progress is True:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(seqs), desc="sequences")
    elif progress:
        bar = progress(len(seqs))
    order: list[int] = []
    if share is not None:
        cached = _shared_groups(seqs, "fewshot:", share[0])
        order += _run_shared(fwd, seqs, cached, batch_size, lls, greedy, bar) if cached else []
        if _compat.attn_implementation(model) in _TREE_MASK_IMPLEMENTATIONS:
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
    return _model.sliding_window(model) is None


def _sharing(model: PreTrainedModel, share_prefix: bool | None) -> tuple[int, int] | None:
    """The ``share`` argument of :func:`_run` for an evaluation without policy or recording."""
    share = _can_share(model) if share_prefix is None else share_prefix
    # A cached few-shot prefix only pays when long: a 20-token context saves less than the extra prefill
    # forward and cache copies cost (measured: 1.35x slower on PIQA), a 500-token 5-shot block far more.
    # Packing an item's choices behind its context needs no extra forward, so any shared context pays.
    return ((8 if share_prefix else _AUTO_MIN_PREFIX), 1) if share else None
