"""The run directory: its layout, the run record, the cell record, and reading a run back.

Layout::

    run.json                        the run record, see RUN_FIELDS: {model: {name, identity}, task, task_items,
                                     evaluation (EvalConfig.identity()), package_version, n_layers, n_heads}
    calibration/scores.safetensors  HeadScores.save of the calibration pass
    calibration/scores.float16.safetensors.xz
                                    optional compact copy: the scores a study names, as float16, lzma-compressed,
                                     small enough to commit; reports read it in preference to the full file (see
                                     read_report_scores)
    calibration/scores.float16.json in place of the copy where another run of the study holds the very same one
                                     (one calibration recorded twice): {same_as: its path, relative; sha256: of
                                     its tensors}
    calibration/meta.json           written last: its presence marks a complete calibration
    calibration/thresholds.json     the thresholds cells were planned with: {calibration (the identity fields of
                                     meta.json), scores: {name: {definition, targets: {p: threshold}}}}; cell keys
                                     depend on it, so a run kept without its scores (large, and they can be
                                     recorded again) still plans exactly the cells it stored
    cells/<key>.json                one finished cell, see :class:`Cell`; score is null for the baseline; run is the
                                     run_digest it was made for (cells of another run are never read);
                                     per_head is [L][H] fractions of rows in which the head was zeroed
    searches/<key>.json             one finished search for a score's crossing, see
                                     :class:`~inactive_heads.runs.adaptive.Search`
    searches/blocks/<key>.json      one evaluated block of items of a search's probe, replayed on resume
    partial/<key>/batch-<i>.pt      a generative cell under way: each finished batch of its generation, reused when
                                     the cell is computed again after an interruption; removed once it is stored

This module is the only one that knows these paths; the sweep writes through it and the report reads through it.
It holds the run record, the cell record and their reading back together so that the identity a
directory is checked against is defined in exactly one place.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch
from transformers import PreTrainedModel

from .. import _compat
from .._model import removed_heads
from ..atomic import atomic_write_json, canonical_json
from ..errors import InactiveHeadsError
from ..scores import SCORE_FUNCTIONS, HeadScores
from ..stats.curves import TABLE2_TOLERANCE, Curve, Table2Row, table2
from .store import ResultStore, package_version

if TYPE_CHECKING:
    from ..evaluation import EvalResult
    from ..tasks import Task

__all__ = [
    "CELL_FIELDS",
    "RUN_FIELDS",
    "Cell",
    "RunData",
    "RunDir",
    "check_model",
    "display_name",
    "load_run",
    "model_identity",
    "run_record",
    "score_label",
    "share_compact_scores",
    "slug",
    "task_fingerprint",
]

RUN_FIELDS = ("model", "task", "task_items", "evaluation", "package_version", "n_layers", "n_heads")
# Keys of the run that must match for cells of an existing run directory to be reused.
# What the answers depend on: a run directory is reused only when all of it matches (see run_digest).
_RUN_MATCH = ("model", "task", "task_items", "evaluation", "package_version")


# --- identity ----------------------------------------------------------------------------------------------------


def model_identity(model: torch.nn.Module) -> dict[str, Any]:
    """What identifies the model's weights: the loader's source record when present, plus class, dtype and a
    fingerprint of a few thousand weights (cheap, and tells apart models that share a name but not weights); for a
    pruned model also its removed heads."""
    source = getattr(model, "inactive_heads_source", None)
    params = list(model.parameters())
    digest = hashlib.sha256()
    for p in (params[0], params[len(params) // 2], params[-1]) if params else ():
        digest.update(p.detach().reshape(-1)[:4096].to("cpu", torch.float32).numpy().tobytes())
    identity: dict[str, Any] = {
        "source": dict(source) if isinstance(source, dict) else None,
        "name_or_path": _compat.name_or_path(model),
        "class": type(model).__name__,
        "dtype": str(params[0].dtype) if params else "",
        "weights_sample_sha256": digest.hexdigest()[:16],
    }
    # A model pruned in memory keeps its source and may keep every sampled weight: name the removed heads.
    removed = removed_heads(model.config) if hasattr(model, "config") else None
    if removed is not None:
        identity["pruned_heads"] = removed
    return identity


def check_model(run: dict[str, Any], model: PreTrainedModel) -> None:
    """Whether ``model`` is the one the run record ``run`` was made on: InactiveHeadsError when its shape differs, a
    warning when only its weights do (another loader or dtype of the same model also differs there)."""
    layers, heads = _compat.model_shape(model)
    if (run.get("n_layers"), run.get("n_heads")) != (layers, heads):
        raise InactiveHeadsError(
            f"the run was made on a model of {run.get('n_layers')} layers x {run.get('n_heads')} heads, this one has "
            f"{layers} x {heads}; calibrate this model"
        )
    recorded = ((run.get("model") or {}).get("identity") or {}).get("weights_sample_sha256")
    if recorded is not None and recorded != model_identity(model)["weights_sample_sha256"]:
        warnings.warn(
            "the run was made on other weights than this model's; its thresholds may not transfer", stacklevel=3
        )


def display_name(identity: dict[str, Any]) -> str:
    """The model name users know, from a :func:`model_identity` record."""
    # A GGUF loads from a cache directory; the name users know is the file's (or directory's) own.
    spec = (identity["source"] or {}).get("spec") or identity["name_or_path"]
    if not spec:
        return str(identity["class"])
    path = Path(str(spec).rstrip("/"))
    return path.stem if path.suffix == ".gguf" else path.name if path.exists() else str(spec)


def task_fingerprint(task: Task) -> str:
    """Digest of a task's items: the same task name over other files gives other answers."""
    digest = hashlib.sha256()
    for it in task.items:
        digest.update(json.dumps([it.id, it.contexts, it.continuations, it.gold, it.group]).encode())
    return digest.hexdigest()[:16]


def slug(text: str) -> str:
    """``text`` as a file or directory name: runs of other characters than ``A-Za-z0-9._-`` become one ``-``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "model"


def score_label(name: str) -> str:
    """The display label of a score function (its name when it is not registered in this process)."""
    spec = SCORE_FUNCTIONS.get(name)
    return spec.label if spec is not None else name


# --- records -----------------------------------------------------------------------------------------------------


def run_record(
    *,
    name: str,
    identity: dict[str, Any],
    task: str,
    task_items: str,
    evaluation: dict[str, Any],
    n_layers: int,
    n_heads: int,
) -> dict[str, Any]:
    """The content of ``run.json``: ``evaluation`` is ``EvalConfig.identity()`` (every option that changes an
    answer), ``task_items`` the fingerprint of the task's items; the installed package version is added."""
    return {
        "model": {"name": name, "identity": identity},
        "task": task,
        "task_items": task_items,
        "evaluation": evaluation,
        "package_version": package_version(),
        "n_layers": n_layers,
        "n_heads": n_heads,
    }


def run_digest(run: dict[str, Any]) -> str:
    """The identity of a run: a hash of everything in its record that changes an answer. Cells and the
    calibration carry it, so a directory whose run.json was replaced or deleted never mixes two runs."""
    match = {k: run.get(k) for k in _RUN_MATCH}
    match["model"] = (run.get("model") or {}).get("identity")  # the display name does not change an answer
    return hashlib.sha256(canonical_json(match).encode()).hexdigest()[:16]


def _json_object(path: Path) -> dict[str, Any]:
    """The JSON object stored at ``path``; InactiveHeadsError naming the file when it holds something else."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InactiveHeadsError(f"{path} is not valid JSON ({e}); restore it or use a new run directory") from None
    if not isinstance(value, dict):
        raise InactiveHeadsError(f"{path} holds a JSON {type(value).__name__}, not an object; remove or restore it")
    return value


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_numbers(v: Any) -> bool:
    return isinstance(v, list) and all(is_number(x) for x in v)


_CELL_TYPES: dict[str, Callable[[Any], bool]] = {
    "score": lambda v: v is None or isinstance(v, str),
    "target": lambda v: v is None or is_number(v),
    "threshold": lambda v: v is None or is_number(v),
    "inactive_when": lambda v: v is None or isinstance(v, str),
    "accuracy": is_number,
    "acc_norm": lambda v: v is None or is_number(v),
    "mean_ll_correct": lambda v: v is None or is_number(v),
    "fraction_zeroed": is_number,
    "per_layer": _is_numbers,
    "per_head": lambda v: isinstance(v, list) and all(_is_numbers(row) for row in v),
    "n_items": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "seconds": is_number,
    "per_item": lambda v: v is None or isinstance(v, dict),
    "run": lambda v: v is None or isinstance(v, str),
    "generation": lambda v: v is None or isinstance(v, dict),
}


@dataclass(frozen=True)
class Cell:
    """One finished sweep cell, as stored in ``cells/<key>.json``.

    ``score``, ``target``, ``threshold`` and ``inactive_when`` are None for the baseline. ``per_layer`` and
    ``per_head`` are measured fractions of rows in which heads were zeroed (zeros for the baseline); ``per_item``
    holds the per-item answers (ids, gold, pred, pred_norm, loglikelihoods) and is left out when None.
    ``generation`` (generative tasks): the mode, tokens/s, cache bytes and each item's generated token ids, which
    the report compares with the baseline's (:func:`inactive_heads.generation.cascade`).
    """

    score: str | None
    target: float | None
    threshold: float | None
    inactive_when: str | None
    accuracy: float
    acc_norm: float | None
    mean_ll_correct: float | None
    fraction_zeroed: float
    per_layer: list[float]
    per_head: list[list[float]]
    n_items: int
    seconds: float
    per_item: dict[str, Any] | None = field(default=None)
    run: str | None = field(default=None)  # run_digest of the run it was computed for
    generation: dict[str, Any] | None = field(default=None)

    @classmethod
    def from_result(
        cls,
        result: EvalResult,
        *,
        score: str | None,
        target: float | None,
        threshold: float | None,
        n_layers: int,
        n_heads: int,
        run: str | None = None,
    ) -> Cell:
        """The cell of one evaluation (``score`` None: the baseline, which zeroes nothing)."""
        per_layer, per_head = result.zeroed_per_layer, result.zeroed_per_head
        if per_layer is None or per_head is None:  # no policy: nothing zeroed
            per_layer, per_head = [0.0] * n_layers, [[0.0] * n_heads for _ in range(n_layers)]
        return cls(
            score=score,
            target=target,
            threshold=threshold,
            inactive_when=None if score is None else SCORE_FUNCTIONS[score].inactive_when,
            accuracy=float(result.metrics["acc"]),
            acc_norm=result.metrics.get("acc_norm"),
            mean_ll_correct=result.gold_loglikelihood,
            fraction_zeroed=0.0 if result.zeroed_fraction is None else float(result.zeroed_fraction),
            per_layer=per_layer,
            per_head=per_head,
            n_items=result.n_items,
            seconds=float(result.timing["total_s"]),
            per_item={
                "ids": result.item_ids,
                "gold": result.gold,
                "pred": result.pred,
                "pred_norm": result.pred_norm,
                "loglikelihoods": result.loglikelihoods,
            },
            run=run,
            generation=None if result.generation is None else dict(result.generation),
        )

    def correct(self, ids: Sequence[Any] | None = None) -> npt.NDArray[np.bool_] | None:
        """Per item, whether it was answered right (``pred == gold``); None without per-item answers, or when they
        are not for the items ``ids`` (in that order)."""
        if self.per_item is None or (ids is not None and self.per_item.get("ids") != list(ids)):
            return None
        right: npt.NDArray[np.bool_] = np.asarray(self.per_item["pred"]) == np.asarray(self.per_item["gold"])
        return right

    def to_json(self) -> dict[str, Any]:
        """The stored JSON object (``per_item`` only when present)."""
        out = asdict(self)
        for optional in ("per_item", "run", "generation"):
            if out[optional] is None:
                del out[optional]
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Cell:
        """Parse a stored cell; ValueError when a field is missing or of the wrong type (other keys are ignored)."""
        if not isinstance(obj, dict):
            raise InactiveHeadsError(f"a cell is a JSON object, got {type(obj).__name__}")
        missing = [f for f in CELL_FIELDS if f not in obj]
        wrong = [f for f, ok in _CELL_TYPES.items() if f in obj and not ok(obj[f])]
        if missing or wrong:
            problems = [f"{what} {names}" for what, names in (("missing", missing), ("wrong type", wrong)) if names]
            raise InactiveHeadsError(f"malformed cell: {', '.join(problems)}")
        return cls(**{f.name: obj.get(f.name) for f in fields(cls)})  # type: ignore[arg-type]  # checked above


CELL_FIELDS = tuple(f.name for f in fields(Cell) if f.default is MISSING)


# --- the directory -----------------------------------------------------------------------------------------------


def _compact_digest(path: Path) -> str:
    """sha256 of a compact scores file's tensors (names, dtypes, shapes, values), whatever its metadata says."""
    scores = HeadScores.load(path)
    h = hashlib.sha256()
    for name in sorted(scores.names):
        tensor = scores[name].to(torch.float16)  # the stored values: float16 -> float32 -> float16 is exact
        h.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        h.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def share_compact_scores(dirs: Sequence[RunDir]) -> None:
    """Keep one compact copy of each calibration recorded more than once (e.g. by runs of two tasks calibrated on a
    third): the first of ``dirs`` holding those tensors keeps its file, each other holds a reference to it."""
    owners: dict[str, RunDir] = {}
    for rd in dirs:
        if not rd.compact_scores_path.is_file():
            continue
        digest = _compact_digest(rd.compact_scores_path)
        owner = owners.setdefault(digest, rd)
        if owner is not rd:
            same_as = os.path.relpath(owner.compact_scores_path, rd.compact_reference_path.parent)
            atomic_write_json(rd.compact_reference_path, {"same_as": same_as, "sha256": digest})
            rd.compact_scores_path.unlink()


class RunDir:
    """Paths of one run directory and reading/writing its records (layout: see the module docstring)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @property
    def run_path(self) -> Path:
        return self.root / "run.json"

    @property
    def scores_path(self) -> Path:
        return self.root / "calibration" / "scores.safetensors"

    @property
    def compact_scores_path(self) -> Path:
        return self.root / "calibration" / "scores.float16.safetensors.xz"

    @property
    def compact_reference_path(self) -> Path:
        return self.root / "calibration" / "scores.float16.json"

    @property
    def meta_path(self) -> Path:
        return self.root / "calibration" / "meta.json"

    @property
    def thresholds_path(self) -> Path:
        return self.root / "calibration" / "thresholds.json"

    @property
    def cells_path(self) -> Path:
        return self.root / "cells"

    @property
    def searches_path(self) -> Path:
        return self.root / "searches"

    @property
    def blocks_path(self) -> Path:
        return self.searches_path / "blocks"

    def partial_path(self, key: str) -> Path:
        """Where a generative cell under way keeps its finished batches (removed once the cell is stored)."""
        return self.root / "partial" / key

    def read_run(self) -> dict[str, Any]:
        """The run record; FileNotFoundError when this is not a run directory."""
        if not self.run_path.is_file():
            raise FileNotFoundError(f"{self.root} is not a run directory: no run.json")
        return _json_object(self.run_path)

    def check_run(self, run: dict[str, Any]) -> bool:
        """Whether ``run.json`` exists; ValueError when it describes another run (naming what differs)."""
        missing = [k for k in RUN_FIELDS if k not in run]
        if missing:
            raise InactiveHeadsError(f"run record lacks {missing}")
        if not self.run_path.is_file():
            return False
        old = json.loads(self.run_path.read_text(encoding="utf-8"))
        diff = [k for k in _RUN_MATCH if json.dumps(old.get(k), sort_keys=True) != json.dumps(run[k], sort_keys=True)]
        if diff == ["model"] and (old.get("model") or {}).get("identity") == (run["model"] or {}).get("identity"):
            raise InactiveHeadsError(
                f"{self.root} holds this run under the model name {old['model'].get('name')!r}, not "
                f"{run['model'].get('name')!r}; give that name (--name) or use a new run directory"
            )
        if diff:
            raise InactiveHeadsError(f"{self.root} holds a different run (differs in {diff}); use a new run directory")
        return True

    def write_run(self, run: dict[str, Any]) -> None:
        """Write ``run.json``, or check that the existing one describes the same run (ValueError when not)."""
        if not self.check_run(run):
            atomic_write_json(self.run_path, run)

    def check_writable(self) -> None:
        """Raise a one-line PermissionError/OSError now, not after the first cell has been computed."""
        self.cells_path.mkdir(parents=True, exist_ok=True)
        probe = self.cells_path / f".write-test-{os.getpid()}"
        try:
            probe.write_bytes(b"")
        except OSError as e:
            raise OSError(e.errno, f"cannot write into run directory {self.root} ({e.strerror})") from None
        probe.unlink()

    def read_meta(self) -> dict[str, Any] | None:
        """The calibration's meta record; None when no calibration has completed."""
        if not self.meta_path.is_file():
            return None
        return _json_object(self.meta_path)

    def write_meta(self, meta: dict[str, Any]) -> None:
        """Write the calibration's meta record: after the scores, as it marks the calibration complete."""
        atomic_write_json(self.meta_path, meta)

    def read_thresholds(self) -> dict[str, Any]:
        """The thresholds record (see the module docstring); empty when none is written yet."""
        if not self.thresholds_path.is_file():
            return {}
        return _json_object(self.thresholds_path)

    def write_thresholds(self, record: dict[str, Any]) -> None:
        atomic_write_json(self.thresholds_path, record)

    def read_scores(self) -> HeadScores | None:
        """The scores of the completed calibration; None when no calibration has completed."""
        if self.read_meta() is None or not self.scores_path.is_file():
            return None
        return HeadScores.load(self.scores_path)

    def write_compact_scores(self, names: Sequence[str]) -> bool:
        """Write the compact copy of the calibration: scores ``names`` (derived where needed) as float16. Returns
        False, writing nothing, when the full scores are not stored. Thresholds are never taken from the copy (new
        ones come from the full scores), so its rounding (a relative 5e-4) reaches only the report's analyses."""
        scores = self.read_scores()
        if scores is None:
            return False
        try:
            derived = scores.derive(names)
        except KeyError as e:
            raise InactiveHeadsError(f"{self.root}: {e.args[0]}; calibrate again in a new run directory") from None
        kept = HeadScores({n: derived[n] for n in names}, derived.meta)
        for n in names:
            values = kept[n]
            if bool((values.isfinite() & ~values.to(torch.float16).isfinite()).any()):
                raise InactiveHeadsError(f"{self.root}: score {n!r} exceeds float16's range; keep the full scores")
        kept.save(self.compact_scores_path, dtype=torch.float16)
        self.compact_reference_path.unlink(missing_ok=True)
        return True

    def compact_scores_source(self) -> Path | None:
        """The compact copy this run's report reads: its own, or the identical copy of another run it refers to
        (checked: InactiveHeadsError, naming the fix, when that copy is missing or no longer the same); None when
        neither is kept."""
        if self.compact_scores_path.is_file():
            return self.compact_scores_path
        if not self.compact_reference_path.is_file():
            return None
        reference = _json_object(self.compact_reference_path)
        source = self.compact_reference_path.parent / str(reference.get("same_as"))
        if not source.is_file() or _compact_digest(source) != reference.get("sha256"):
            raise InactiveHeadsError(
                f"{self.root}: the compact calibration scores it shares with {source.parent.parent} are missing or "
                "have changed; run the study again on a machine that holds its full scores, or remove "
                f"{self.compact_reference_path} and record them again"
            )
        return source

    def read_report_scores(self) -> HeadScores | None:
        """The calibration scores a report analyses: the compact copy where one is kept, its own or the one it
        shares (so a clone that holds only the copies reports the same numbers as the machine that calibrated), else
        the full scores; None when neither is stored or no calibration has completed."""
        source = self.compact_scores_source() if self.read_meta() is not None else None
        return self.read_scores() if source is None else HeadScores.load(source)

    def read_calibration(self, score: str | None = None) -> HeadScores:
        """The scores of the completed calibration, with ``score`` derived when it was registered after calibrating;
        InactiveHeadsError when there is none or it holds no rows."""
        scores = self.read_scores()
        if scores is None:
            raise InactiveHeadsError(
                f"{self.root} holds no finished calibration; run `inactive-heads calibrate --run-dir {self.root} ...`"
            )
        if score is not None and score not in scores:
            try:
                scores = scores.derive([score])
            except KeyError as e:
                raise InactiveHeadsError(f"{e.args[0]}; calibrate again in a new run directory") from None
        if not scores.shape[0]:
            raise InactiveHeadsError(f"{self.root}: the calibration holds no rows")
        return scores

    def cell_store(self) -> ResultStore:
        """The finished cells; a record that is not a valid :class:`Cell` counts as not done."""
        return ResultStore(self.cells_path, required=CELL_FIELDS, validate=Cell.from_json)


# --- reading a run back ------------------------------------------------------------------------------------------


@dataclass
class RunData:
    """One loaded run directory."""

    dir: Path
    run: dict[str, Any]
    cells: list[Cell]
    scores: HeadScores | None = None
    calibration_meta: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        model = self.run.get("model") or {}
        return str(model.get("name") or self.dir.name) if isinstance(model, dict) else str(model)

    @property
    def settings(self) -> dict[str, Any]:
        """The run record, with every evaluation option at the top level and filled in (the record keeps only the
        options that differ from their defaults)."""
        from ..evaluation import EvalConfig

        recorded = self.run.get("evaluation", {})
        known = {f.name for f in fields(EvalConfig)}
        options = asdict(EvalConfig(**{k: v for k, v in recorded.items() if k in known}))
        return {**options, **recorded, **self.run}

    @property
    def baseline(self) -> float:
        """Accuracy of the baseline cell (``score`` null)."""
        for c in self.cells:
            if c.score is None:
                return float(c.accuracy)
        raise InactiveHeadsError(f"run {self.dir} has no baseline cell (score null)")

    @property
    def score_names(self) -> list[str]:
        """Score functions with at least one cell, in registry order (unknown names last, sorted)."""
        present = {c.score for c in self.cells if c.score is not None}
        return [n for n in SCORE_FUNCTIONS if n in present] + sorted(present - set(SCORE_FUNCTIONS))

    @property
    def row_items(self) -> np.ndarray | None:
        """The item of each calibration row (``[rows]``, positions among the calibration's items); None when the
        calibration did not record them or they do not match its scores."""
        items = self.calibration_meta.get("row_items")
        if self.scores is None or not isinstance(items, list) or len(items) != self.scores.shape[0]:
            return None
        return np.asarray(items, dtype=np.int64)

    def curves(self) -> dict[str, Curve]:
        """Accuracy-vs-fraction-zeroed curve per score function (baseline point at 0 unless a p=0 cell exists)."""
        out = {}
        base = self.baseline
        for name in self.score_names:
            cells = sorted((c for c in self.cells if c.score == name), key=lambda c: c.fraction_zeroed)
            out[name] = Curve(
                name,
                [(float(c.fraction_zeroed), float(c.accuracy)) for c in cells],
                base,
                label=score_label(name),
                extra={"cells": cells},
            )
        return out

    def table2(self, tol: float = TABLE2_TOLERANCE) -> list[Table2Row]:
        return table2(self.curves().values(), tol)


def load_run(run_dir: str | Path, keys: Iterable[str] | None = None) -> RunData:
    """Read a run directory (see the module docstring): the cells of ``keys`` in that order (default: every cell of
    the run, by key). A cell file that is not a valid :class:`Cell` (corrupt, partial, a field of the wrong type) is
    skipped with a warning that names it."""
    rd = RunDir(run_dir)
    run = rd.read_run()
    digest = run_digest(run)
    cells, foreign = [], 0
    for _, cell in rd.cell_store().load(Cell.from_json, keys):
        if cell.run == digest:
            cells.append(cell)
        else:
            foreign += 1
    if foreign:
        warnings.warn(f"{rd.root}: ignored {foreign} cell(s) made for another run", stacklevel=2)
    meta = rd.read_meta()
    return RunData(rd.root, run, cells, rd.read_report_scores(), {} if meta is None else meta)
