"""Where a transformers model keeps its attention: one module per layer, its output projection, and which of its
original heads a pruned module still has (the record pruning writes and the engine reads).

:func:`inactive_heads.pruning.prune_heads` sets two non-persistent buffers on every attention module it shrinks (they
follow ``.to(device)`` and stay out of the state dict):

* ``inactive_heads_query_heads``: long ``[H_kept]``, the original indices of the remaining query heads, ascending;
* ``inactive_heads_kv_index``: long ``[H_kept]``, for each remaining query head the position, among the module's
  remaining key/value heads, of the one it reads; nondecreasing, as a KV head's query heads stay consecutive.
  Groups may be uneven, so attention maps query heads to KV heads by this index instead of by equal groups.

A module without them has every original head, in equal groups. The model's (text) config records the removed heads
per layer under ``inactive_heads_pruned_heads``, so a saved checkpoint says how to rebuild the pruned shapes.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _compat
from .errors import InactiveHeadsError

__all__: list[str] = []  # internal module

_QUERY_HEADS = "inactive_heads_query_heads"
_KV_INDEX = "inactive_heads_kv_index"
_CONFIG_KEY = "inactive_heads_pruned_heads"
_OUTPUT_PROJECTIONS = ("o_proj", "c_proj", "out_proj", "dense", "wo")


def query_heads(module: torch.nn.Module) -> torch.Tensor | None:
    """Original indices of the query heads ``module`` still has (long, ascending); None when it has all of them."""
    heads = getattr(module, _QUERY_HEADS, None)
    return heads if isinstance(heads, torch.Tensor) else None


def kv_index(module: torch.nn.Module) -> torch.Tensor | None:
    """For each remaining query head of ``module``, the position of its KV head among the remaining ones; None when
    the module is unpruned (equal groups)."""
    index = getattr(module, _KV_INDEX, None)
    return index if isinstance(index, torch.Tensor) else None


def reads(module: torch.nn.Module, n_query: int, n_kv: int) -> torch.Tensor:
    """For each of the ``n_query`` query heads ``module`` has, the position of the KV head it reads among the
    module's KV heads: the pruning record, or equal consecutive groups of an unpruned module with ``n_kv``."""
    index = kv_index(module)
    if index is not None:
        return index
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    return torch.arange(n_query, device=device) // (n_query // n_kv)


def kv_count(module: torch.nn.Module, n_kv: int) -> int:
    """The number of KV heads ``module`` has: ``n_kv`` (the model's) unless pruning removed some."""
    index = kv_index(module)
    return n_kv if index is None else int(index.max()) + 1


def kv_heads_read(zeroed: torch.Tensor, reads: torch.Tensor, n_kv: int) -> torch.Tensor:
    """bool [B, n_kv]: which KV heads each row still reads when its query heads ``zeroed`` (bool [B, H]) output
    nothing; ``reads`` [H] as :func:`reads` returns it. A KV head all of whose query heads are zeroed is never read."""
    live = (~zeroed).to(torch.long)
    count = torch.zeros(zeroed.shape[0], n_kv, dtype=torch.long, device=zeroed.device)
    return count.index_add_(1, reads.to(zeroed.device), live) > 0


def cache_pairs(read: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (row, KV head) pairs a cut KV cache keeps, given ``read`` (bool [B, n_kv], see :func:`kv_heads_read`):
    rows [N] and heads [N], KV head by KV head. At least one pair stays: transformers reads a cache layer's length
    from its size."""
    heads, rows = read.T.nonzero(as_tuple=True)
    if len(rows) == 0:
        rows = heads = torch.zeros(1, dtype=torch.long, device=read.device)
    return rows, heads


def set_layout(module: torch.nn.Module, query_heads: torch.Tensor, kv_index: torch.Tensor) -> None:
    """Record that ``module`` keeps original query heads ``query_heads``, reading KV heads ``kv_index``."""
    if query_heads.shape != kv_index.shape or query_heads.dim() != 1:
        raise InactiveHeadsError(
            f"query_heads {tuple(query_heads.shape)} and kv_index {tuple(kv_index.shape)} must be [H_kept]"
        )
    if bool((kv_index.diff() < 0).any()):  # attention slices each KV head's query heads as one contiguous block
        raise InactiveHeadsError(f"kv_index must be nondecreasing, got {kv_index.tolist()}")
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    module.register_buffer(_QUERY_HEADS, query_heads.to(device, torch.long), persistent=False)
    module.register_buffer(_KV_INDEX, kv_index.to(device, torch.long), persistent=False)


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def removed_heads(config: Any) -> list[list[int]] | None:
    """The removed query heads per layer (original indices) a model config records; None for an unpruned model."""
    removed = getattr(_text_config(config), _CONFIG_KEY, None)
    return removed if isinstance(removed, list) else None


def record_removed(config: Any, removed: list[list[int]]) -> None:
    """Record in ``config`` (saved with the model) the removed query heads per layer."""
    setattr(_text_config(config), _CONFIG_KEY, removed)


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The attention module of each layer of ``model``, in layer order; ValueError when they cannot be identified."""
    layers: dict[int, torch.nn.Module] = {}
    found: list[int] = []
    for module in model.modules():
        idx = getattr(module, "layer_idx", None)
        if (
            isinstance(idx, int)
            and hasattr(module, "config")
            and any(hasattr(module, p) for p in (*_OUTPUT_PROJECTIONS, "q_proj", "c_attn", "qkv_proj"))
        ):
            layers[idx] = module
            found.append(idx)
    if sorted(found) != list(range(len(found))) or not found:
        raise InactiveHeadsError(
            f"{type(model).__name__}: could not identify one attention module per layer (found layer indices "
            f"{sorted(found)}); inactive-heads supports transformers models built on AttentionInterface"
        )
    return [layers[i] for i in range(len(found))]


def output_projection(module: torch.nn.Module, in_features: int) -> torch.Tensor:
    """The output projection's weight as [d_model, H*D], whatever the layer type (Linear, GPT-2 Conv1D)."""
    for name in _OUTPUT_PROJECTIONS:
        layer = getattr(module, name, None)
        weight = _compat.linear_weight(layer) if isinstance(layer, torch.nn.Module) else None
        if weight is not None and weight.shape[1] == in_features:
            return weight
    raise InactiveHeadsError(
        f"cannot find the output projection of {type(module).__name__} (looked for {_OUTPUT_PROJECTIONS} with "
        f"{in_features} input features); fhon scores are unavailable for this architecture"
    )


def sliding_window(model: Any) -> int | None:
    """The model's sliding attention window, where any layer has one; None where every layer attends to all keys."""
    config = _compat.text_config(model)
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)  # absent where the window applies to every layer (Mistral)
    return None if not window or (types is not None and "sliding_attention" not in types) else int(window)
