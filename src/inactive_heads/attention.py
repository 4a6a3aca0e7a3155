"""Attention that also returns the per-head statistics the score functions read, without a [B,H,S,S] tensor.

Two kernels compute the same thing:

* fused (CPU, no logit softcap): PyTorch's CPU flash kernel returns the log-sum-exp ``lse_i`` per query. With
  ``[V | K]`` as values it also returns ``sum_j A_ij k_j``, so the entropy is ``lse_i - scale * q_i . (A k)_i`` and
  the first-key weight is ``exp(scale * q_i . k_0 - lse_i)``: no probability is ever materialised.
* chunked eager (softcapped logits, where the identity above breaks, and other devices): softmax over query chunks,
  so extra memory is ``O(B * H * chunk * S)``.

Rows are described by the additive mask alone: query ``i`` is real iff it may attend to its own position, a key is
real iff some real query attends to it. That holds for left and right padding and for KV-cache decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .scores import LayerStats

__all__: list[str] = []  # internal module

_CHUNK_ELEMENTS = 1 << 24  # logits per chunk of the eager kernel (64 MiB in float32)
_ENTROPY_FLOOR = 1e-5


@dataclass
class _Rows:
    """Which positions of each row are real. Shapes: real_q [B,S], real_k [B,T], first_k/last_q/n_q/n_k [B]."""

    allowed: torch.Tensor  # bool [B,1,S,T]
    real_q: torch.Tensor
    real_k: torch.Tensor
    first_k: torch.Tensor
    last_q: torch.Tensor
    n_q: torch.Tensor
    n_k: torch.Tensor


def additive_mask(mask: torch.Tensor | None, batch: int, q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """A float32 additive mask ``[B,1,S,T]`` (0 = attend) from whatever the model passed (float, bool or None)."""
    if mask is None:
        # No mask from the model means plain causal attention, aligned at the end as in KV-cache decoding.
        q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
        keep = torch.arange(kv_len, device=device)[None, :] <= q_pos
        return torch.where(keep, 0.0, torch.finfo(torch.float32).min).expand(batch, 1, q_len, kv_len)
    mask = mask[:, :, :, :kv_len]
    if mask.dtype == torch.bool:
        return torch.where(mask, 0.0, torch.finfo(torch.float32).min).expand(batch, 1, q_len, kv_len)
    floor = torch.finfo(mask.dtype).min / 2
    out = mask.to(torch.float32)
    # Re-saturate: a bf16 "minus infinity" must stay below every real logit in float32 too.
    return torch.where(mask > floor, out, torch.finfo(torch.float32).min).expand(batch, 1, q_len, kv_len)


def _rows(mask: torch.Tensor) -> _Rows:
    _batch, _, q_len, kv_len = mask.shape
    allowed = mask > torch.finfo(torch.float32).min / 2
    diag = torch.arange(q_len, device=mask.device) + (kv_len - q_len)
    real_q = allowed[:, 0, torch.arange(q_len, device=mask.device), diag]
    real_k = (allowed[:, 0] & real_q[:, :, None]).any(dim=1)
    first_k = torch.where(real_k.any(1), real_k.float().argmax(1), 0)
    last_q = q_len - 1 - real_q.flip(1).float().argmax(1)
    n_q = real_q.sum(1).clamp(min=1)
    n_k = real_k.sum(1).clamp(min=1)
    return _Rows(allowed, real_q, real_k, first_k, last_q, n_q, n_k)


def _masked_mean(x: torch.Tensor, real: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Mean of x [B,H,L] over positions where real [B,L]; torch.where keeps NaNs of pad positions out."""
    return torch.where(real[:, None, :], x, 0.0).sum(-1) / n[:, None]


def _gather_pos(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B,H,L,...] at position index [B] -> [B,H,...]."""
    idx = index.view(-1, 1, 1, *([1] * (x.dim() - 3))).expand(x.shape[0], x.shape[1], 1, *x.shape[3:])
    return x.gather(2, idx).squeeze(2)


def _fused(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, want_ak: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    if not want_ak:
        out, lse = flash(q, k, v, 0.0, False, attn_mask=mask, scale=scale)
        return out, lse, None
    dv = v.shape[-1]
    # The kernel needs one head size for q, k and v: pad q and k with zeros to the width of [V | K].
    q2 = torch.nn.functional.pad(q, (0, dv))
    k2 = torch.nn.functional.pad(k, (0, dv))
    out2, lse = flash(q2, k2, torch.cat([v, k], dim=-1), 0.0, False, attn_mask=mask, scale=scale)
    return out2[..., :dv], lse, out2[..., dv:]


def _chunked_eager(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    softcap: float | None,
    first_k: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns output [B,H,S,Dv], entropy [B,H,S] and first-key weight [B,H,S]."""
    batch, heads, q_len, _ = q.shape
    kv_len = k.shape[2]
    chunk = max(1, _CHUNK_ELEMENTS // max(1, batch * heads * kv_len))
    outs, ents, firsts = [], [], []
    first_idx = first_k.view(-1, 1, 1, 1)
    for start in range(0, q_len, chunk):
        logits = torch.matmul(q[:, :, start : start + chunk], k.transpose(-1, -2)) * scale
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        logits = logits + mask[:, :, start : start + chunk]
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        probs = torch.exp(logits - lse)
        outs.append(torch.matmul(probs, v))
        ents.append((lse - torch.where(probs > 0, probs * logits, 0.0).sum(-1, keepdim=True)).squeeze(-1))
        firsts.append(probs.gather(-1, first_idx.expand(batch, heads, probs.shape[2], 1)).squeeze(-1))
    return torch.cat(outs, 2), torch.cat(ents, 2), torch.cat(firsts, 2)


def _can_fuse(query: torch.Tensor, softcap: float | None) -> bool:
    # The log-sum-exp identities assume plain softmax(q.k * scale + mask); softcapping breaks them.
    return query.device.type == "cpu" and softcap is None


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
) -> tuple[torch.Tensor, LayerStats, _Rows]:
    """Attention of query [B,H,S,D] over key/value [B,Hkv,T,D] plus the raw statistics in ``needs``.

    Returns the float32 output [B,H,S,Dv] (kernel layout, before the output projection), the statistics (float32
    [B,H] each; ``random`` is left to the caller) and the row description. ``gram`` [H,Dv,Dv] is needed for fhon.
    """
    batch, heads, q_len, _ = query.shape
    kv_len = key.shape[2]
    groups = heads // key.shape[1]
    q = query.to(torch.float32)
    k = key.to(torch.float32).repeat_interleave(groups, dim=1)
    v = value.to(torch.float32).repeat_interleave(groups, dim=1)
    mask = additive_mask(attention_mask, batch, q_len, kv_len, query.device)
    rows = _rows(mask)

    want_probs = bool(needs & {"awft", "aeqd"})
    entropy = first_w = None
    if _can_fuse(query, softcap):
        out, lse, ak = _fused(q.contiguous(), k.contiguous(), v.contiguous(), mask, scale, "aeqd" in needs)
        if "aeqd" in needs:
            entropy = lse - scale * (q * ak).sum(-1)
        if "awft" in needs:
            k_first = _gather_pos(k, rows.first_k)  # [B,H,D]
            mask_first = mask[:, 0].gather(2, rows.first_k.view(-1, 1, 1).expand(batch, q_len, 1)).squeeze(-1)
            first_w = torch.exp(scale * (q * k_first[:, :, None]).sum(-1) + mask_first[:, None] - lse)
    elif want_probs or query.device.type == "cpu":
        out, entropy, first_w = _chunked_eager(q, k, v, mask, scale, softcap, rows.first_k)
    else:
        # Neither probabilities nor lse needed: any fused kernel will do.
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    stats = LayerStats()
    if "awft" in needs:
        stats.awft = _masked_mean(first_w, rows.real_q, rows.n_q)
    if "aeqd" in needs:
        # lse - E[logit] cancels two O(|logit|) terms: ~1e-6 noise remains where attention is one-hot (entropy 0).
        entropy = torch.where(entropy < _ENTROPY_FLOOR, 0.0, entropy)
        stats.aeqd = _masked_mean(entropy, rows.real_q, rows.n_q)
    if needs & {"ftvvn", "avvn"}:
        v_norm = v.norm(dim=-1)  # [B,H,T]
        stats.ftvvn = _gather_pos(v_norm[..., None], rows.first_k).squeeze(-1)
        stats.avvn = _masked_mean(v_norm, rows.real_k, rows.n_k)
    if needs & {"lthon", "ahon"}:
        o_norm = out.norm(dim=-1)  # [B,H,S]
        stats.lthon = _gather_pos(o_norm[..., None], rows.last_q).squeeze(-1)
        stats.ahon = _masked_mean(o_norm, rows.real_q, rows.n_q)
    if "fhon" in needs:
        if gram is None:
            raise ValueError("fhon needs the output projection's Gram matrices")
        # ||W_h o||^2 = o^T (W_h^T W_h) o: a d_head x d_head form per head instead of a d_model vector per position.
        quad = torch.einsum("bhsd,hde,bhse->bhs", out, gram, out)
        stats.fhon = _masked_mean(quad.clamp(min=0).sqrt(), rows.real_q, rows.n_q)
    return out, stats, rows
