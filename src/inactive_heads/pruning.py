"""Static head pruning: choose the heads inactive on nearly every calibration row and remove them from the model.

* :func:`head_inactivity` / :func:`static_mask`: per head, the fraction of calibration rows on which a score passes
  its threshold (and the mean score); the mask removes the given fraction of all heads, most often inactive first.
* :func:`prune_heads`: removes the masked query heads in place (their rows of the query projection, their columns of
  the output projection) and a key/value head with its rows of the k and v projections once every query head
  reading it is gone. The result computes exactly what the unpruned model computes under
  ``zero_heads(mask=...)``, with fewer weights, less attention work and a smaller KV cache.
* :func:`save_pruned` and :func:`inactive_heads.load_model` store and restore a pruned model.

Groups end up uneven (a KV head may keep 3 of its 7 query heads, its neighbour 7), which transformers' attention
functions cannot express (SDPA's ``repeat_kv`` repeats every KV head equally). Each pruned attention module therefore
keeps its own query-to-KV index (:mod:`inactive_heads._layout`) and always runs inactive-heads' registered attention
function, whatever implementation the model is set to.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from . import _compat, _layout
from .analysis import zero_frequency
from .engine import IMPLEMENTATION, attention_modules, in_watch
from .rundir import RunDir
from .scores import SCORE_FUNCTIONS, HeadScores
from .thresholds import thresholds_from_cdf

__all__ = [
    "HeadInactivity",
    "head_inactivity",
    "load_pruned",
    "prune_heads",
    "pruned_mask",
    "require_new_directory",
    "save_pruned",
    "static_mask",
]

ScoresSource = HeadScores | str | os.PathLike


# --- choosing the mask -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadInactivity:
    """How inactive each head was on the calibration rows, by one score function.

    ``frequency`` [n_layers, n_heads]: fraction of rows on which the head's score passed ``threshold`` (what the
    report's head heatmap shows for the sweep cell of that threshold); ``mean`` [n_layers, n_heads]: its mean score.
    Heads a pruned model no longer has are NaN in both.
    """

    score: str
    threshold: float
    frequency: torch.Tensor
    mean: torch.Tensor
    rows: int


def _load_scores(scores: ScoresSource) -> HeadScores:
    if isinstance(scores, HeadScores):
        return scores
    path = Path(scores)
    if path.is_file():
        return HeadScores.load(path)
    found = RunDir(path).read_scores()
    if found is None:
        raise FileNotFoundError(
            f"{path} holds no calibration scores (calibration/scores.safetensors); run `inactive-heads calibrate` first"
        )
    return found


def head_inactivity(
    scores: ScoresSource, score: str, *, threshold: float | None = None, target: float | None = None
) -> HeadInactivity:
    """Per head, how often ``score`` marks it inactive on the calibration rows of ``scores``, and its mean score.

    ``scores``: a :class:`HeadScores`, a run directory (its calibration) or a saved scores file. The threshold is
    ``threshold`` if given, else the calibration threshold of ``target`` (the one the sweep uses for that target
    fraction, :func:`inactive_heads.thresholds_from_cdf`).
    """
    if score not in SCORE_FUNCTIONS:
        raise ValueError(f"unknown score {score!r}; registered: {sorted(SCORE_FUNCTIONS)}")
    if (threshold is None) == (target is None):
        raise ValueError("give either threshold= or target= (a fraction of heads whose calibration threshold to use)")
    recorded = _load_scores(scores)
    if score not in recorded:
        recorded = recorded.derive([score])
    values = recorded[score]
    if values.shape[0] == 0:
        raise ValueError("no calibration rows to choose heads from")
    spec = SCORE_FUNCTIONS[score]
    if threshold is None:
        assert target is not None
        threshold = thresholds_from_cdf(values, spec.inactive_when, [target])[0]
    absent = values.isnan().all(0)
    frequency = zero_frequency(spec.passes(values, float(threshold))).masked_fill(absent, math.nan)
    return HeadInactivity(score, float(threshold), frequency, values.nanmean(0), int(values.shape[0]))


def static_mask(scores: ScoresSource, *, score: str, fraction: float, threshold: float | None = None) -> torch.Tensor:
    """bool [n_layers, n_heads]: the ``fraction`` of all heads most often inactive by ``score`` on calibration rows.

    Heads are ranked by :func:`head_inactivity` frequency at ``threshold`` (default: the calibration threshold of
    target ``fraction``, so the ranking is by the per-head frequencies the report's heatmap shows for that target),
    ties broken by the mean score (the more inactive side first). ``round(fraction * n_layers * n_heads)`` heads are
    chosen, skipping any whose removal would leave its layer without a head. Heads already removed (scores of a
    pruned model, NaN) are in the mask and count towards the fraction. ValueError when the fraction cannot be met.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be a number in [0, 1], got {fraction!r}")
    found = head_inactivity(scores, score, threshold=threshold, target=None if threshold is not None else fraction)
    n_layers, n_heads = found.frequency.shape
    wanted = round(fraction * n_layers * n_heads)
    mask = found.frequency.isnan()
    left = (~mask).sum(1)
    if wanted > n_layers * n_heads - n_layers:
        raise ValueError(
            f"cannot remove {wanted} of {n_layers * n_heads} heads and keep one per layer; use fraction <= "
            f"{(n_heads - 1) / n_heads:.3f}"
        )
    # More inactive first: higher frequency, then the mean score on the inactive side.
    side = 1.0 if SCORE_FUNCTIONS[score].inactive_when == "below" else -1.0
    order = sorted(
        ((layer, head) for layer in range(n_layers) for head in range(n_heads) if not mask[layer, head]),
        key=lambda lh: (-float(found.frequency[lh]), side * float(found.mean[lh]), lh),
    )
    count = int(mask.sum())
    for layer, head in order:
        if count >= wanted:
            break
        if left[layer] > 1:
            mask[layer, head] = True
            left[layer] -= 1
            count += 1
    return mask


# --- removing heads ----------------------------------------------------------------------------------------------


def pruned_mask(model: PreTrainedModel) -> torch.Tensor:
    """bool [n_layers, n_heads]: the query heads removed from ``model`` (all False for an unpruned model)."""
    n_layers, n_heads = _compat.model_shape(model)
    mask = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    for layer, module in enumerate(attention_modules(model)):
        kept = _layout.query_heads(module)
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

    def __init__(self, norm: torch.nn.Module, index: torch.Tensor):
        super().__init__()
        self.norm = norm
        device = next((p.device for p in norm.parameters()), torch.device("cpu"))
        self.register_buffer("index", index.to(device), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x).index_select(-1, self.index)


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
        raise NotImplementedError(
            f"{type(module).__name__}: pruning knows the q/k/v_proj + o_proj, qkv_proj + o_proj and GPT-2 c_attn + "
            "c_proj layouts"
        )
    if not isinstance(getattr(module, "head_dim", None), int):
        raise NotImplementedError(f"{type(module).__name__} has no integer head_dim; pruning cannot find its heads")
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
    modules = attention_modules(model)
    n_layers, n_heads = _compat.model_shape(model)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (n_layers, n_heads):
        got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"mask must be a bool tensor [{n_layers}, {n_heads}] (layers x query heads), got {got}")
    config = _compat.text_config(model)
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    group = n_heads // n_kv
    mask = mask.cpu()
    plans: list[_Heads | None] = []
    for layer, module in enumerate(modules):
        _kind(module)  # every layer's layout is known before any is changed
        kept = _layout.query_heads(module)
        query = list(range(n_heads)) if kept is None else kept.tolist()
        new_query = [h for h in query if not mask[layer, h]]
        if not new_query:
            raise ValueError(f"mask removes every head of layer {layer}; each layer must keep at least one")
        kv = sorted({h // group for h in query})
        plans.append(
            None if new_query == query else _Heads(query, kv, new_query, sorted({h // group for h in new_query}), group)
        )
    for module, heads in zip(modules, plans, strict=True):
        if heads is None:
            continue
        _shrink_module(module, heads, n_heads, n_kv)
        kv_index = torch.tensor([heads.new_kv.index(h // group) for h in heads.new_query])
        _layout.set_layout(module, torch.tensor(heads.new_query), kv_index)
        _set_counts(module, heads)
    _layout.record_removed(model.config, [torch.nonzero(row).flatten().tolist() for row in pruned_mask(model)])
    return model


# --- saving and loading ------------------------------------------------------------------------------------------


def require_new_directory(directory: Path) -> None:
    """FileExistsError unless ``directory`` is absent or empty: a pruned model never overwrites files."""
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise FileExistsError(f"{directory} exists and is not empty; choose a new directory or remove it first")


def save_pruned(model: PreTrainedModel, directory: str | os.PathLike, tokenizer: Any = None) -> Path:
    """Save a pruned ``model`` (and ``tokenizer``) to ``directory``, for :func:`inactive_heads.load_model`.

    The directory is a Hugging Face checkpoint whose config records the removed heads (``inactive_heads_pruned_heads``)
    and keeps the original head counts. Plain ``transformers.AutoModelForCausalLM.from_pretrained`` cannot load it:
    a transformers config has one head count for all layers and equal query groups per KV head, while a pruned
    layer has its own count and uneven groups; it fails on the shapes of the attention weights. Load it with
    ``inactive_heads.load_model(directory)``.
    """
    removed = pruned_mask(model)
    if not removed.any():
        raise ValueError("model has no removed heads; save an unpruned model with model.save_pretrained")
    directory = Path(directory)
    require_new_directory(directory)
    # Written beside it and renamed into place: an interrupted save never leaves a partial checkpoint there.
    directory.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        model.save_pretrained(partial)
        if tokenizer is not None:
            tokenizer.save_pretrained(partial)
        if directory.exists():
            directory.rmdir()
        partial.rename(directory)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return directory


def load_pruned(directory: str | os.PathLike, config: Any, dtype: torch.dtype) -> PreTrainedModel:
    """The pruned model saved in ``directory`` by :func:`save_pruned` (``config`` is its loaded config)."""
    import transformers
    from safetensors.torch import load_file

    removed = _layout.removed_heads(config)
    if removed is None:
        raise ValueError(f"{directory} is not a pruned checkpoint (its config records no removed heads)")
    with _compat.no_init_weights():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    n_layers, n_heads = _compat.model_shape(model)
    if len(removed) != n_layers:
        raise ValueError(
            f"{directory}: the config lists removed heads of {len(removed)} layers, the model has {n_layers}"
        )
    mask = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    for layer, heads in enumerate(removed):
        mask[layer, heads] = True
    prune_heads(model, mask)
    model.tie_weights()  # before reading which names are tied: save_pretrained leaves those out
    state: dict[str, torch.Tensor] = {}
    for file in _weight_files(Path(directory)):
        state.update(load_file(str(file)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = _tied_names(model)
    if unexpected or set(missing) - tied:
        raise ValueError(
            f"{directory} does not match its pruned config: missing {sorted(set(missing) - tied)}, unexpected "
            f"{sorted(unexpected)}"
        )
    model.tie_weights()
    return model


def _weight_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        return [directory / f for f in files]
    single = directory / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"{directory} has no model.safetensors; save the model with ih.save_pruned")
    return [single]


def _tied_names(model: PreTrainedModel) -> set[str]:
    """State-dict names of parameters that share storage with an earlier one (save_pretrained drops them)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        key = tensor.data_ptr()
        if key in seen:
            tied.add(name)
        else:
            seen[key] = name
    return tied
