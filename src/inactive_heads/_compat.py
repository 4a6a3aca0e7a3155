"""Every use of transformers' private or version-dependent API, behind small functions.

transformers renames private attributes and keyword arguments between releases; when one moves, this is the only
module to change. Everything else in the package uses transformers' public API or these functions.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
import transformers
from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.pytorch_utils import Conv1D

from .errors import InactiveHeadsError

__all__: list[str] = []  # internal module

_LAYER_ATTRS = ("num_hidden_layers", "n_layer", "num_layers")
_HEAD_ATTRS = ("num_attention_heads", "n_head", "num_heads")


def register_attention(name: str, fn: Callable[..., tuple[torch.Tensor, None]]) -> None:
    """Register ``fn`` as attention implementation ``name``, with SDPA's mask function."""
    AttentionInterface.register(name, fn)
    # Without a registered mask function transformers passes no mask at all, and causal masking would vanish.
    AttentionMaskInterface.register(name, sdpa_mask)


def attn_implementation(model: PreTrainedModel) -> str | None:
    """The attention implementation ``model`` runs now (``"sdpa"``, ``"eager"``, a registered name)."""
    return cast(str | None, model.config._attn_implementation)


def can_set_attn_implementation(model: PreTrainedModel) -> bool:
    """Whether ``model`` routes attention through ``AttentionInterface`` (so another implementation can be set)."""
    return model._can_set_attn_implementation()


@contextlib.contextmanager
def set_attn_implementation(model: PreTrainedModel, name: str) -> Iterator[None]:
    """Run ``model`` (and every config it holds) on implementation ``name`` within the block; restored on exit,
    also after an exception."""
    configs = _configs(model)
    saved = [(c, c._attn_implementation_internal) for c in configs]
    try:
        model.set_attn_implementation(name)
        for c in configs:  # set_attn_implementation skips some sub-configs; the mask function reads each one
            c._attn_implementation_internal = name
        yield
    finally:
        for c, impl in saved:
            c._attn_implementation_internal = impl


def pin_attn_implementation(module: torch.nn.Module, name: str, **attributes: Any) -> None:
    """Give ``module`` (one attention module) its own shallow copy of its config, on implementation ``name`` whatever
    the model is set to later, with ``attributes`` overridden (e.g. its own head counts)."""
    config = copy.copy(cast(PretrainedConfig, module.config))
    config._attn_implementation_internal = name
    for key, value in attributes.items():
        setattr(config, key, value)
    setattr(module, "config", config)  # noqa: B010  # Module's stub types attributes as tensors and modules


def no_init_weights() -> contextlib.AbstractContextManager[None]:
    """Within the block, models are built without initialising their weights (they are loaded afterwards)."""
    from transformers.initialization import no_init_weights as no_init

    return no_init()


def _configs(model: PreTrainedModel) -> list[PretrainedConfig]:
    seen: set[int] = set()
    out: list[PretrainedConfig] = []
    for module in model.modules():
        config = getattr(module, "config", None)
        if isinstance(module, PreTrainedModel) and config is not None and id(config) not in seen:
            seen.add(id(config))
            out.append(config)
            for key in getattr(config, "sub_configs", {}):
                sub = getattr(config, key, None)
                if sub is not None and id(sub) not in seen:
                    seen.add(id(sub))
                    out.append(sub)
    return out


def name_or_path(model: torch.nn.Module) -> str:
    """The hub id or directory ``model`` was loaded from ('' when unknown)."""
    return getattr(getattr(model, "config", None), "_name_or_path", "")


def commit_hash(model: PreTrainedModel) -> str | None:
    """The hub revision ``model`` was loaded at (None for local files)."""
    return getattr(model.config, "_commit_hash", None)


def loads_as_causal_lm(config: PretrainedConfig) -> bool:
    """Whether ``AutoModelForCausalLM`` has a model class for ``config``."""
    return type(config) in transformers.AutoModelForCausalLM._model_mapping


def input_embedding_weight(model: PreTrainedModel) -> torch.Tensor:
    """The input embedding matrix: its device and dtype are where and in what the model computes."""
    # transformers types get_input_embeddings() as nn.Module, whose attributes the stubs type as Tensor | Module.
    return cast(torch.Tensor, model.get_input_embeddings().weight)


def cache_kwarg(model: PreTrainedModel) -> str:
    """The name of ``model.forward``'s KV-cache argument: ``cache`` in newer 5.x, ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def output_cache(output: Any) -> Any:
    """The KV cache a forward returned, under either name (see :func:`cache_kwarg`)."""
    return output.cache if "cache" in output else output.past_key_values


def cache_states(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) of every layer of a transformers KV cache, each [batch, kv_heads, length, head_dim]."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def set_cache_states(cache: Any, states: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Make every layer of a (dynamic) KV cache hold ``states`` (as :func:`cache_states` returns them)."""
    for layer, (keys, values) in zip(cache.layers, states, strict=True):
        layer.keys, layer.values = keys, values


_PAIRS_LAYERS: dict[type, type] = {}


def _pairs_layer(layer_class: type) -> type:
    """``layer_class`` (a transformers cache layer class) storing only the (row, KV head) pairs ``inactive_heads_pairs``
    of every state it is given, as [pairs, 1, length, head_dim]: a subclass, as transformers tells layer kinds apart
    by isinstance."""
    if layer_class not in _PAIRS_LAYERS:

        class Pairs(layer_class):
            def update(self, keys: torch.Tensor, values: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                rows, heads = self.inactive_heads_pairs
                return super().update(keys[rows, heads][:, None], values[rows, heads][:, None], *args, **kwargs)

        Pairs.__name__ = Pairs.__qualname__ = f"Pairs{layer_class.__name__}"
        _PAIRS_LAYERS[layer_class] = Pairs
    return _PAIRS_LAYERS[layer_class]


def keep_cache_pairs(cache: Any, layer: int, rows: torch.Tensor, heads: torch.Tensor) -> None:
    """From now on, layer ``layer`` of a (dynamic) KV cache holds only the states of KV head ``heads[i]`` of batch
    row ``rows[i]``, as a batch of single-head rows [pairs, 1, length, head_dim]: those already stored are cut and
    freed, and later states are cut before they are appended."""
    state = cache.layers[layer]
    if hasattr(state, "inactive_heads_pairs"):
        raise InactiveHeadsError(f"cache layer {layer} already holds a subset of its states")
    state.keys = state.keys[rows, heads][:, None]
    state.values = state.values[rows, heads][:, None]
    state.inactive_heads_pairs = (rows, heads)
    state.__class__ = _pairs_layer(type(state))


def text_config(model: PreTrainedModel) -> PretrainedConfig:
    """The config of the language model inside ``model`` (the model's own config for a plain LM)."""
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def model_shape(model: PreTrainedModel) -> tuple[int, int]:
    """``(n_layers, n_heads)`` of the language model: its layer count and its number of query heads per layer."""
    config = text_config(model)
    return _int_attr(config, _LAYER_ATTRS, "layers"), _int_attr(config, _HEAD_ATTRS, "attention heads")


def kv_heads(model: PreTrainedModel) -> int:
    """Key/value heads per layer of the (unpruned) language model: its query heads where the config names none."""
    value = getattr(text_config(model), "num_key_value_heads", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else model_shape(model)[1]


def _int_attr(config: PretrainedConfig, names: tuple[str, ...], what: str) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise InactiveHeadsError(f"cannot read the number of {what} from {type(config).__name__} (looked for {names})")


def is_conv1d(layer: torch.nn.Module) -> bool:
    """Whether ``layer`` is GPT-2's Conv1D, a linear layer storing its weight as [in_features, out_features]."""
    return isinstance(layer, Conv1D)


def linear_weight(layer: torch.nn.Module) -> torch.Tensor | None:
    """The 2-D weight of a linear layer as [out_features, in_features] (GPT-2's Conv1D stores [in, out]); None if
    ``layer`` has none."""
    weight = getattr(layer, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return None
    return weight.T if isinstance(layer, Conv1D) else weight


def max_length(model: PreTrainedModel, tokenizer: Any = None) -> int:
    """The longest sequence ``model`` takes, by lm-eval's HFLM.max_length precedence (2048 when nothing says)."""
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(model.config, attr, None)
        if isinstance(value, int):
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and limit < 1_000_000_000 else 2048
