"""Fused attention kernels that also return each query's log-sum-exp, one per device type.

:mod:`inactive_heads.attention` derives every statistic from a kernel's output ``o``, the log-sum-exp ``lse_i`` of
query ``i``'s scaled logits and, for the entropy, ``(A k)_i = sum_j A_ij k_j`` (the same kernel with K as values),
so no probability is ever materialised. A kernel is chosen by the device of the query (:func:`lse_kernel`):

* ``cpu``: PyTorch's CPU flash kernel, ``aten::_scaled_dot_product_flash_attention_for_cpu``.
* ``cuda``: PyTorch's memory-efficient kernel, ``aten::_scaled_dot_product_efficient_attention`` with
  ``compute_log_sumexp``. It takes an additive float32 bias, so every mask works; (A k) comes from the same call,
  with ``[V | K]`` as values. (FlexAttention's ``return_lse`` would serve too, but is fused only when compiled, once
  per shape; the flash and cuDNN kernels take no float32 inputs.)

Every kernel takes float32 q [B,H,S,D], k [B,H,T,D] and v [B,H,T,Dv] (key/value heads already repeated to H), a
bool mask ``allowed`` [B,1,S,T] of permitted (query, key) pairs or None, and ``causal``, PyTorch's top-left causal
mode, used only without a mask. Rows that attend to no key hold unspecified values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

__all__: list[str] = []  # internal module


#: (out [B,H,S,Dv], lse [B,H,S] or None, (A k) [B,H,S,D] or None), all float32.
KernelResult = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]


class _Run(Protocol):
    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        allowed: torch.Tensor | None,
        causal: bool,
        scale: float,
        want_lse: bool,
        want_ak: bool,
    ) -> KernelResult: ...


@dataclass(frozen=True)
class LseKernel:
    """A fused attention kernel that returns the log-sum-exp of each query (see the module for ``run``'s inputs);
    ``lse`` is returned when ``want_lse``, ``(A k)`` when ``want_ak``."""

    name: str
    run: _Run


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype, width: int | None = None) -> torch.Tensor:
    """0 where ``allowed`` [..., T], the dtype's lowest value elsewhere; the last dimension allocated ``width`` wide
    (a view of the first T columns is returned)."""
    kv_len = allowed.shape[-1]
    mask = torch.zeros((*allowed.shape[:-1], width or kv_len), dtype=dtype, device=allowed.device)
    return mask[..., :kv_len].masked_fill_(~allowed, torch.finfo(dtype).min)


def _cpu_flash(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    causal: bool,
    scale: float,
    want_lse: bool,
    want_ak: bool,
) -> KernelResult:
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    # The kernel takes only an additive mask of the query's dtype, which costs it ~1.7x over its own causal mode.
    mask = None if allowed is None else additive_mask(allowed, q.dtype)
    out, lse = flash(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)[:2]
    # K in place of V gives (A k); one call with zero-padded q, k and [V | K] as values measured no faster here.
    ak = flash(q, k, k, 0.0, causal, attn_mask=mask, scale=scale)[0] if want_ak else None
    return out, lse, ak


# The memory-efficient kernel reads float32 rows in 16-byte vectors: row strides of q, k, v and the bias must be
# multiples of 4 elements. SDPA pads the bias's rows to 16 elements before calling it, and so does this module.
_ROW_ALIGN = 4
_BIAS_ALIGN = 16


def _aligned(x: torch.Tensor) -> torch.Tensor:
    """``x`` contiguous, its last dimension zero-padded to a multiple of the row alignment, its start 16-byte aligned
    (a contiguous view into a larger tensor may start anywhere)."""
    extra = -x.shape[-1] % _ROW_ALIGN
    if extra:
        return F.pad(x, (0, extra))
    x = x.contiguous()
    return x.clone() if x.data_ptr() % 16 else x


def _cuda_efficient(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    causal: bool,
    scale: float,
    want_lse: bool,
    want_ak: bool,
) -> KernelResult:
    batch, heads, q_len, head_dim = q.shape
    dv = v.shape[-1]
    # One call for o and (A k): the logits and their softmax are computed once for both halves of the values.
    values = torch.cat([v, k], dim=-1) if want_ak else v
    # Zero columns of q and k change no logit; zero columns of the values add output columns that are dropped.
    q, k, values = _aligned(q), _aligned(k), _aligned(values)
    bias = None
    if allowed is not None:
        # The kernel normalises a query that may see no key (a pad query) by a zero sum: NaN in its output, which the
        # next layer reads through that position's key (NaN * 0 is NaN). Such a query sees every key instead, as in
        # transformers' SDPA masks; what it computes is never read.
        allowed = allowed | ~allowed.any(-1, keepdim=True)
        bias = additive_mask(allowed, torch.float32, -(-allowed.shape[-1] // _BIAS_ALIGN) * _BIAS_ALIGN)
        bias = bias.expand(batch, heads, q_len, allowed.shape[-1])
    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, values, bias, want_lse, 0.0, causal, scale=scale
    )[:2]
    # The kernel returns lse padded to a multiple of 32 queries; the padding holds no query.
    lse = lse[..., :q_len] if want_lse else None
    return out[..., :dv], lse, out[..., dv : dv + head_dim] if want_ak else None


_KERNELS: dict[str, LseKernel] = {
    "cpu": LseKernel("cpu_flash", _cpu_flash),
    "cuda": LseKernel("cuda_efficient", _cuda_efficient),
}


def lse_kernel(device: torch.device, softcap: float | None) -> LseKernel | None:
    """The log-sum-exp kernel for ``device``; None where there is none or logits are softcapped (the identities
    assume plain ``softmax(scale * q.k + mask)``)."""
    if softcap is not None:
        return None
    return _KERNELS.get(device.type)
