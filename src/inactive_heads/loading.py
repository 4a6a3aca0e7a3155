"""Load a causal LM and its tokenizer from a hub id, a local directory or a GGUF file (de-quantised once, cached)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import torch
import transformers

__all__ = ["cache_dir", "file_sha256", "load_model"]

_CACHE_ENV = "INACTIVE_HEADS_CACHE"


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


def load_model(
    spec: str | os.PathLike, dtype: torch.dtype = torch.float32, *, device_map: str | dict | None = None
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` from a hub id, a local HF directory or a ``.gguf`` file; the model is in eval mode.

    A GGUF file is de-quantised on first use and cached as safetensors under :func:`cache_dir`, keyed by the file's
    sha256, so later loads take seconds. ``model.inactive_heads_source`` records what was loaded (for run metadata).
    """
    path = Path(spec)
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

    config = _config(source)
    model_cls = transformers.AutoModelForCausalLM
    if type(config) not in model_cls._model_mapping:
        raise ValueError(
            f"{spec} is a {type(config).__name__} model, which transformers cannot load as a causal LM; "
            "inactive-heads needs a decoder-only language model"
        )
    model = model_cls.from_pretrained(source, dtype=dtype, device_map=device_map)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    if identity["format"] == "hub":
        identity["revision"] = getattr(model.config, "_commit_hash", None)
    # torch's stub types Module.__setattr__ for tensors and modules only; plain attributes are fine at run time.
    model.inactive_heads_source = identity  # type: ignore[assignment]
    return model.eval(), tokenizer


def _config(source: str | Path) -> transformers.PretrainedConfig:
    try:
        return transformers.AutoConfig.from_pretrained(source)
    except OSError as err:
        raise OSError(
            f"cannot load {source}: {err}. Without a hub connection pass a local model directory or a .gguf file"
        ) from err


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
    except (ValueError, KeyError, OSError, RuntimeError) as err:
        raise ValueError(
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
