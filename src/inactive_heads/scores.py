"""Score functions: the registry, the per-layer statistics they read, and the container of recorded scores.

A score function maps the statistics of one attention layer for one batch (:class:`LayerStats`, every field a
float32 ``[batch, n_heads]`` tensor) to a ``[batch, n_heads]`` score. Adding one is one decorated function::

    @register_score("my_score", label="Mine", inactive_when="below", needs={"ahon"})
    def my_score(s: LayerStats) -> torch.Tensor:
        return s.ahon ** 2
"""

from __future__ import annotations

import hashlib
import inspect
import json
import lzma
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import torch
from safetensors.torch import load_file

from .errors import InactiveHeadsError, UnknownNameError

__all__ = [
    "RAW_STATS",
    "SCORE_FUNCTIONS",
    "HeadScores",
    "LayerStats",
    "ScoreSpec",
    "register_score",
]

InactiveWhen = Literal["above", "below"]

#: Raw per-head statistics the attention seam can compute; a score declares which ones it reads.
RAW_STATS = ("awft", "aeqd", "ftvvn", "avvn", "lthon", "ahon", "fhon", "random")


@dataclass
class LayerStats:
    """Raw statistics of one layer for one batch; each field is float32 ``[batch, n_heads]`` (or None if not needed).

    awft: mean over real queries of the weight on the first real key. aeqd: mean natural-log entropy of the
    query distributions. ftvvn: norm of the first real key's value vector. avvn: mean value norm over real keys.
    lthon: norm of the last real query's head output. ahon: mean head-output norm. fhon: mean norm of the head's
    output after its slice of the output projection. random: uniform [0, 1) draws.
    """

    awft: torch.Tensor | None = None
    aeqd: torch.Tensor | None = None
    ftvvn: torch.Tensor | None = None
    avvn: torch.Tensor | None = None
    lthon: torch.Tensor | None = None
    ahon: torch.Tensor | None = None
    fhon: torch.Tensor | None = None
    random: torch.Tensor | None = None


@dataclass(frozen=True)
class ScoreSpec:
    """A registered score function. ``inactive_when`` says on which side of the threshold a head is inactive."""

    name: str
    label: str
    inactive_when: InactiveWhen
    fn: Callable[[LayerStats], torch.Tensor] = field(repr=False)
    needs: frozenset[str] = frozenset(RAW_STATS)

    def __call__(self, stats: LayerStats) -> torch.Tensor:
        shape = next(tuple(v.shape) for v in (getattr(stats, n) for n in sorted(self.needs)) if v is not None)
        try:
            out = self.fn(stats)
        except Exception as e:
            raise InactiveHeadsError(f"score {self.name!r} ({self._where()}) failed: {type(e).__name__}: {e}") from e
        # A plugin's wrong shape would broadcast silently; all-NaN would pass no threshold and zero nothing.
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise InactiveHeadsError(
                f"score {self.name!r} ({self._where()}) returned {got}; it must return a tensor [batch, n_heads] "
                f"= {shape}, one value per head of each row"
            )
        if out.numel() and bool(torch.isnan(out).all()):
            raise InactiveHeadsError(f"score {self.name!r} ({self._where()}) returned only NaN; check its arithmetic")
        return out

    @property
    def fingerprint(self) -> str:
        """sha256 (16 hex digits) of the definition: label, side, needs, and the function's source with the values
        it closes over (its bytecode where no source exists). Cached results are keyed on it, not on the name, so
        a score re-registered under an old name with another definition is never served the old results."""
        fn = self.fn
        try:
            body = inspect.getsource(fn)
        except (OSError, TypeError):
            code = getattr(fn, "__code__", None)
            body = repr((code.co_code, code.co_consts, code.co_names)) if code is not None else repr(fn)
        cells = [repr(c.cell_contents) for c in (getattr(fn, "__closure__", None) or ()) if _filled(c)]
        text = json.dumps([self.label, self.inactive_when, sorted(self.needs), body, cells])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def _where(self) -> str:
        code = getattr(self.fn, "__code__", None)
        return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else repr(self.fn)

    def passes(self, score: torch.Tensor, threshold: float) -> torch.Tensor:
        """Boolean mask of heads that are inactive (to be zeroed) at ``threshold``."""
        return score > threshold if self.inactive_when == "above" else score < threshold


_SCORE_FUNCTIONS: dict[str, ScoreSpec] = {}
#: name -> ScoreSpec of every registered score function (read-only; add one with :func:`register_score`).
SCORE_FUNCTIONS: Mapping[str, ScoreSpec] = MappingProxyType(_SCORE_FUNCTIONS)


def register_score(
    name: str,
    *,
    label: str | None = None,
    inactive_when: InactiveWhen = "below",
    needs: Iterable[str] | None = None,
    override: bool = False,
) -> Callable[[Callable[[LayerStats], torch.Tensor]], Callable[[LayerStats], torch.Tensor]]:
    """Decorator registering ``fn(stats: LayerStats) -> Tensor[batch, n_heads]`` under ``name``.

    ``needs`` lists the raw statistics it reads (default: all), so a zeroing run computes only those. A name that
    is already registered raises ``ValueError`` unless ``override=True`` replaces its definition.
    """
    if inactive_when not in ("above", "below"):
        raise InactiveHeadsError(f"inactive_when must be 'above' or 'below', got {inactive_when!r}")
    need_set = frozenset(RAW_STATS if needs is None else needs)
    unknown = need_set - set(RAW_STATS)
    if unknown:
        raise InactiveHeadsError(f"unknown raw statistics {sorted(unknown)}; choose from {RAW_STATS}")

    def decorate(fn: Callable[[LayerStats], torch.Tensor]) -> Callable[[LayerStats], torch.Tensor]:
        if name in _SCORE_FUNCTIONS and not override:
            raise InactiveHeadsError(f"score {name!r} is already registered; pass override=True to replace it")
        _SCORE_FUNCTIONS[name] = ScoreSpec(name, label or name, inactive_when, fn, need_set)
        return fn

    return decorate


def _filled(cell: Any) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:  # an empty cell: a closure variable not yet assigned
        return False
    return True


def _layer_norm(x: torch.Tensor, ref: torch.Tensor | None = None) -> torch.Tensor:
    # "LN" in the paper: divide by the mean over all query heads of the layer, for the same row.
    mean = (x if ref is None else ref).mean(dim=-1, keepdim=True)
    # A layer whose heads all score 0 (e.g. the entropy of a one-token row) has every head at the layer mean.
    return torch.where(mean == 0, 1.0, x / mean)


def _stat(stats: LayerStats, name: str) -> torch.Tensor:
    # The engine computes only the statistics a score declares in ``needs``; the others stay None.
    value: torch.Tensor | None = getattr(stats, name)
    if value is None:
        raise InactiveHeadsError(f"statistic {name!r} was not computed: the score must list it in needs")
    return value


def _register_raw_and_ln(name: str, label: str, inactive_when: InactiveWhen) -> None:
    register_score(name, label=label, inactive_when=inactive_when, needs={name})(lambda s: _stat(s, name))
    register_score(f"{name}_ln", label=f"{label} (LN)", inactive_when=inactive_when, needs={name})(
        lambda s: _layer_norm(_stat(s, name))
    )


_register_raw_and_ln("awft", "AWFT", "above")
_register_raw_and_ln("aeqd", "AEQD", "below")
_register_raw_and_ln("ftvvn", "FTVVN", "below")
_register_raw_and_ln("avvn", "AVVN", "below")
register_score("lthon", label="LTHON", needs={"lthon"})(lambda s: _stat(s, "lthon"))
_register_raw_and_ln("ahon", "AHON", "below")
_register_raw_and_ln("fhon", "FHON", "below")
# The paper normalises the last-token norm by the layer's mean *average* output norm, and by the head's own (HN).
register_score("lthon_ln", label="LTHON (LN)", needs={"lthon", "ahon"})(
    lambda s: _layer_norm(_stat(s, "lthon"), _stat(s, "ahon"))
)
register_score("lthon_hn", label="LTHON (HN)", needs={"lthon", "ahon"})(lambda s: _stat(s, "lthon") / _stat(s, "ahon"))
register_score("random", label="Random", needs={"random"})(lambda s: _stat(s, "random"))


class HeadScores(Mapping[str, torch.Tensor]):
    """Recorded scores: ``scores[name]`` is float32 ``[rows, n_layers, n_heads]``; ``meta`` is free JSON metadata."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, object] | None = None):
        shapes = {tuple(t.shape) for t in tensors.values()}
        if len(shapes) > 1:
            raise InactiveHeadsError(f"all scores must share one [rows, layers, heads] shape, got {sorted(shapes)}")
        self._tensors = {k: v.to(torch.float32) for k, v in tensors.items()}
        self.meta: dict[str, object] = dict(meta or {})

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise UnknownNameError(f"no score {name!r} recorded; available: {self.names}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    @property
    def names(self) -> list[str]:
        return list(self._tensors)

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(rows, n_layers, n_heads)``."""
        return tuple(next(iter(self._tensors.values())).shape) if self._tensors else (0, 0, 0)  # type: ignore[return-value]

    def select(self, rows: torch.Tensor | list[int]) -> HeadScores:
        """The subset of rows ``rows`` (indices or a boolean mask), in that order."""
        index = torch.as_tensor(rows)
        return HeadScores({k: v[index] for k, v in self._tensors.items()}, self.meta)

    def derive(self, names: Iterable[str]) -> HeadScores:
        """These scores plus registered scores ``names`` computed from the raw statistics recorded here.

        Every raw statistic is recorded as the score of the same name, so a score function registered after
        recording needs no new forward pass. Raises ``KeyError`` naming what is missing.
        """
        out = dict(self._tensors)
        rows, layers, heads = self.shape
        for name in names:
            if name in out:
                continue
            if name not in SCORE_FUNCTIONS:
                raise UnknownNameError(f"score {name!r} is not registered; register it with ih.register_score")
            spec = SCORE_FUNCTIONS[name]
            missing = sorted(spec.needs - set(self._tensors))
            if missing:
                raise KeyError(f"score {name!r} needs raw statistics {missing} that were not recorded")
            # Score functions act on [batch, heads]; rows x layers flatten into the batch dimension.
            stats = LayerStats(**{n: self._tensors[n].reshape(-1, heads) for n in spec.needs})
            out[name] = spec(stats).reshape(rows, layers, heads).to(torch.float32)
        return HeadScores(out, self.meta)

    def save(self, path: str | Path, *, dtype: torch.dtype = torch.float32) -> None:
        """Write ``path`` (safetensors, metadata inside) atomically; ``dtype`` (float32 or float16) is what the
        file stores (:meth:`load` reads either back as float32). A path ending in ``.xz`` is compressed (lzma)."""
        from safetensors.torch import save

        from .atomic import atomic_write_bytes

        if dtype not in (torch.float32, torch.float16):
            raise InactiveHeadsError(f"scores are stored as float32 or float16, got {dtype}")
        tensors = {k: v.to(dtype).contiguous() for k, v in self._tensors.items()}
        data = save(tensors, {"meta": json.dumps(self.meta)})
        atomic_write_bytes(Path(path), lzma.compress(data) if Path(path).suffix == ".xz" else data)

    @classmethod
    def load(cls, path: str | Path) -> HeadScores:
        """Read a file written by :meth:`save` (compressed when its name ends in ``.xz``)."""
        from safetensors import SafetensorError, safe_open
        from safetensors.torch import load

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no scores file at {path}; record one with ih.record_scores(...).save(path)")
        try:
            if path.suffix == ".xz":
                data = lzma.decompress(path.read_bytes())
                # safetensors: an 8-byte little-endian header length, then the JSON header holding the metadata.
                header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
                tensors, meta = load(data), json.loads(header.get("__metadata__", {}).get("meta", "{}"))
            else:
                with safe_open(str(path), "pt") as f:
                    meta = json.loads((f.metadata() or {}).get("meta", "{}"))
                tensors = load_file(str(path))
        except (lzma.LZMAError, SafetensorError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InactiveHeadsError(
                f"{path} is not a scores file written by HeadScores.save ({e}); record the scores again "
                "(ih.record_scores(...).save(path), or calibrate the run again)"
            ) from None
        # Sorted: the reader's order is not the file's (loading from bytes varies between processes), and reports
        # list scores in this order.
        return cls({k: tensors[k] for k in sorted(tensors)}, meta)

    def __repr__(self) -> str:
        rows, layers, heads = self.shape
        return f"HeadScores(rows={rows}, layers={layers}, heads={heads}, names={self.names})"
