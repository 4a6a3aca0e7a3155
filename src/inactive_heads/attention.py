"""Attention that also returns the per-head statistics the score functions read, without a [B,H,S,S] tensor.

Two ways compute the same thing:

* a fused kernel of the query's device that returns the log-sum-exp ``lse_i`` per query (see
  :mod:`inactive_heads.kernels`; CPU and CUDA have one). With K in place of V it also gives
  ``(A k)_i = sum_j A_ij k_j``, so the entropy is ``lse_i - scale * q_i . (A k)_i`` and the first-key weight is
  ``exp(scale * q_i . k_0 - lse_i)``: no probability is ever materialised.
* chunked eager (softcapped logits, where the identities break, and devices without such a kernel): softmax over
  query chunks, so extra memory is ``O(B * H * chunk * T)``.

Statistics are float32 whatever the model's dtype: q, k and v are cast to float32 first, and the statistics stay on
the device of the layer that computed them.

Rows are described by the mask alone: query ``i`` is real iff it may attend to its own position, a key is real iff
some real query attends to it. That holds for left and right padding and for KV-cache decoding. As in transformers'
SDPA path, a given mask decides alone; without one, ``is_causal`` means PyTorch's ``is_causal`` (top-left aligned;
every key when there is one query) and ``is_causal=False`` attention to every key.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from .errors import InactiveHeadsError
from .kernels import additive_mask, lse_kernel
from .scores import LayerStats

__all__: list[str] = []  # internal module

_CHUNK_ELEMENTS = 1 << 24  # logits per chunk of the eager kernel (64 MiB in float32)
_ENTROPY_FLOOR = 1e-5
_NEG = torch.finfo(torch.float32).min
# id(mask) -> (the mask, weakly; its version and the shape asked; the answer of _causal_on_real_rows).
_CAUSAL_ANSWERS: dict[int, tuple[weakref.ref[torch.Tensor], tuple[int, torch.Size], bool]] = {}


@dataclass
class Rows:
    """Real positions of each row: real_q [B,S], real_k [B,T]; first_k, last_q, n_q, n_k [B]."""

    real_q: torch.Tensor
    real_k: torch.Tensor
    first_k: torch.Tensor
    last_q: torch.Tensor
    n_q: torch.Tensor
    n_k: torch.Tensor


def _allowed(mask: torch.Tensor | None, batch: int, q_len: int, kv_len: int) -> torch.Tensor | None:
    """bool [B,1,S,T] of permitted (query, key) pairs from a bool or additive float mask; None stays None."""
    if mask is None:
        return None
    mask = mask[:, :, :, :kv_len]
    if mask.dtype != torch.bool:
        mask = mask > torch.finfo(mask.dtype).min / 2
    return mask.expand(batch, 1, q_len, kv_len)


def _causal(kv_len: int, start: int, stop: int, device: torch.device) -> torch.Tensor:
    """The implicit causal mask of queries start..stop-1 when no mask is given: bool [stop-start, T]."""
    return torch.arange(kv_len, device=device)[None, :] <= torch.arange(start, stop, device=device)[:, None]


def _rows(
    allowed: torch.Tensor | None, batch: int, q_len: int, kv_len: int, causal: bool, device: torch.device
) -> Rows:
    if allowed is None:
        real_q = torch.ones(batch, q_len, dtype=torch.bool, device=device)
        reach = q_len if causal else kv_len
        real_k = (torch.arange(kv_len, device=device) < reach).expand(batch, kv_len)
    else:
        diag = torch.arange(q_len, device=device) + (kv_len - q_len)
        real_q = allowed[:, 0, torch.arange(q_len, device=device), diag]
        real_k = (allowed[:, 0] & real_q[:, :, None]).any(dim=1)
    first_k = torch.where(real_k.any(1), real_k.float().argmax(1), 0)
    last_q = q_len - 1 - real_q.flip(1).float().argmax(1)
    return Rows(real_q, real_k, first_k, last_q, real_q.sum(1).clamp(min=1), real_k.sum(1).clamp(min=1))


def _masked_mean(x: torch.Tensor, real: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Mean of x [B,H,L] over positions where real [B,L]; torch.where keeps NaNs of pad positions out."""
    return torch.where(real[:, None, :], x, 0.0).sum(-1) / n[:, None]


def _gather_pos(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B,H,L,...] at position index [B] -> [B,H,...]."""
    idx = index.view(-1, 1, 1, *([1] * (x.dim() - 3))).expand(x.shape[0], x.shape[1], 1, *x.shape[3:])
    return x.gather(2, idx).squeeze(2)


def _causal_on_real_rows(mask: torch.Tensor, allowed: torch.Tensor, real_q: torch.Tensor) -> bool:
    """Whether every real query i attends exactly to keys 0..i (no padding before it, no window); ``allowed`` and
    ``real_q`` are derived from ``mask``."""
    q_len, kv_len = allowed.shape[2], allowed.shape[3]
    if q_len != kv_len:
        return False
    # transformers hands one mask tensor to every layer of a forward, and the answer makes the host wait for the
    # device: it is computed once per mask (and version of it, and shape asked), not once per layer.
    key = (mask._version, allowed.shape)
    hit = _CAUSAL_ANSWERS.get(id(mask))
    if hit is not None and hit[0]() is mask and hit[1] == key:
        return hit[2]
    tril = torch.ones(q_len, kv_len, dtype=torch.bool, device=allowed.device).tril_()
    answer = not ((allowed[:, 0] ^ tril) & real_q[:, :, None]).any()
    for dead in [i for i, (ref, _, _) in _CAUSAL_ANSWERS.items() if ref() is None]:
        del _CAUSAL_ANSWERS[dead]
    _CAUSAL_ANSWERS[id(mask)] = (weakref.ref(mask), key, answer)
    return answer


def _output_only(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    causal: bool,
    scale: float,
    kv_index: torch.Tensor | None,
) -> torch.Tensor:
    """The attention output alone (any fused kernel), each KV head read in place: equal groups by SDPA's own GQA, an
    uneven pruned layout (``kv_index`` nondecreasing, see :mod:`inactive_heads._model`) by one call per KV head.
    Copying K and V out to every query head would cost a decoding step over a long cache about as much as attention."""
    mask = None if allowed is None else additive_mask(allowed, torch.float32)
    causal = allowed is None and causal
    sdpa = torch.nn.functional.scaled_dot_product_attention
    counts = None if kv_index is None else torch.bincount(kv_index, minlength=k.shape[1]).tolist()
    if counts is None or len(set(counts)) == 1:
        return sdpa(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    outs, start = [], 0
    for head, n in enumerate(counts):
        if n:
            kv = slice(head, head + 1)
            part = q[:, start : start + n]
            outs.append(sdpa(part, k[:, kv], v[:, kv], attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True))
            start += n
    return torch.cat(outs, 1)


def _chunked_eager(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    scale: float,
    softcap: float | None,
    first_k: torch.Tensor,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns output [B,H,S,Dv], entropy [B,H,S] and first-key weight [B,H,S]; ``causal``: the implicit mask when
    ``allowed`` is None (a given mask decides alone)."""
    batch, heads, q_len, _ = q.shape
    kv_len = k.shape[2]
    chunk = max(1, _CHUNK_ELEMENTS // max(1, batch * heads * kv_len))
    outs, ents, firsts = [], [], []
    first_idx = first_k.view(-1, 1, 1, 1)
    for start in range(0, q_len, chunk):
        stop = min(q_len, start + chunk)
        keep: torch.Tensor | None
        if allowed is not None:
            keep = allowed[:, :, start:stop]
        else:
            keep = _causal(kv_len, start, stop, q.device) if causal else None
        logits = torch.matmul(q[:, :, start:stop], k.transpose(-1, -2)) * scale
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        if keep is not None:
            logits = logits.masked_fill(~keep, _NEG)
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        probs = torch.exp(logits - lse)
        outs.append(torch.matmul(probs, v))
        ents.append((lse - (probs * logits).sum(-1, keepdim=True)).squeeze(-1))
        firsts.append(probs.gather(-1, first_idx.expand(batch, heads, stop - start, 1)).squeeze(-1))
    return torch.cat(outs, 2), torch.cat(ents, 2), torch.cat(firsts, 2)


def attention_with_stats(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    scale: float,
    needs: frozenset[str],
    softcap: float | None = None,
    gram: torch.Tensor | None = None,
    is_causal: bool = True,
    kv_index: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LayerStats, Rows]:
    """Attention of query [B,H,S,D] over key/value [B,Hkv,T,D] plus the raw statistics in ``needs``.

    Returns the float32 output [B,H,S,Dv] (before the output projection), the statistics (float32 [B,H] each;
    ``random`` is left to the caller) and the row description. ``gram`` [H,Dv,Dv] is needed for fhon.
    ``is_causal`` applies only without ``attention_mask``: causal (top-left aligned) if True, else every key.
    ``kv_index`` (long [H]) names the KV head each query head reads, for a pruned module whose groups are uneven
    (see :mod:`inactive_heads._model`); without it query heads read KV heads in equal consecutive groups.
    """
    batch, heads, q_len, _ = query.shape
    kv_len = key.shape[2]
    q = query.to(torch.float32)
    allowed = _allowed(attention_mask, batch, q_len, kv_len)
    causal = is_causal and q_len > 1  # one query attends to every key either way
    rows = _rows(allowed, batch, q_len, kv_len, causal, query.device)
    k, v = key.to(torch.float32), value.to(torch.float32)
    if not needs and softcap is None:
        return _output_only(q, k, v, allowed, causal, scale, kv_index), LayerStats(), rows
    v_norm = v.norm(dim=-1) if needs & {"ftvvn", "avvn"} else None  # [B,Hkv,T], each KV head's once
    one_query = q_len == 1 and kv_index is None and heads % key.shape[1] == 0
    if kv_index is None and key.shape[1] != heads and not one_query:
        kv_index = torch.arange(heads, device=key.device) // (heads // key.shape[1])
    if kv_index is not None:  # index_select: measured 7-20x faster than repeat_interleave on CPU
        k, v = k.index_select(1, kv_index), v.index_select(1, kv_index)
        v_norm = None if v_norm is None else v_norm.index_select(1, kv_index)

    entropy: torch.Tensor | None = None  # both set by either branch that runs when awft or aeqd is needed
    first_w: torch.Tensor | None = None
    kernel = lse_kernel(query.device, softcap)
    if one_query:
        # A decoding step: the query heads of each KV head become that head's queries, so the cache is read in place
        # (a fused kernel would need K and V copied out to every query head), and one query's probabilities cost no
        # more than a kernel.
        groups = heads // key.shape[1]
        grouped = q.reshape(batch, key.shape[1], groups, q.shape[-1])
        keep = None if allowed is None else allowed[:, :, :1].expand(batch, 1, groups, kv_len)
        out, entropy, first_w = _chunked_eager(grouped, k, v, keep, scale, softcap, rows.first_k, causal=False)
        out, entropy, first_w = (
            out.reshape(batch, heads, 1, -1),
            entropy.reshape(batch, heads, 1),
            first_w.reshape(batch, heads, 1),
        )
        if v_norm is not None and groups > 1:
            v_norm = v_norm.repeat_interleave(groups, dim=1)
    elif kernel is not None:
        # A native causal mode beats an additive mask; right-padded batches are causal on every real query, and
        # what pad queries attend to is never read.
        fused_causal = causal
        if allowed is not None:
            assert attention_mask is not None  # allowed is derived from it
            fused_causal = q_len > 1 and _causal_on_real_rows(attention_mask, allowed, rows.real_q)
        out, lse, ak = kernel.run(
            q.contiguous(),
            k.contiguous(),
            v.contiguous(),
            allowed=None if fused_causal else allowed,
            causal=fused_causal,
            scale=scale,
            want_lse=bool(needs & {"awft", "aeqd"}),
            want_ak="aeqd" in needs,
        )
        if "aeqd" in needs:
            assert lse is not None and ak is not None
            entropy = lse - scale * torch.linalg.vecdot(q, ak)
        if "awft" in needs:
            assert lse is not None
            k_first = _gather_pos(k, rows.first_k)  # [B,H,D]
            first_w = torch.exp(scale * (q @ k_first[..., None]).squeeze(-1) - lse)
            if allowed is not None:  # queries that may not see the first real key give it no weight
                sees_first = allowed[:, 0].gather(2, rows.first_k.view(-1, 1, 1).expand(batch, q_len, 1))
                first_w = first_w * sees_first.squeeze(-1)[:, None]
    elif needs & {"awft", "aeqd"} or softcap is not None:
        out, entropy, first_w = _chunked_eager(q, k, v, allowed, scale, softcap, rows.first_k, causal)
    else:  # neither probabilities nor lse needed: any fused kernel will do
        out = _output_only(q, k, v, allowed, causal, scale, None)

    stats = LayerStats()
    if "awft" in needs:
        assert first_w is not None
        stats.awft = _masked_mean(first_w, rows.real_q, rows.n_q)
    if "aeqd" in needs:
        assert entropy is not None
        # lse - E[logit] cancels two O(|logit|) terms: ~1e-6 noise remains where attention is one-hot (entropy 0).
        entropy = torch.where(entropy < _ENTROPY_FLOOR, 0.0, entropy)
        stats.aeqd = _masked_mean(entropy, rows.real_q, rows.n_q)
    if needs & {"ftvvn", "avvn"}:
        assert v_norm is not None  # [B,H,T]
        stats.ftvvn = _gather_pos(v_norm[..., None], rows.first_k).squeeze(-1)
        stats.avvn = _masked_mean(v_norm, rows.real_k, rows.n_k)
    if needs & {"lthon", "ahon"}:
        o_norm = out.norm(dim=-1)  # [B,H,S]
        stats.lthon = _gather_pos(o_norm[..., None], rows.last_q).squeeze(-1)
        stats.ahon = _masked_mean(o_norm, rows.real_q, rows.n_q)
    if "fhon" in needs:
        if gram is None:
            raise InactiveHeadsError("fhon needs the output projection's Gram matrices")
        # ||W_h o||^2 = o^T (W_h^T W_h) o: a d_head x d_head form per head, not a d_model vector per position.
        quad = torch.linalg.vecdot(out @ gram, out)
        stats.fhon = _masked_mean(quad.clamp(min=0).sqrt(), rows.real_q, rows.n_q)
    return out, stats, rows


def output_of_pairs(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    scale: float,
    softcap: float | None,
    is_causal: bool,
    reads: torch.Tensor,
    rows: torch.Tensor,
    heads: torch.Tensor,
) -> torch.Tensor:
    """The float32 attention output [B,H,S,Dv] of query [B,H,S,D] over a KV cache cut to (row, KV head) pairs:
    key/value [N,1,T,D] hold KV head ``heads[i]`` of row ``rows[i]``, KV head by KV head (see
    :func:`inactive_heads._model.cache_pairs`); ``reads`` [H] names each query head's KV head. A query head whose
    row does not keep its KV head outputs zeros."""
    batch, n_heads, q_len, _ = query.shape
    out = query.new_zeros(batch, n_heads, q_len, value.shape[-1], dtype=torch.float32)
    for kv in heads.unique().tolist():
        pairs = (heads == kv).nonzero().flatten()
        row = rows[pairs]
        q_heads = (reads == kv).nonzero().flatten()
        mask = None if attention_mask is None else attention_mask[row]
        part, _, _ = attention_with_stats(
            query[row][:, q_heads], key[pairs], value[pairs], mask, scale=scale, needs=frozenset(), softcap=softcap,
            is_causal=is_causal,
        )  # fmt: skip
        out[row[:, None], q_heads[None, :]] = part
    return out
