"""Removing heads from a model: the masked query heads and every key/value head no query head reads any more.

* :func:`prune_heads`: removes the masked query heads in place (their rows of the query projection, their columns of
  the output projection) and a key/value head with its rows of the k and v projections once every query head
  reading it is gone. The result computes exactly what the unpruned model computes under
  ``zero_heads(mask=...)``, with fewer weights, less attention work and a smaller KV cache.
* :func:`~inactive_heads.pruning.checkpoint.save_pruned` and :func:`inactive_heads.load_model` store and restore it.

Groups end up uneven (a KV head may keep 3 of its 7 query heads, its neighbour 7), which transformers' attention
functions cannot express (SDPA's ``repeat_kv`` repeats every KV head equally). Each pruned attention module therefore
keeps its own query-to-KV index (:mod:`inactive_heads._model`) and always runs inactive-heads' registered attention
function, whatever implementation the model is set to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from .. import _compat, _model
from ..engine import IMPLEMENTATION, in_watch
from ..errors import InactiveHeadsError, UnsupportedModelError

__all__ = ["prune_heads", "pruned_mask"]


def pruned_mask(model: PreTrainedModel) -> torch.Tensor:
    """bool [n_layers, n_heads]: the query heads removed from ``model`` (all False for an unpruned model)."""
    n_layers, n_heads = _compat.model_shape(model)
    mask = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    for layer, module in enumerate(_model.attention_modules(model)):
        kept = _model.query_heads(module)
        if kept is not None:
            mask[layer] = True
            mask[layer, kept.cpu()] = False
    return mask


def _rows(heads: list[int], head_dim: int, offset: int = 0) -> torch.Tensor:
    """Feature indices of ``heads`` (positions within a projection block starting at ``offset``)."""
    return torch.tensor([offset + h * head_dim + d for h in heads for d in range(head_dim)], dtype=torch.long)


def _submodule(module: torch.nn.Module, name: str) -> torch.nn.Module:
    child = getattr(module, name)
    assert isinstance(child, torch.nn.Module), f"{type(module).__name__}.{name} is not a module"
    return child


def _select(layer: torch.nn.Module, name: str, dim: int, index: torch.Tensor) -> None:
    """Keep entries ``index`` along ``dim`` of parameter ``name`` of ``layer`` (a new, smaller Parameter)."""
    param = getattr(layer, name)
    data = param.data.index_select(dim, index.to(param.device)).clone()
    setattr(layer, name, torch.nn.Parameter(data, requires_grad=param.requires_grad))


def _shrink_outputs(layer: torch.nn.Module, index: torch.Tensor) -> None:
    """Keep output features ``index`` of a Linear or Conv1D layer."""
    conv = _compat.is_conv1d(layer)
    _select(layer, "weight", 1 if conv else 0, index)
    if getattr(layer, "bias", None) is not None:
        _select(layer, "bias", 0, index)
    setattr(layer, "nf" if conv else "out_features", len(index))


def _shrink_inputs(layer: torch.nn.Module, index: torch.Tensor) -> None:
    """Keep input features ``index`` of a Linear or Conv1D layer (the bias stays whole)."""
    conv = _compat.is_conv1d(layer)
    _select(layer, "weight", 0 if conv else 1, index)
    setattr(layer, "nx" if conv else "in_features", len(index))


class _NormThenSelect(torch.nn.Module):
    """A norm over every head of a projection jointly (OLMo-2's q_norm/k_norm), then only the remaining heads.

    The statistic of such a norm reads the removed heads too, so their projection rows stay and only their
    attention and output-projection columns go.
    """

    index: torch.Tensor  # a buffer: follows .to(device)

    def __init__(self, norm: torch.nn.Module, index: torch.Tensor):
        super().__init__()
        self.norm = norm
        device = next((p.device for p in norm.parameters()), torch.device("cpu"))
        self.register_buffer("index", index.to(device), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed: torch.Tensor = self.norm(x)
        return normed.index_select(-1, self.index)


def _joint_norm(module: torch.nn.Module, name: str, width: int) -> torch.nn.Module | None:
    """The norm ``name`` of ``module`` when it normalises all heads jointly over ``width`` features, else None."""
    norm = getattr(module, name, None)
    if isinstance(norm, _NormThenSelect):
        return norm.norm
    weight = getattr(norm, "weight", None)
    if isinstance(norm, torch.nn.Module) and isinstance(weight, torch.Tensor) and weight.numel() == width > 0:
        return norm
    return None


@dataclass
class _Heads:
    """One layer's heads before and after pruning, in original indices; ``group`` query heads per original KV head."""

    query: list[int]
    kv: list[int]
    new_query: list[int]
    new_kv: list[int]
    group: int

    @property
    def query_pos(self) -> list[int]:
        return [self.query.index(h) for h in self.new_query]

    @property
    def kv_pos(self) -> list[int]:
        return [self.kv.index(h) for h in self.new_kv]


def _kind(module: torch.nn.Module) -> str:
    """Which projection layout ``module`` has; NotImplementedError for one pruning does not know."""
    if all(hasattr(module, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")):
        kind = "separate"
    elif hasattr(module, "qkv_proj") and hasattr(module, "o_proj"):
        kind = "fused"  # Phi-3: [q | k | v] rows of one projection
    elif hasattr(module, "c_attn") and hasattr(module, "c_proj") and hasattr(module, "split_size"):
        kind = "gpt2"  # [q | k | v] columns of one Conv1D, one KV head per query head
    else:
        raise UnsupportedModelError(
            f"{type(module).__name__}: pruning knows the q/k/v_proj + o_proj, qkv_proj + o_proj and GPT-2 c_attn + "
            "c_proj layouts"
        )
    if not isinstance(getattr(module, "head_dim", None), int):
        raise UnsupportedModelError(f"{type(module).__name__} has no integer head_dim; pruning cannot find its heads")
    return kind


def _shrink_module(module: torch.nn.Module, heads: _Heads, n_heads: int, n_kv: int) -> None:
    head_dim: int = getattr(module, "head_dim")  # noqa: B009  # an int (see _kind); Module's stub says otherwise
    q_keep, kv_keep = _rows(heads.query_pos, head_dim), _rows(heads.kv_pos, head_dim)
    n_q, n_k = len(heads.query) * head_dim, len(heads.kv) * head_dim
    kind = _kind(module)
    if kind == "separate":
        for proj, norm_name, keep, n_orig, new in (
            ("q_proj", "q_norm", q_keep, n_heads, heads.new_query),
            ("k_proj", "k_norm", kv_keep, n_kv, heads.new_kv),
        ):
            joint = _joint_norm(module, norm_name, n_orig * head_dim) if n_orig > 1 else None
            if joint is None:
                _shrink_outputs(_submodule(module, proj), keep)
            elif len(new) < n_orig:  # the projection keeps every original head: the norm's statistic reads them all
                setattr(module, norm_name, _NormThenSelect(joint, _rows(new, head_dim)))
        _shrink_outputs(_submodule(module, "v_proj"), kv_keep)
        output = _submodule(module, "o_proj")
    elif kind == "fused":
        _shrink_outputs(_submodule(module, "qkv_proj"), torch.cat([q_keep, kv_keep + n_q, kv_keep + n_q + n_k]))
        output = _submodule(module, "o_proj")
    else:
        _shrink_outputs(_submodule(module, "c_attn"), torch.cat([q_keep, kv_keep + n_q, kv_keep + n_q + n_k]))
        setattr(module, "split_size", len(heads.new_query) * head_dim)  # noqa: B010  # Module's stub types attributes
        output = _submodule(module, "c_proj")
    _shrink_inputs(output, q_keep)


def _set_counts(module: torch.nn.Module, heads: _Heads) -> None:
    n_q, n_kv = len(heads.new_query), len(heads.new_kv)
    for name in ("num_heads", "num_attention_heads"):
        if isinstance(getattr(module, name, None), int):
            setattr(module, name, n_q)
    for name in ("num_key_value_heads", "num_kv_heads"):
        if isinstance(getattr(module, name, None), int):
            setattr(module, name, n_kv)
    if hasattr(module, "num_key_value_groups"):
        # Only the index describes uneven groups; None makes any code that assumes equal ones fail loudly.
        groups = n_q // n_kv if _even(heads) else None
        setattr(module, "num_key_value_groups", groups)  # noqa: B010  # Module's stub types attributes
    # Phi-3 reads its query width from the config: each pruned module gets its own, pinned to the implementation
    # that reads the query-to-KV index.
    _compat.pin_attn_implementation(module, IMPLEMENTATION, num_attention_heads=n_q, num_key_value_heads=n_kv)


def _even(heads: _Heads) -> bool:
    """Whether every remaining KV head serves the same consecutive number of remaining query heads."""
    per_kv = [sum(1 for h in heads.new_query if h // heads.group == kv) for kv in heads.new_kv]
    return len(set(per_kv)) == 1


@torch.no_grad()
def prune_heads(model: PreTrainedModel, mask: torch.Tensor) -> PreTrainedModel:
    """Remove the query heads ``mask`` marks (bool [n_layers, n_heads], original indices) from ``model``, in place.

    Per layer: the heads' rows of the query projection and columns of the output projection (its bias stays, as
    under zeroing); a key/value head with its rows of the k and v projections once no remaining query head reads
    it. Fused projections (GPT-2 ``c_attn``, Phi-3 ``qkv_proj``) lose the matching rows/columns. OLMo-2 normalises
    queries and keys over all heads of a layer jointly, so there the q/k projections keep every head (the norm
    reads them) and only attention, values and the output projection shrink.

    The pruned model computes what the unpruned one computes under ``zero_heads(mask=mask)``. Forward, ``generate``
    (the KV cache holds only the remaining KV heads), :func:`~inactive_heads.record_scores` and
    :func:`~inactive_heads.zero_heads` keep working, in the original head indexing: ``[n_layers, n_heads]`` tensors
    cover every original head, removed heads score NaN and are never zeroed, and a zeroing mask's entries for
    removed heads are ignored. Pruning again removes more heads (already removed ones may be marked or not). Every
    layer must keep at least one head. Returns ``model``.
    """
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"expected a transformers PreTrainedModel, got {type(model).__name__}")
    if in_watch(model):
        raise RuntimeError("cannot prune a model inside a watch/zero_heads block")
    modules = _model.attention_modules(model)
    n_layers, n_heads = _compat.model_shape(model)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (n_layers, n_heads):
        got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise InactiveHeadsError(
            f"mask must be a bool tensor [{n_layers}, {n_heads}] (layers x query heads), got {got}"
        )
    config = _compat.text_config(model)
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    group = n_heads // n_kv
    mask = mask.cpu()
    plans: list[_Heads | None] = []
    for layer, module in enumerate(modules):
        _kind(module)  # every layer's layout is known before any is changed
        kept = _model.query_heads(module)
        query = list(range(n_heads)) if kept is None else kept.tolist()
        new_query = [h for h in query if not mask[layer, h]]
        if not new_query:
            raise InactiveHeadsError(f"mask removes every head of layer {layer}; each layer must keep at least one")
        kv = sorted({h // group for h in query})
        plans.append(
            None if new_query == query else _Heads(query, kv, new_query, sorted({h // group for h in new_query}), group)
        )
    for module, heads in zip(modules, plans, strict=True):
        if heads is None:
            continue
        _shrink_module(module, heads, n_heads, n_kv)
        kv_index = torch.tensor([heads.new_kv.index(h // group) for h in heads.new_query])
        _model.set_layout(module, torch.tensor(heads.new_query), kv_index)
        _set_counts(module, heads)
    _model.record_removed(model.config, [torch.nonzero(row).flatten().tolist() for row in pruned_mask(model)])
    return model
