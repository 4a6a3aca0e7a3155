"""Calibrate thresholds and sweep (score function x target fraction) cells into a resumable run directory.

Layout: see :mod:`inactive_heads.rundir`. Every finished cell is one atomic ``cells/<key>.json``, keyed by
:func:`inactive_heads.store.cell_key` of everything that changes its answer, so a killed sweep resumes where it
stopped and never recomputes (or trusts a torn copy of) a finished cell.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from . import _compat, evaluation
from .engine import Policy
from .rundir import Cell, RunDir, display_name, model_identity, run_record, task_fingerprint
from .scores import SCORE_FUNCTIONS, HeadScores
from .store import cell_key
from .tasks import Task, get_task
from .thresholds import DEFAULT_TARGETS, check_targets, thresholds_for

__all__ = ["calibrate", "sweep"]


def _task(task: str | Task, eval_kwargs: dict[str, Any]) -> Task:
    # Load once, so each cell does not re-read the files; evaluate() accepts the loaded Task.
    if isinstance(task, Task):
        return task
    return get_task(task, eval_kwargs.get("data_dir"), eval_kwargs.get("source", "files"))


def calibrate(
    model: PreTrainedModel,
    tokenizer: Any,
    task: str | Task,
    run_dir: str | Path,
    *,
    shots: int | None = None,
    limit: int | None = None,
    seed: int = 0,
    batch_size: int = 8,
    calibration_task: str | Task | None = None,
    calibration_limit: int | None = None,
    model_name: str | None = None,
    **eval_kwargs: Any,
) -> HeadScores:
    """Write ``run.json`` and record every score on the calibration items into ``calibration/``.

    Calibration runs ``evaluation.evaluate(..., record=True)`` on ``calibration_task`` (default: ``task``) with
    ``calibration_limit`` items (default: ``limit``). An existing calibration of a matching run is reused.
    ``eval_kwargs`` go to ``evaluate`` (``data_dir``, ``source``, ``apply_chat_template``, ...).
    """
    run_dir = Path(run_dir)
    rd = RunDir(run_dir)
    task_obj = _task(task, eval_kwargs)
    n_layers, n_heads = _compat.model_shape(model)
    identity = model_identity(model)
    shots = task_obj.default_shots if shots is None else shots
    run = run_record(
        name=model_name or display_name(identity),
        identity=identity,
        task=task_obj.name,
        shots=shots,
        limit=limit,
        seed=seed,
        n_layers=n_layers,
        n_heads=n_heads,
    )
    cal_task = task_obj if calibration_task is None else _task(calibration_task, eval_kwargs)
    cal_limit = limit if calibration_limit is None else calibration_limit
    # Refuse bad settings before run.json exists: a rejected command must not claim the run directory.
    evaluation.check_request(task_obj, shots, limit, seed)
    evaluation.check_request(cal_task, shots, cal_limit, seed)
    rd.write_run(run)
    old = rd.read_meta() if rd.scores_path.is_file() else None
    if old is not None:
        wanted = {"task": cal_task.name, "task_items": task_fingerprint(cal_task), "limit": cal_limit, "seed": seed}
        if any(old.get(k) != v for k, v in wanted.items()):
            raise ValueError(f"{run_dir} holds a different calibration ({old}); use a new run directory")
        with contextlib.suppress(Exception):  # a torn or foreign file: record again
            return HeadScores.load(rd.scores_path)
    kwargs = {k: v for k, v in eval_kwargs.items() if k not in ("data_dir", "source")}
    t0 = time.perf_counter()
    result = evaluation.evaluate(
        model,
        tokenizer,
        cal_task,
        shots=shots,
        limit=cal_limit,
        seed=seed,
        batch_size=batch_size,
        record=True,
        **kwargs,
    )
    scores = result.scores
    if scores is None:
        raise RuntimeError("evaluate(record=True) returned no scores")
    meta = {
        "task": cal_task.name,
        "task_items": task_fingerprint(cal_task),
        "shots": shots,
        "limit": cal_limit,
        "seed": seed,
        "rows": scores.shape[0],
        "n_items": result.n_items,
        "accuracy": result.metrics["acc"],
        "seconds": time.perf_counter() - t0,
    }
    scores.meta.update(meta)
    scores.save(rd.scores_path)
    rd.write_meta(meta)  # written last: its presence marks a complete calibration
    return scores


def sweep(
    model: PreTrainedModel,
    tokenizer: Any,
    task: str | Task,
    run_dir: str | Path,
    *,
    scores: str | Sequence[str] = "all",
    targets: Iterable[float] = DEFAULT_TARGETS,
    shots: int | None = None,
    limit: int | None = None,
    seed: int = 0,
    batch_size: int = 8,
    calibration_task: str | Task | None = None,
    calibration_limit: int | None = None,
    model_name: str | None = None,
    progress: bool = True,
    on_cell: Callable[[str, dict[str, Any]], None] | None = None,
    **eval_kwargs: Any,
) -> list[dict[str, Any]]:
    """Calibrate (unless done), then evaluate the baseline and every (score, target) cell not already stored.

    Each target ``p`` becomes a threshold from the pooled calibration CDF (:func:`thresholds_from_cdf`), evaluated
    with ``Policy(score=name, threshold=t, seed=seed)``. ``on_cell(key, cell)`` is called after each new cell is
    stored. Returns all cells of the grid (baseline first). Batch size is not part of a cell's key.
    """
    names = list(SCORE_FUNCTIONS) if scores == "all" else [scores] if isinstance(scores, str) else list(scores)
    unknown = [n for n in names if n not in SCORE_FUNCTIONS]
    if unknown:
        raise ValueError(f"scores {unknown} are not registered; registered: {', '.join(SCORE_FUNCTIONS)}")
    ps = check_targets(targets)  # before calibrate writes anything
    run_dir = Path(run_dir)
    task_obj = _task(task, eval_kwargs)
    shots = task_obj.default_shots if shots is None else shots
    common: dict[str, Any] = dict(shots=shots, limit=limit, seed=seed, batch_size=batch_size)
    cal = calibrate(
        model,
        tokenizer,
        task_obj,
        run_dir,
        calibration_task=calibration_task,
        calibration_limit=calibration_limit,
        model_name=model_name,
        **common,
        **eval_kwargs,
    )
    rd = RunDir(run_dir)
    run = rd.read_run()
    if any(n not in cal for n in names):  # registered after calibrating: derive from the recorded raw statistics
        try:
            cal = cal.derive(names)
        except KeyError as e:
            raise ValueError(f"{e.args[0]}; calibrate again in a new run directory") from None
        cal.save(rd.scores_path)
    thresholds = thresholds_for(cal, ps, names)
    base_fields = {k: run[k] for k in ("task", "shots", "limit", "seed", "package_version")}
    base_fields["model"] = run["model"]["identity"]
    base_fields["task_items"] = task_fingerprint(task_obj)  # same name, other files: other answers
    grid: list[tuple[str | None, float | None, float | None]] = [(None, None, None)]
    grid += [(n, p, thresholds[n][i]) for i, p in enumerate(ps) for n in names]  # target-major: early full picture

    store = rd.cell_store()
    keys = [cell_key(**base_fields, score=s, threshold=t) for s, _, t in grid]
    kwargs = {k: v for k, v in eval_kwargs.items() if k not in ("data_dir", "source")}
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
            policy = None if score is None else Policy(score=score, threshold=threshold, seed=seed)
            result = evaluation.evaluate(model, tokenizer, task_obj, policy=policy, **common, **kwargs)
            cell = Cell.from_result(
                result, score=score, target=target, threshold=threshold, n_layers=n_layers, n_heads=n_heads
            ).to_json()
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
