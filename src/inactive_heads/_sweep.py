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
from .evaluation import EvalConfig
from .rundir import Cell, RunDir, display_name, model_identity, run_digest, run_record, task_fingerprint
from .scores import SCORE_FUNCTIONS, HeadScores
from .store import cell_key
from .tasks import Task, get_task
from .thresholds import DEFAULT_TARGETS, check_targets, thresholds_for

__all__ = ["calibrate", "sweep"]


def _task(task: str | Task, config: EvalConfig) -> Task:
    # Load once, so each cell does not re-read the files; evaluate() accepts the loaded Task.
    if isinstance(task, Task):
        return task
    return get_task(task, config.data_dir, config.source)


def _check_calibration(rd: RunDir, wanted: dict[str, Any]) -> bool:
    """Whether ``rd`` holds a finished calibration for ``wanted``; ValueError when it holds another one."""
    old = rd.read_meta() if rd.scores_path.is_file() else None
    if old is None:
        return False
    if any(old.get(k) != v for k, v in wanted.items()):
        raise ValueError(
            f"{rd.root} holds a calibration made for another run or other calibration items/options; "
            "use a new run directory"
        )
    return True


def calibrate(
    model: PreTrainedModel,
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
    ``calibration_limit`` items (default: ``config.limit``). An existing calibration is reused only when it was made
    for this run (same run record) with the same calibration items and options; otherwise it is refused.
    ``config``: the evaluation options (:class:`~inactive_heads.evaluation.EvalConfig`); ``options``: any of its
    fields by name, applied on top.
    """
    config = EvalConfig.from_options(config, **options)
    rd = RunDir(run_dir)
    task_obj = _task(task, config)
    n_layers, n_heads = _compat.model_shape(model)
    identity = model_identity(model)
    config = config.replace(shots=config.shots_for(task_obj))
    run = run_record(
        name=model_name or display_name(identity),
        identity=identity,
        task=task_obj.name,
        task_items=task_fingerprint(task_obj),
        evaluation=config.identity(),
        n_layers=n_layers,
        n_heads=n_heads,
    )
    cal_task = task_obj if calibration_task is None else _task(calibration_task, config)
    cal_config = config if calibration_limit is None else config.replace(limit=calibration_limit)
    # Refuse bad settings before run.json exists: a rejected command must not claim the run directory.
    evaluation.check_request(task_obj, config)
    evaluation.check_request(cal_task, cal_config)
    wanted = {
        "run": run_digest(run),
        "task": cal_task.name,
        "task_items": task_fingerprint(cal_task),
        "evaluation": cal_config.identity(),
    }
    rd.check_run(run)
    _check_calibration(rd, wanted)  # before run.json: a refused run must not claim the directory
    rd.check_writable()
    rd.write_run(run)
    store = rd.cell_store()
    with store.claim("calibration", wait=True):  # a concurrent run waits for the calibration instead of repeating it
        if _check_calibration(rd, wanted):
            with contextlib.suppress(Exception):  # a torn or foreign file: record again
                return HeadScores.load(rd.scores_path)
        t0 = time.perf_counter()
        result = evaluation.evaluate(model, tokenizer, cal_task, cal_config, record=True, progress=True)
        scores = result.scores
        if scores is None:
            raise RuntimeError("evaluate(record=True) returned no scores")
        meta = {
            **wanted,
            "shots": cal_config.shots,
            "limit": cal_config.limit,
            "seed": cal_config.seed,
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
    A cell's key is the run record (model, task items, every evaluation option that changes the answer, package
    version), the score's definition fingerprint and the threshold. Cells another process is computing are
    left to it (per-cell claims) and waited for at the end. ``on_cell(key, cell)`` is called after each new cell
    is stored. Returns all cells of the grid (baseline first).
    """
    config = EvalConfig.from_options(config, **options)
    names = list(SCORE_FUNCTIONS) if scores == "all" else [scores] if isinstance(scores, str) else list(scores)
    if not names:
        raise ValueError("no score functions given; pass score names or 'all'")
    unknown = [n for n in names if n not in SCORE_FUNCTIONS]
    if unknown:
        raise ValueError(f"scores {unknown} are not registered; registered: {', '.join(SCORE_FUNCTIONS)}")
    ps = check_targets(targets)  # before calibrate writes anything
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
    rd = RunDir(run_dir)
    run = rd.read_run()
    if any(n not in cal for n in names):  # registered after calibrating: derive from the recorded raw statistics
        try:
            cal = cal.derive(names)
        except KeyError as e:
            raise ValueError(f"{e.args[0]}; calibrate again in a new run directory") from None
        cal.save(rd.scores_path)
    thresholds = thresholds_for(cal, ps, names)
    digest = run_digest(run)
    grid: list[tuple[str | None, float | None, float | None]] = [(None, None, None)]
    grid += [(n, p, thresholds[n][i]) for i, p in enumerate(ps) for n in names]  # target-major: early full picture

    store = rd.cell_store()
    keys = [
        cell_key(
            run=digest, score=s, score_definition=None if s is None else SCORE_FUNCTIONS[s].fingerprint, threshold=t
        )
        for s, _, t in grid
    ]
    n_layers, n_heads = run["n_layers"], run["n_heads"]
    done = sum(store.has(k) for k in set(keys))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(set(keys)), initial=done, desc=f"sweep {run['model']['name']}", unit="cell")

    def compute(score: str | None, target: float | None, threshold: float | None, key: str) -> None:
        policy = None if score is None else Policy(score=score, threshold=threshold, seed=config.seed)
        result = evaluation.evaluate(model, tokenizer, task_obj, config, policy=policy, progress=progress)
        cell = Cell.from_result(
            result, score=score, target=target, threshold=threshold, n_layers=n_layers, n_heads=n_heads, run=digest
        ).to_json()
        store.put(key, cell)
        if on_cell is not None:
            on_cell(key, cell)

    seen: set[str] = set()
    held_elsewhere = []
    try:
        for (score, target, threshold), key in zip(grid, keys, strict=True):
            if key in seen:  # two targets tied to one threshold: one cell answers both
                continue
            seen.add(key)
            if store.has(key):
                continue
            with store.claim(key) as mine:
                if not mine:  # another process computes it; come back at the end
                    held_elsewhere.append((score, target, threshold, key))
                    continue
                if not store.has(key):
                    compute(score, target, threshold, key)
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(f"{score or 'baseline'} p={target}")
        for score, target, threshold, key in held_elsewhere:
            with store.claim(key, wait=True):
                if not store.has(key):  # its holder died before finishing
                    compute(score, target, threshold, key)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return [store.get(k) for k in dict.fromkeys(keys)]
