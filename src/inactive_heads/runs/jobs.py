"""The jobs that fill a run directory: calibrate thresholds, plan and compute (score, target) cells, and sweep them.

Layout: see :mod:`inactive_heads.runs.directory`. Every finished cell is one atomic ``cells/<key>.json``, keyed by
:func:`inactive_heads.runs.store.cell_key` of everything that changes its answer, so a killed sweep resumes where it
stopped and never recomputes (or trusts a torn copy of) a finished cell.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from transformers import PreTrainedModel

from .. import _compat, evaluation
from ..engine import Policy
from ..errors import InactiveHeadsError, UnknownNameError
from ..evaluation import EvalConfig
from ..scores import SCORE_FUNCTIONS, HeadScores
from ..stats.thresholds import DEFAULT_TARGETS, check_targets, thresholds_for
from ..tasks import Task, get_task, heldout
from .directory import Cell, RunDir, display_name, model_identity, run_digest, run_record, task_fingerprint
from .store import cell_key

__all__ = [
    "CalibrationItems",
    "PlannedCell",
    "ScoresNotStored",
    "calibrate",
    "compute_cell",
    "plan_cells",
    "result_key",
    "score_names",
    "sweep",
]


class ScoresNotStored(FileNotFoundError):
    """A threshold is needed that the run's thresholds record lacks, and the calibration scores it would come from
    are not stored (a run kept without them): record them again into the run directory (``calibrate``)."""


#: Which items a calibration records: the evaluated ones (the paper's protocol) or others of the same task.
CalibrationItems = Literal["same", "heldout"]


def load_task(task: str | Task, config: EvalConfig) -> Task:
    # Load once, so each cell does not re-read the files; evaluate() accepts the loaded Task.
    if isinstance(task, Task):
        return task
    return get_task(task, config.data_dir, config.source)


# What makes two calibrations of a run directory the same: the fields of calibration/meta.json compared on reuse.
_CALIBRATION_IDENTITY = ("run", "task", "task_items", "evaluation")


def _check_calibration(rd: RunDir, wanted: dict[str, Any]) -> bool:
    """Whether ``rd`` holds a finished calibration for ``wanted``; ValueError when it holds another one."""
    old = rd.read_meta() if rd.scores_path.is_file() else None
    if old is None:
        return False
    if any(old.get(k) != v for k, v in wanted.items()):
        raise InactiveHeadsError(
            f"{rd.root} holds a calibration made for another run or other calibration items/options; "
            "use a new run directory"
        )
    return True


def _run_record(model: PreTrainedModel, task: Task, config: EvalConfig, model_name: str | None) -> dict[str, Any]:
    """The run record of ``model`` evaluated on ``task`` with ``config`` (shots resolved)."""
    n_layers, n_heads = _compat.model_shape(model)
    identity = model_identity(model)
    return run_record(
        name=model_name or display_name(identity),
        identity=identity,
        task=task.name,
        task_items=task_fingerprint(task),
        evaluation=config.identity(),
        n_layers=n_layers,
        n_heads=n_heads,
    )


def calibrate(
    model: PreTrainedModel,
    tokenizer: Any,
    task: str | Task,
    run_dir: str | Path,
    config: EvalConfig | None = None,
    *,
    calibration_task: str | Task | None = None,
    calibration_limit: int | None = None,
    calibration_items: CalibrationItems = "same",
    model_name: str | None = None,
    progress: bool | Callable[[int], Any] = True,
    **options: Any,
) -> HeadScores:
    """Write ``run.json`` and record every score on the calibration items into ``calibration/``.

    Calibration runs ``evaluation.evaluate(..., record=True)`` on ``calibration_task`` (default: ``task``) with
    ``calibration_limit`` items (default: ``config.limit``). ``calibration_items="heldout"`` calibrates on items of
    the evaluated task that are not evaluated (:func:`~inactive_heads.tasks.heldout`) instead of the evaluated ones
    (``"same"``, the paper's protocol). An existing calibration is reused only when it was made
    for this run (same run record) with the same calibration items and options; otherwise it is refused.
    ``config``: the evaluation options (:class:`~inactive_heads.evaluation.EvalConfig`); ``options``: any of its
    fields by name, applied on top. ``progress``: ``evaluate``'s bar over the calibration's sequences.
    """
    config = EvalConfig.from_options(config, **options)
    rd = RunDir(run_dir)
    task_obj = load_task(task, config)
    config = config.replace(shots=config.shots_for(task_obj))
    run = _run_record(model, task_obj, config, model_name)
    cal_task = task_obj if calibration_task is None else load_task(calibration_task, config)
    if calibration_items == "heldout":
        if calibration_task is not None:
            raise InactiveHeadsError("a held-out calibration takes items of the evaluated task; drop calibration_task")
        cal_task = heldout(task_obj, config.limit, config.seed)
    elif calibration_items != "same":
        raise InactiveHeadsError(f"calibration_items must be 'same' or 'heldout', got {calibration_items!r}")
    cal_config = config if calibration_limit is None else config.replace(limit=calibration_limit)
    # Refuse bad settings before run.json exists: a rejected command must not claim the run directory.
    evaluation.check_request(task_obj, config)
    evaluation.check_request(cal_task, cal_config)
    identity = (run_digest(run), cal_task.name, task_fingerprint(cal_task), cal_config.identity())
    wanted = dict(zip(_CALIBRATION_IDENTITY, identity, strict=True))
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
        # A generative calibration needs its prompts' scores, not their answers: decoding would double its cost.
        result = evaluation.evaluate(
            model, tokenizer, cal_task, cal_config, record=True, progress=progress,
            scores_only=cal_task.generation is not None,
        )  # fmt: skip
        scores = result.scores
        if scores is None:
            raise RuntimeError("evaluate(record=True) returned no scores")
        meta = {
            **wanted,
            "shots": cal_config.shots,
            "limit": cal_config.limit,
            "seed": cal_config.seed,
            "items": calibration_items,
            "rows": scores.shape[0],
            "n_items": result.n_items,
            "row_items": [item for item, _ in result.rows],  # rows grouped by input, for bootstraps over items
            "accuracy": result.metrics.get("acc"),  # None for a generative calibration (nothing decoded)
            "seconds": time.perf_counter() - t0,
        }
        scores.meta.update(meta)
        scores.save(rd.scores_path)
        kept = rd.read_meta()  # scores recorded again for a kept calibration: its record stays as committed
        if kept is None or any(kept.get(k) != v for k, v in wanted.items()):
            rd.write_meta(meta)  # written last: its presence marks a complete calibration
    return scores


@dataclass(frozen=True)
class PlannedCell:
    """One cell of a run's grid: its store key and what it evaluates (``score`` None: the baseline)."""

    key: str
    score: str | None
    target: float | None
    threshold: float | None


def score_names(scores: str | Sequence[str]) -> list[str]:
    """The registered score names ``scores`` stands for ("all", one name, or names); UnknownNameError otherwise."""
    names = list(SCORE_FUNCTIONS) if scores == "all" else [scores] if isinstance(scores, str) else list(scores)
    if not names:
        raise InactiveHeadsError("no score functions given; pass score names or 'all'")
    unknown = [n for n in names if n not in SCORE_FUNCTIONS]
    if unknown:
        raise UnknownNameError(
            f"score(s) {', '.join(unknown)} not registered; registered: {', '.join(SCORE_FUNCTIONS)}"
        )
    return names


def result_key(run: str, score: str | None, **identity: Any) -> str:
    """The store key of a result of run ``run`` (its :func:`~inactive_heads.runs.directory.run_digest`) under
    ``score`` (None: the baseline): the run, the score's definition fingerprint and ``identity`` (a cell's
    threshold; a search block's threshold, index and items; a search's design). Cells, search blocks and searches
    are all keyed here, so what identifies a result cannot drift between them."""
    definition = None if score is None else SCORE_FUNCTIONS[score].fingerprint
    return cell_key(run=run, score=score, score_definition=definition, **identity)


def planned_thresholds(rd: RunDir, names: list[str], ps: list[float]) -> dict[str, list[float]]:
    """Each score's thresholds at ``ps``: read from the run's thresholds record, and computed from the calibration
    scores (then added to the record) where the record lacks them."""
    meta = rd.read_meta()
    if meta is None:
        raise FileNotFoundError(f"{rd.root} holds no finished calibration; calibrate it first")
    identity = {k: meta.get(k) for k in _CALIBRATION_IDENTITY}
    record = rd.read_thresholds()
    if record.get("calibration") != identity:  # none yet, or left over from another calibration
        record = {"calibration": identity, "scores": {}}

    def entry(name: str) -> dict[str, Any]:  # the score's entry, emptied when its definition has changed
        fingerprint = SCORE_FUNCTIONS[name].fingerprint
        found: dict[str, Any] | None = record["scores"].get(name)
        if found is None or found.get("definition") != fingerprint:
            found = record["scores"][name] = {"definition": fingerprint, "targets": {}}
        return found

    def recorded(name: str) -> list[float] | None:
        found = [entry(name)["targets"].get(repr(p)) for p in ps]
        return None if any(t is None for t in found) else found

    missing = [n for n in names if recorded(n) is None]
    if missing:
        cal = rd.read_scores()
        if cal is None:
            raise ScoresNotStored(
                f"{rd.root}: the calibration scores are not stored and the thresholds of {missing} at {ps} are not "
                "recorded; calibrate again into this directory (the study command does this itself)"
            )
        if any(n not in cal for n in missing):  # registered after calibrating: derive from the recorded raw statistics
            try:
                cal = cal.derive(missing)
            except KeyError as e:
                raise InactiveHeadsError(f"{e.args[0]}; calibrate again in a new run directory") from None
            cal.save(rd.scores_path)
        for n, values in thresholds_for(cal, ps, missing).items():
            entry(n)["targets"].update({repr(p): t for p, t in zip(ps, values, strict=True)})
        rd.write_thresholds(record)
    return {n: recorded(n) for n in names}  # type: ignore[misc]  # every one is recorded now


def plan_cells(
    run_dir: str | Path, *, scores: str | Sequence[str] = "all", targets: Iterable[float] = DEFAULT_TARGETS
) -> list[PlannedCell]:
    """The distinct cells of a calibrated run's grid: the baseline, then every (score, target), target-major.

    Each target ``p`` becomes a threshold from the pooled calibration CDF (:func:`thresholds_from_cdf`); two targets
    tied to one threshold share one cell (listed under the first). A cell's key is the run's identity
    (:func:`~inactive_heads.runs.directory.run_digest`), the score's definition fingerprint and the threshold. Needs no
    model: everything comes from the run directory. Thresholds are recorded in the calibration's thresholds record
    and read back from it, so the calibration scores are needed only for thresholds not recorded yet. Scores
    registered after calibrating are derived from the recorded raw statistics and saved with the calibration.
    """
    names = score_names(scores)
    ps = check_targets(targets)
    rd = RunDir(run_dir)
    thresholds = planned_thresholds(rd, names, ps)
    digest = run_digest(rd.read_run())
    grid: list[tuple[str | None, float | None, float | None]] = [(None, None, None)]
    grid += [(n, p, thresholds[n][i]) for i, p in enumerate(ps) for n in names]  # target-major: early full picture
    cells: dict[str, PlannedCell] = {}
    for score, target, threshold in grid:
        key = result_key(digest, score, threshold=threshold)
        cells.setdefault(key, PlannedCell(key, score, target, threshold))
    return list(cells.values())


def open_run(
    model: PreTrainedModel, task: str | Task, rd: RunDir, config: EvalConfig
) -> tuple[Task, EvalConfig, dict[str, Any]]:
    """The loaded task, ``config`` with its shots resolved and the run record of ``rd``, once ``model``, ``task``
    and ``config`` are checked to be the run's (InactiveHeadsError naming what differs)."""
    task_obj = load_task(task, config)
    config = config.replace(shots=config.shots_for(task_obj))
    run = rd.read_run()
    rd.check_run(_run_record(model, task_obj, config, run["model"]["name"]))
    return task_obj, config, run


def compute_cell(
    model: PreTrainedModel,
    tokenizer: Any,
    task: str | Task,
    run_dir: str | Path,
    cell: PlannedCell,
    config: EvalConfig | None = None,
    *,
    progress: bool | Callable[[int], Any] = False,
    wait: bool = True,
    **options: Any,
) -> bool | None:
    """Evaluate one planned cell of a calibrated run and store it atomically.

    Returns True when it was evaluated now, False when it was already stored, and None when another process holds
    its claim (only with ``wait=False``; with ``wait=True`` this waits for that process and returns False, or
    evaluates the cell if the holder died before finishing it). So no two processes evaluate one cell.
    ``model``, ``task`` and ``config`` must be the run's (the same run record; ValueError naming what differs).
    ``progress``: ``evaluate``'s bar over sequences.
    """
    config = EvalConfig.from_options(config, **options)
    rd = RunDir(run_dir)
    store = rd.cell_store()
    if store.has(cell.key):
        return False
    task_obj, config, run = open_run(model, task, rd, config)
    with store.claim(cell.key, wait=wait) as mine:
        if not mine:
            return None
        if store.has(cell.key):  # finished by the process that held the claim
            return False
        policy = None if cell.score is None else Policy(score=cell.score, threshold=cell.threshold, seed=config.seed)
        partial = rd.partial_path(cell.key)
        result = evaluation.evaluate(
            model, tokenizer, task_obj, config, policy=policy, progress=progress, checkpoint=partial
        )
        stored = Cell.from_result(
            result,
            score=cell.score,
            target=cell.target,
            threshold=cell.threshold,
            n_layers=run["n_layers"],
            n_heads=run["n_heads"],
            run=run_digest(run),
        )
        store.put(cell.key, stored.to_json())
        shutil.rmtree(partial, ignore_errors=True)
    return True


def calibrated_run(
    model: PreTrainedModel,
    tokenizer: Any,
    task: str | Task,
    run_dir: str | Path,
    config: EvalConfig,
    calibration_task: str | Task | None,
    calibration_limit: int | None,
    calibration_items: CalibrationItems,
    model_name: str | None,
    progress: bool | Callable[[int], Any],
) -> tuple[Task, EvalConfig]:
    """The loaded task and ``config`` with its shots resolved, once :func:`calibrate` has calibrated ``run_dir``
    (or found its calibration): what a sweep and a search both start from."""
    task_obj = load_task(task, config)
    config = config.replace(shots=config.shots_for(task_obj))
    calibrate(
        model,
        tokenizer,
        task_obj,
        run_dir,
        config,
        calibration_task=calibration_task,
        calibration_limit=calibration_limit,
        calibration_items=calibration_items,
        model_name=model_name,
        progress=progress,
    )
    return task_obj, config


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
    calibration_items: CalibrationItems = "same",
    model_name: str | None = None,
    progress: bool = True,
    on_cell: Callable[[str, dict[str, Any]], None] | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Calibrate (unless done), then evaluate the baseline and every (score, target) cell not already stored.

    :func:`calibrate`, then :func:`compute_cell` for every cell of :func:`plan_cells`. ``config``: the evaluation
    options (:class:`~inactive_heads.evaluation.EvalConfig`); ``options``: any of its fields by name, applied on
    top. Each target ``p`` becomes a threshold from the pooled calibration CDF (:func:`thresholds_from_cdf`),
    evaluated with ``Policy(score=name, threshold=t, seed=config.seed)``. Cells another process is computing are
    left to it (per-cell claims) and waited for at the end. ``on_cell(key, cell)`` is called after each new cell
    is stored. ``progress``: a bar over cells, and beneath it one over the sequences of each evaluation.
    Returns all cells of the grid (baseline first).
    """
    config = EvalConfig.from_options(config, **options)
    names = score_names(scores)
    ps = check_targets(targets)  # before calibrate writes anything
    task_obj, config = calibrated_run(
        model, tokenizer, task, run_dir, config, calibration_task, calibration_limit, calibration_items, model_name,
        progress,
    )  # fmt: skip
    cells = plan_cells(run_dir, scores=names, targets=ps)
    store = RunDir(run_dir).cell_store()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        done = sum(store.has(c.key) for c in cells)
        name = RunDir(run_dir).read_run()["model"]["name"]
        bar = tqdm(total=len(cells), initial=done, desc=f"sweep {name}", unit="cell")

    def run(cell: PlannedCell, wait: bool) -> bool | None:
        label = f"{cell.score or 'baseline'} p={cell.target}"
        computed = compute_cell(
            model, tokenizer, task_obj, run_dir, cell, config, progress=sequence_bar(progress, label), wait=wait
        )
        if computed and on_cell is not None:
            on_cell(cell.key, store.get(cell.key))
        if computed is not None and bar is not None:  # stored now, by this process or another
            bar.update(1)
            bar.set_postfix_str(label)
        return computed

    try:
        held_elsewhere = [c for c in cells if not store.has(c.key) and run(c, wait=False) is None]
        for cell in held_elsewhere:  # another process computes them; wait for it (or take over if it died)
            run(cell, wait=True)
    finally:
        if bar is not None:
            bar.close()
    return [store.get(c.key) for c in cells]


def sequence_bar(progress: bool, desc: str) -> Callable[[int], Any] | bool:
    """A transient bar over one evaluation's sequences, shown beneath the sweep's bar of cells."""
    if not progress:
        return False
    from tqdm.auto import tqdm

    return lambda total: tqdm(total=total, desc=desc, unit="seq", leave=False)
