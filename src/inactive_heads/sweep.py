"""Calibrate thresholds and sweep (score function x target fraction) cells into a resumable run directory.

Layout: see :mod:`inactive_heads.report`. Every finished cell is one atomic ``cells/<key>.json``, keyed by
:func:`inactive_heads.store.cell_key` of everything that changes its answer, so a killed sweep resumes where it
stopped and never recomputes (or trusts a torn copy of) a finished cell.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from . import evaluation
from .engine import Policy
from .evaluation import EvalConfig
from .report import CELL_FIELDS
from .scores import SCORE_FUNCTIONS, HeadScores
from .store import ResultStore, atomic_write_json, cell_key
from .tasks import Task, get_task
from .thresholds import DEFAULT_TARGETS, check_targets, thresholds_for

__all__ = ["calibrate", "model_identity", "sweep"]

# Keys of the run that must match for cells of an existing run directory to be reused.
_RUN_MATCH = ("model", "task", "shots", "limit", "seed", "package_version")


def _version() -> str:
    from . import __version__

    return __version__


def model_identity(model: torch.nn.Module) -> dict[str, Any]:
    """What identifies the model's weights: the loader's source record when present, plus class, dtype and a
    fingerprint of a few thousand weights (cheap, and tells apart models that share a name but not weights)."""
    source = getattr(model, "inactive_heads_source", None)
    params = list(model.parameters())
    digest = hashlib.sha256()
    for p in (params[0], params[len(params) // 2], params[-1]) if params else ():
        digest.update(p.detach().reshape(-1)[:4096].to("cpu", torch.float32).numpy().tobytes())
    config = getattr(model, "config", None)
    return {
        "source": dict(source) if isinstance(source, dict) else None,
        "name_or_path": getattr(config, "_name_or_path", ""),
        "class": type(model).__name__,
        "dtype": str(params[0].dtype) if params else "",
        "weights_sample_sha256": digest.hexdigest()[:16],
    }


def _display_name(identity: dict[str, Any]) -> str:
    # A GGUF loads from a cache directory; the name users know is the file's (or directory's) own.
    spec = (identity["source"] or {}).get("spec") or identity["name_or_path"]
    if not spec:
        return identity["class"]
    path = Path(str(spec).rstrip("/"))
    return path.stem if path.suffix == ".gguf" else path.name if path.exists() else str(spec)


def _shape(model: torch.nn.Module) -> tuple[int, int]:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    return int(layers), int(heads)


def _task(task: str | Task, config: EvalConfig) -> Task:
    # Load once, so each cell does not re-read the files; evaluate() accepts the loaded Task.
    if isinstance(task, Task):
        return task
    return get_task(task, config.data_dir, config.source)


def _task_fingerprint(task: Task) -> str:
    digest = hashlib.sha256()
    for it in task.items:
        digest.update(json.dumps([it.id, it.contexts, it.continuations, it.gold, it.group]).encode())
    return digest.hexdigest()[:16]


def _result_cell(result: evaluation.EvalResult, n_layers: int, n_heads: int) -> dict[str, Any]:
    no_policy = result.zeroed_per_layer is None
    return {
        "accuracy": float(result.metrics["acc"]),
        "acc_norm": result.metrics.get("acc_norm"),
        "mean_ll_correct": result.gold_loglikelihood,
        "fraction_zeroed": 0.0 if result.zeroed_fraction is None else float(result.zeroed_fraction),
        "per_layer": [0.0] * n_layers if no_policy else result.zeroed_per_layer,
        "per_head": [[0.0] * n_heads for _ in range(n_layers)] if no_policy else result.zeroed_per_head,
        "n_items": result.n_items,
        "seconds": float(result.timing["total_s"]),
        "per_item": {
            "ids": result.item_ids,
            "gold": result.gold,
            "pred": result.pred,
            "pred_norm": result.pred_norm,
            "loglikelihoods": result.loglikelihoods,
        },
    }


def _write_run(run_dir: Path, run: dict[str, Any]) -> None:
    path = run_dir / "run.json"
    if path.is_file():
        old = json.loads(path.read_text(encoding="utf-8"))
        diff = [k for k in _RUN_MATCH if json.dumps(old.get(k), sort_keys=True) != json.dumps(run[k], sort_keys=True)]
        if diff:
            raise ValueError(f"{run_dir} holds a different run (differs in {diff}); use a new run directory")
        return
    atomic_write_json(path, run)


def calibrate(
    model: torch.nn.Module,
    tokenizer: Any,
    task: str | Task,
    run_dir: str | Path,
    config: EvalConfig | None = None,
    *,
    calibration_task: str | Task | None = None,
    calibration_limit: int | None = None,
    model_name: str | None = None,
    **options: Any,
) -> HeadScores:
    """Write ``run.json`` and record every score on the calibration items into ``calibration/``.

    Calibration runs ``evaluation.evaluate(..., record=True)`` on ``calibration_task`` (default: ``task``) with
    ``calibration_limit`` items (default: ``config.limit``). An existing calibration of a matching run is reused.
    ``config``: the evaluation options (:class:`~inactive_heads.evaluation.EvalConfig`); ``options``: any of its
    fields by name, applied on top.
    """
    config = EvalConfig.from_options(config, **options)
    run_dir = Path(run_dir)
    task_obj = _task(task, config)
    n_layers, n_heads = _shape(model)
    identity = model_identity(model)
    config = config.replace(shots=config.shots_for(task_obj))
    shots, limit, seed = config.shots, config.limit, config.seed
    run = {
        "model": {"name": model_name or _display_name(identity), "identity": identity},
        "task": task_obj.name,
        "shots": shots,
        "limit": limit,
        "seed": seed,
        "package_version": _version(),
        "n_layers": n_layers,
        "n_heads": n_heads,
    }
    cal_task = task_obj if calibration_task is None else _task(calibration_task, config)
    cal_limit = limit if calibration_limit is None else calibration_limit
    # Refuse bad settings before run.json exists: a rejected command must not claim the run directory.
    cal_config = config.replace(limit=cal_limit)
    evaluation.check_request(task_obj, config)
    evaluation.check_request(cal_task, cal_config)
    _write_run(run_dir, run)
    scores_path = run_dir / "calibration" / "scores.safetensors"
    meta_path = run_dir / "calibration" / "meta.json"
    if scores_path.is_file() and meta_path.is_file():
        old = json.loads(meta_path.read_text(encoding="utf-8"))
        wanted = {"task": cal_task.name, "task_items": _task_fingerprint(cal_task), "limit": cal_limit, "seed": seed}
        if any(old.get(k) != v for k, v in wanted.items()):
            raise ValueError(f"{run_dir} holds a different calibration ({old}); use a new run directory")
        with contextlib.suppress(Exception):  # a torn or foreign file: record again
            return HeadScores.load(scores_path)
    t0 = time.perf_counter()
    result = evaluation.evaluate(model, tokenizer, cal_task, cal_config, record=True)
    scores = result.scores
    if scores is None:
        raise RuntimeError("evaluate(record=True) returned no scores")
    meta = {
        "task": cal_task.name,
        "task_items": _task_fingerprint(cal_task),
        "shots": shots,
        "limit": cal_limit,
        "seed": seed,
        "rows": scores.shape[0],
        "n_items": result.n_items,
        "accuracy": result.metrics["acc"],
        "seconds": time.perf_counter() - t0,
    }
    scores.meta.update(meta)
    scores.save(scores_path)
    atomic_write_json(meta_path, meta)  # written last: its presence marks a complete calibration
    return scores


def sweep(
    model: torch.nn.Module,
    tokenizer: Any,
    task: str | Task,
    run_dir: str | Path,
    config: EvalConfig | None = None,
    *,
    scores: str | Sequence[str] = "all",
    targets: Iterable[float] = DEFAULT_TARGETS,
    calibration_task: str | Task | None = None,
    calibration_limit: int | None = None,
    model_name: str | None = None,
    progress: bool = True,
    on_cell: Callable[[str, dict[str, Any]], None] | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Calibrate (unless done), then evaluate the baseline and every (score, target) cell not already stored.

    ``config``: the evaluation options (:class:`~inactive_heads.evaluation.EvalConfig`); ``options``: any of its
    fields by name, applied on top. Each target ``p`` becomes a threshold from the pooled calibration CDF
    (:func:`thresholds_from_cdf`), evaluated with ``Policy(score=name, threshold=t, seed=config.seed)``.
    ``on_cell(key, cell)`` is called after each new cell is stored. Returns all cells of the grid (baseline
    first). Batch size is not part of a cell's key.
    """
    config = EvalConfig.from_options(config, **options)
    names = list(SCORE_FUNCTIONS) if scores == "all" else [scores] if isinstance(scores, str) else list(scores)
    unknown = [n for n in names if n not in SCORE_FUNCTIONS]
    if unknown:
        raise ValueError(f"scores {unknown} are not registered; registered: {', '.join(SCORE_FUNCTIONS)}")
    ps = check_targets(targets)  # before calibrate writes anything
    run_dir = Path(run_dir)
    task_obj = _task(task, config)
    config = config.replace(shots=config.shots_for(task_obj))
    cal = calibrate(
        model,
        tokenizer,
        task_obj,
        run_dir,
        config,
        calibration_task=calibration_task,
        calibration_limit=calibration_limit,
        model_name=model_name,
    )
    run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    if any(n not in cal for n in names):  # registered after calibrating: derive from the recorded raw statistics
        try:
            cal = cal.derive(names)
        except KeyError as e:
            raise ValueError(f"{e.args[0]}; calibrate again in a new run directory") from None
        cal.save(run_dir / "calibration" / "scores.safetensors")
    thresholds = thresholds_for(cal, ps, names)
    base_fields = {k: run[k] for k in ("task", "shots", "limit", "seed", "package_version")}
    base_fields["model"] = run["model"]["identity"]
    base_fields["task_items"] = _task_fingerprint(task_obj)  # same name, other files: other answers
    grid: list[tuple[str | None, float | None, float | None]] = [(None, None, None)]
    grid += [(n, p, thresholds[n][i]) for i, p in enumerate(ps) for n in names]  # target-major: early full picture

    store = ResultStore(run_dir / "cells", required=CELL_FIELDS)
    keys = [cell_key(**base_fields, score=s, threshold=t) for s, _, t in grid]
    n_layers, n_heads = run["n_layers"], run["n_heads"]
    done = sum(store.has(k) for k in set(keys))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(set(keys)), initial=done, desc=f"sweep {run['model']['name']}", unit="cell")
    seen: set[str] = set()
    try:
        for (score, target, threshold), key in zip(grid, keys, strict=True):
            if key in seen:  # two targets tied to one threshold: one cell answers both
                continue
            seen.add(key)
            if store.has(key):
                continue
            policy = None if score is None else Policy(score=score, threshold=threshold, seed=config.seed)
            result = evaluation.evaluate(model, tokenizer, task_obj, config, policy=policy)
            cell = {
                "score": score,
                "target": target,
                "threshold": threshold,
                "inactive_when": None if score is None else SCORE_FUNCTIONS[score].inactive_when,
                **_result_cell(result, n_layers, n_heads),
            }
            store.put(key, cell)
            if on_cell is not None:
                on_cell(key, cell)
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(f"{score or 'baseline'} p={target}")
    finally:
        if bar is not None:
            bar.close()
    return [store.get(k) for k in dict.fromkeys(keys)]
