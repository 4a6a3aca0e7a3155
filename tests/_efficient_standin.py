"""A CPU stand-in for CUDA's memory-efficient attention kernel, so that the CUDA kernel path runs on CPU.

``aten::_scaled_dot_product_efficient_attention`` has no CPU implementation. Within :func:`efficient_kernel_on_cpu`,
CPU tensors reach this one instead: it computes the kernel's function in float64 and enforces the CUDA kernel's
contract as ``inactive_heads.kernels`` relies on it, so the adapter code that runs on a GPU runs unchanged here:

* q, k, v and the bias share one dtype; q and k share the head dimension, v may differ; one head count;
* every row stride (q, k, v and the bias's query stride) and batch/head stride is a multiple of 16 bytes, and the
  last dimension is contiguous; the bias has the exact shape [B, H, S, T] (broadcast dimensions expanded);
* ``is_causal`` masks top-left (query i sees keys 0..i);
* a query whose every key is masked (bias at the dtype's lowest value) gets NaN output and log-sum-exp, as the CUDA
  kernel's normalisation by a zero sum can give;
* the output is a [B,S,H,Dv]-contiguous tensor seen as [B,H,S,Dv]; the float32 log-sum-exp is padded to a multiple
  of 32 queries, and the padding holds garbage (NaN) that a caller must never read; without ``compute_log_sumexp``
  it is empty.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_OP = "_scaled_dot_product_efficient_attention"
_ALIGN_BYTES = 16
_LSE_ALIGN = 32
_CALLS: list[int] = []  # one entry per call of the stand-in


def _check_aligned(name: str, x: torch.Tensor, dims: tuple[int, ...]) -> None:
    elems = _ALIGN_BYTES // x.element_size()
    if x.stride(-1) != 1:
        raise RuntimeError(f"{name}: last dimension must be contiguous, strides {x.stride()}")
    if x.data_ptr() % _ALIGN_BYTES:
        raise RuntimeError(f"{name} is not correctly aligned (pointer)")
    for d in dims:
        if x.shape[d] > 1 and x.stride(d) % elems:
            raise RuntimeError(f"{name} is not correctly aligned (stride({d}) = {x.stride(d)}, needs {elems}k)")


def _efficient_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_bias: torch.Tensor | None,
    compute_log_sumexp: bool,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _CALLS.append(1)
    batch, heads, q_len, head_dim = query.shape
    kv_len, dv = key.shape[2], value.shape[3]
    if dropout_p != 0.0:
        raise RuntimeError("the stand-in computes no dropout")
    if not (query.dtype == key.dtype == value.dtype):
        raise RuntimeError(f"q, k, v dtypes differ: {query.dtype}, {key.dtype}, {value.dtype}")
    if key.shape != (batch, heads, kv_len, head_dim) or value.shape[:3] != (batch, heads, kv_len):
        raise RuntimeError(f"shapes do not fit: q {tuple(query.shape)}, k {tuple(key.shape)}, v {tuple(value.shape)}")
    for name, x in (("query", query), ("key", key), ("value", value)):
        _check_aligned(name, x, (0, 1, 2))
    logits = query.double() @ key.double().transpose(-1, -2) * (head_dim**-0.5 if scale is None else scale)
    if attn_bias is not None:
        if attn_bias.dtype != query.dtype:
            raise RuntimeError(f"attn_bias dtype {attn_bias.dtype} differs from the query's {query.dtype}")
        if attn_bias.shape != (batch, heads, q_len, kv_len):
            raise RuntimeError(f"attn_bias has shape {tuple(attn_bias.shape)}, needs {(batch, heads, q_len, kv_len)}")
        _check_aligned("attn_bias", attn_bias, (0, 1, 2))
        logits = logits + attn_bias.double()
        seen = attn_bias > torch.finfo(attn_bias.dtype).min / 2
        logits = logits.masked_fill(~seen.any(-1, keepdim=True), float("nan"))
    if is_causal:
        keep = torch.ones(q_len, kv_len, dtype=torch.bool).tril()
        logits = logits.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    out = torch.exp(logits - lse[..., None]) @ value.double()
    out = out.to(query.dtype).transpose(1, 2).contiguous().transpose(1, 2)  # the kernel writes [B,S,H,Dv]
    lse_width = -(-q_len // _LSE_ALIGN) * _LSE_ALIGN if compute_log_sumexp else 0
    lse_out = torch.full((batch, heads, lse_width), float("nan"), dtype=torch.float32)
    if compute_log_sumexp:
        lse_out[..., :q_len] = lse.float()
    assert out.shape[-1] == dv
    return out, lse_out, torch.empty((), dtype=torch.long), torch.empty((), dtype=torch.long)


@contextlib.contextmanager
def efficient_kernel_on_cpu() -> Iterator[list[int]]:
    """Within the block, ``aten::_scaled_dot_product_efficient_attention`` also runs on CPU tensors (the stand-in);
    yields a list that grows by one entry per call."""
    lib = torch.library.Library("aten", "IMPL")
    _CALLS.clear()
    try:
        lib.impl(_OP, _efficient_attention, "CPU")
        yield _CALLS
    finally:
        lib._destroy()
