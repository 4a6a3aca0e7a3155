"""Saving a pruned model as a Hugging Face checkpoint that records its removed heads, and loading it back."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from .. import _compat, _model
from ..errors import InactiveHeadsError
from .surgery import prune_heads, pruned_mask

__all__ = ["load_pruned", "require_new_directory", "save_pruned"]


def require_new_directory(directory: Path) -> None:
    """FileExistsError unless ``directory`` is absent or empty: a pruned model never overwrites files."""
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise FileExistsError(f"{directory} exists and is not empty; choose a new directory or remove it first")


def save_pruned(model: PreTrainedModel, directory: str | os.PathLike[str], tokenizer: Any = None) -> Path:
    """Save a pruned ``model`` (and ``tokenizer``) to ``directory``, for :func:`inactive_heads.load_model`.

    The directory is a Hugging Face checkpoint whose config records the removed heads (``inactive_heads_pruned_heads``)
    and keeps the original head counts. Plain ``transformers.AutoModelForCausalLM.from_pretrained`` cannot load it:
    a transformers config has one head count for all layers and equal query groups per KV head, while a pruned
    layer has its own count and uneven groups; it fails on the shapes of the attention weights. Load it with
    ``inactive_heads.load_model(directory)``.
    """
    removed = pruned_mask(model)
    if not removed.any():
        raise InactiveHeadsError("model has no removed heads; save an unpruned model with model.save_pretrained")
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


def load_pruned(directory: str | os.PathLike[str], config: Any, dtype: torch.dtype) -> PreTrainedModel:
    """The pruned model saved in ``directory`` by :func:`save_pruned` (``config`` is its loaded config)."""
    import transformers
    from safetensors.torch import load_file

    removed = _model.removed_heads(config)
    if removed is None:
        raise InactiveHeadsError(f"{directory} is not a pruned checkpoint (its config records no removed heads)")
    with _compat.no_init_weights():
        model: PreTrainedModel = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    n_layers, n_heads = _compat.model_shape(model)
    if len(removed) != n_layers:
        raise InactiveHeadsError(
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
        raise InactiveHeadsError(
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
