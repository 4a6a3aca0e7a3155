"""The study file: a TOML description of a grid of models x tasks x scores x targets, parsed and validated.

Every key is checked (type, range, registered names); an error names the file and the bad key, e.g.
``study.toml: models[2].dtype: expected one of float32, bfloat16, float16, got 'fp32'``. Relative paths are taken
relative to the study file, ``~`` and ``$VARS`` are expanded. See the README for the format.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import canonical_json
from ..errors import InactiveHeadsError
from ..runs.adaptive import SearchDesign
from ..runs.directory import slug
from ..scores import SCORE_FUNCTIONS
from ..stats.thresholds import check_targets
from .executors import Resources

__all__ = ["DESIGNS", "DTYPES", "Study", "StudyFileError", "StudyModel", "StudyTask", "load_study", "parse_study"]

#: The dtypes a model may be loaded in.
DTYPES = ("float32", "bfloat16", "float16")
#: How a task's runs are evaluated: every (score, target) cell, a search for each score's crossing, or the search's
#: estimator over the fixed targets (each probe stopped once decided).
DESIGNS = ("grid", "adaptive", "sequential-grid")
_REQUIRED = object()


class StudyFileError(InactiveHeadsError):
    """A study file that cannot be read or has a bad key; the message names the file and the key."""


@dataclass(frozen=True)
class StudyModel:
    """A model of the study: ``spec`` is a hub id, a model directory or a ``.gguf`` file; with ``package``, it is a
    file inside that installed Python package (models carried by PyPI packages)."""

    name: str
    spec: str
    package: str | None = None
    dtype: str = "float32"
    device_map: str | None = None
    chat_template: bool = False
    resources: Resources = field(default_factory=Resources)


@dataclass(frozen=True)
class StudyTask:
    """A task of the study and how it is evaluated and calibrated (None: the task's default). ``models``: the
    study's models that run it (None: every one); it selects runs and is no part of them."""

    name: str
    shots: int | None = None
    limit: int | None = None
    source: str = "files"
    calibration_task: str | None = None
    calibration_limit: int | None = None
    calibration_items: str = "same"
    scores: tuple[str, ...] | None = None
    targets: tuple[float, ...] | None = None
    models: tuple[str, ...] | None = None
    design: str = "grid"
    search: SearchDesign | None = None  # the design's tolerance and budgets; None for the grid


@dataclass(frozen=True)
class Study:
    """A parsed, validated study file."""

    name: str
    models: tuple[StudyModel, ...]
    tasks: tuple[StudyTask, ...]
    scores: tuple[str, ...]
    targets: tuple[float, ...]
    seed: int = 0
    batch_size: int = 8
    data_dir: str | None = None
    plugins: tuple[str, ...] = ()
    pairs: tuple[tuple[str, str], ...] = ()
    series: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Keep each run's calibration scores of the study's functions in float16 (calibration/scores.float16.safetensors.xz)
    compact_scores: bool = False

    @property
    def max_cells(self) -> int:
        """Cells of the grid: per (model, task) the baseline and every (score, target). Targets that calibrate to
        the same threshold share a cell, so a study may store fewer."""
        return sum(self.grid_cells(t) for _, t in self.runs())

    def grid_cells(self, task: StudyTask) -> int:
        """Cells of one run of ``task``'s grid: the baseline and every (score, target); tied targets share a cell,
        so a calibrated run may plan fewer. A searched task has the baseline only."""
        if task.search is not None:
            return 1
        return 1 + len(self.scores_of(task)) * len(self.targets_of(task))

    def searches(self, task: StudyTask) -> int:
        """Searches of one run of ``task``: one per score function when its design searches, else none."""
        return 0 if task.search is None else len(self.scores_of(task))

    def runs(self) -> list[tuple[StudyModel, StudyTask]]:
        """Every (model, task) of the grid, model by model in the file's order."""
        return [(m, t) for m in self.models for t in self.tasks if t.models is None or m.name in t.models]

    def scores_of(self, task: StudyTask) -> tuple[str, ...]:
        """The score functions of ``task``'s grid: its own list, else the study's."""
        return self.scores if task.scores is None else task.scores

    def scores_in_run(self, model: StudyModel, task: StudyTask) -> tuple[str, ...]:
        """The score functions of every task sharing (model, task)'s run directory, in the file's order."""
        name = self.run_name(model, task)
        found = [s for m, t in self.runs() if m is model and self.run_name(m, t) == name for s in self.scores_of(t)]
        return tuple(dict.fromkeys(found))

    def targets_of(self, task: StudyTask) -> tuple[float, ...]:
        """The target fractions of ``task``'s grid: its own list, else the study's."""
        return self.targets if task.targets is None else task.targets

    def normalized(self) -> dict[str, Any]:
        """The study as plain JSON types, every default filled in: what a study directory records."""
        plain: dict[str, Any] = _plain(dataclasses.asdict(self))
        return plain

    def run_name(self, model: StudyModel, task: StudyTask) -> str:
        """The run directory name of (model, task): readable, plus a digest of every setting that changes the run
        (cells are keyed by their own content; this keeps runs that may not share a directory apart)."""
        # A grid task leaves out the design keys, so runs named before searches existed keep their names. A searched
        # task leaves out its design, targets and score functions too: searches are keyed by their own design and
        # score, so the designs searching one (model, task, calibration) share its calibration, baseline and blocks.
        unnamed: tuple[str, ...] = ("models", "design", "search")
        if task.search is not None:
            unnamed += ("scores", "targets")
        settings = {
            "model": {k: v for k, v in dataclasses.asdict(model).items() if k not in ("device_map", "resources")},
            "task": {k: v for k, v in dataclasses.asdict(task).items() if k not in unnamed},
            "seed": self.seed,
        }
        digest = hashlib.sha256(canonical_json(settings).encode()).hexdigest()[:10]
        return f"{slug(model.name)}--{slug(task.name)}-{digest}"

    def with_limit(self, limit: int) -> Study:
        """The same study on at most ``limit`` items per task and calibration (a quick reduced run)."""
        if limit < 1:
            raise InactiveHeadsError(f"limit must be >= 1, got {limit}")

        def cap(value: int | None) -> int:
            return limit if value is None else min(value, limit)

        tasks = tuple(
            dataclasses.replace(
                t,
                limit=cap(t.limit),
                calibration_limit=None if t.calibration_limit is None else cap(t.calibration_limit),
            )
            for t in self.tasks
        )
        return dataclasses.replace(self, tasks=tasks)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def load_study(path: str | Path) -> Study:
    """Read and validate a study file. Its plugins are imported first, so scores and tasks they register validate."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StudyFileError(f"study file {path} does not exist") from None
    except UnicodeDecodeError as e:
        raise StudyFileError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise StudyFileError(f"{path}: not valid TOML: {e}") from None
    return parse_study(data, base=path.parent, where=str(path), default_name=path.stem)


class _Table:
    """One TOML table being read: typed getters, and an error for every key nobody asked for."""

    def __init__(self, data: Any, where: str, errors: Callable[[str], StudyFileError]):
        self._error = errors
        if not isinstance(data, dict):
            raise self._error(f"{where}: expected a table, got {_kind(data)}")
        self.data, self.where, self.seen = data, where, set[str]()

    def fail(self, key: str, message: str) -> StudyFileError:
        return self._error(f"{self.where}{key}: {message}")

    def get(self, key: str, kinds: type | tuple[type, ...], default: Any = _REQUIRED) -> Any:
        self.seen.add(key)
        if key not in self.data:
            if default is _REQUIRED:
                raise self.fail(key, "missing (required)")
            return default
        value = self.data[key]
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        # TOML booleans are Python ints; a count or a number must not silently accept true/false.
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            names = " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)
            raise self.fail(key, f"expected {names}, got {_kind(value)} {value!r}")
        return value

    def count(self, key: str, minimum: int, default: Any = _REQUIRED) -> Any:
        value = self.get(key, int, default)
        if key in self.data and value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value}")
        return value

    def number(self, key: str, default: Any = _REQUIRED) -> Any:
        value = self.get(key, (int, float), default)
        if key not in self.data:
            return value
        if not math.isfinite(value) or value < 0:
            raise self.fail(key, f"must be a finite number >= 0, got {value!r}")
        return float(value)

    def choice(self, key: str, options: Sequence[str], default: Any = _REQUIRED) -> Any:
        value = self.get(key, str, default)
        if key in self.data and value not in options:
            raise self.fail(key, f"expected one of {', '.join(options)}, got {value!r}")
        return value

    def strings(self, key: str, default: Any = _REQUIRED) -> Any:
        value = self.get(key, list, default)
        if key not in self.data:
            return value
        for i, v in enumerate(value):
            if not isinstance(v, str) or not v:
                raise self.fail(key, f"item {i} must be a non-empty string, got {_kind(v)} {v!r}")
        return tuple(value)

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.seen)
        if unknown:
            raise self.fail(unknown[0], f"unknown key; expected one of {', '.join(sorted(self.seen))}")


_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "an array"}


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "a table", list: "an array", str: "a string", int: "an integer", float: "a number"}.get(
        type(value), type(value).__name__
    )


def _path(text: str, base: Path, fail: Callable[[str], StudyFileError]) -> str:
    expanded = os.path.expanduser(os.path.expandvars(text))
    unset = re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", expanded)
    if unset:
        raise fail(f"environment variable ${unset[0]} is not set")
    return str(base / expanded) if not os.path.isabs(expanded) else expanded


def _model_spec(table: _Table, base: Path) -> tuple[str, str | None]:
    spec = table.get("spec", str)
    package = table.get("package", str, None)
    if package is not None:
        return spec, package
    expanded = os.path.expanduser(os.path.expandvars(spec))
    if expanded.startswith((".", "/")) or expanded.endswith(".gguf") or (base / expanded).exists():
        return _path(spec, base, lambda m: table.fail("spec", m)), None
    if "$" in expanded:
        raise table.fail("spec", f"environment variable in {spec!r} is not set")
    return spec, None  # a hub id


def _resources(data: Any, where: str, errors: Callable[[str], StudyFileError], parent: Resources) -> Resources:
    t = _Table(data, where, errors)
    out = Resources(
        workers=t.count("workers", 1, parent.workers),
        cpus=t.number("cpus", parent.cpus),
        gpus=t.number("gpus", parent.gpus),
        memory_gb=t.number("memory_gb", parent.memory_gb),
    )
    t.done()
    return out


def parse_study(
    data: dict[str, Any], *, base: str | Path = ".", where: str = "study", default_name: str = "study"
) -> Study:
    """Validate the parsed TOML ``data`` of a study file (paths relative to ``base``; ``where`` names the file)."""
    from ..plugins import load_plugins
    from ..tasks import TASKS

    base = Path(base).absolute()

    def error(message: str) -> StudyFileError:
        return StudyFileError(f"{where}: {message}")

    top = _Table(data, "", error)
    plugins = tuple(
        _path(p, base, lambda m: top.fail("plugins", m)) if p.endswith(".py") else p for p in top.strings("plugins", ())
    )
    try:
        load_plugins(plugins)
    except ValueError as e:
        raise top.fail("plugins", str(e)) from None
    name = top.get("name", str, default_name)
    seed = top.get("seed", int, 0)
    batch_size = top.count("batch_size", 1, 8)
    compact_scores = top.get("compact_scores", bool, False)
    data_dir = top.get("data_dir", str, None)
    if data_dir is not None:
        data_dir = _path(data_dir, base, lambda m: top.fail("data_dir", m))

    scores = _scores(top, "all")
    design = top.choice("design", DESIGNS, "grid")
    search = _search(top, "search", SearchDesign(), error)
    targets = _targets(top, _REQUIRED if design == "grid" else None)  # a searched study needs none

    defaults = _resources(top.get("resources", dict, {}), "resources.", error, Resources())

    models: list[StudyModel] = []
    for i, raw in enumerate(top.get("models", list)):
        t = _Table(raw, f"models[{i}].", error)
        spec, package = _model_spec(t, base)
        model = StudyModel(
            name=t.get("name", str, None) or _default_model_name(spec),
            spec=spec,
            package=package,
            dtype=t.choice("dtype", DTYPES, "float32"),
            device_map=t.get("device_map", str, None),
            chat_template=t.get("chat_template", bool, False),
            resources=_resources(t.get("resources", dict, {}), f"models[{i}].resources.", error, defaults),
        )
        t.done()
        if any(m.name == model.name for m in models):
            raise t.fail("name", f"{model.name!r} names two models; give each a distinct name")
        models.append(model)
    if not models:
        raise top.fail("models", "expected at least one [[models]] table")

    tasks: list[StudyTask] = []
    for i, raw in enumerate(top.get("tasks", list)):
        t = _Table(raw, f"tasks[{i}].", error)
        task_design = t.choice("design", DESIGNS, design)
        task_search = _search(t, "search", search, error)
        task = StudyTask(
            name=t.get("name", str),
            shots=t.count("shots", 0, None),
            limit=t.count("limit", 1, None),
            source=t.get("source", str, "files"),
            calibration_task=t.get("calibration_task", str, None),
            calibration_limit=t.count("calibration_limit", 1, None),
            calibration_items=t.choice("calibration_items", ("same", "heldout"), "same"),
            scores=_scores(t, None),
            targets=_targets(t, None),
            models=t.strings("models", None),
            design=task_design,
        )
        task = dataclasses.replace(task, search=_design_of(t, task, targets, task_search))
        if task.calibration_items == "heldout" and task.calibration_task is not None:
            raise t.fail("calibration_items", "a held-out calibration uses the task's own items; drop calibration_task")
        for key in ("name", "calibration_task"):
            value = getattr(task, key)
            if value is not None and value not in TASKS:
                plain = sorted(n for n in TASKS if not n.startswith("mmlu_"))
                raise t.fail(key, f"{value!r} is not a registered task; available: {', '.join(plain)}, mmlu_<subject>")
            if value is not None and task.source not in TASKS[value].sources:
                raise t.fail("source", f"task {value!r} reads {', '.join(TASKS[value].sources)}, not {task.source!r}")
        t.done()
        if task in tasks:
            raise t.fail("name", f"task {task.name!r} is listed twice with the same settings")
        tasks.append(task)
    if not tasks:
        raise top.fail("tasks", "expected at least one [[tasks]] table")

    names = [m.name for m in models]

    def known(key: str, model: str) -> str:
        if model not in names:
            raise top.fail(key, f"{model!r} is not a model of this study; models: {', '.join(names)}")
        return model

    for i, task in enumerate(tasks):
        for listed in task.models or ():
            known(f"tasks[{i}].models", listed)
        if task.models is not None and not task.models:
            raise top.fail(f"tasks[{i}].models", "empty; list the models that run this task, or drop the key")
        for j, other in enumerate(tasks[:i]):
            shared = set(names if task.models is None else task.models) & set(
                names if other.models is None else other.models
            )
            if shared and dataclasses.replace(task, models=None) == dataclasses.replace(other, models=None):
                raise top.fail(f"tasks[{i}]", f"repeats tasks[{j}] for {', '.join(sorted(shared))}")

    pairs = []
    for i, pair in enumerate(top.get("pairs", list, [])):
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(m, str) for m in pair):
            raise top.fail("pairs", f'item {i} must be a pair of model names ["base", "other"], got {pair!r}')
        pairs.append((known("pairs", pair[0]), known("pairs", pair[1])))
    series = []
    s_table = _Table(top.get("series", dict, {}), "series.", error)
    for key in list(s_table.data):
        members = s_table.strings(key)
        if len(members) < 2:
            raise s_table.fail(key, "a series needs at least two models")
        series.append((key, tuple(known(f"series.{key}", m) for m in members)))
    s_table.done()
    top.done()
    return Study(
        name=name,
        models=tuple(models),
        tasks=tuple(tasks),
        scores=scores,
        targets=targets or (),
        seed=seed,
        batch_size=batch_size,
        data_dir=data_dir,
        plugins=plugins,
        pairs=tuple(pairs),
        series=tuple(series),
        compact_scores=compact_scores,
    )


def _scores(t: _Table, default: Any) -> Any:
    raw = t.get("scores", (str, list), default)
    if raw is None:
        return None
    if raw == "all":
        return tuple(SCORE_FUNCTIONS)
    scores = t.strings("scores") if isinstance(raw, list) else (raw,)
    unknown = [s for s in scores if s not in SCORE_FUNCTIONS]
    if unknown or not scores:
        what = f"{unknown[0]!r} is not a registered score" if unknown else "empty"
        raise t.fail("scores", f'{what}; registered: {", ".join(SCORE_FUNCTIONS)} (or "all")')
    if len(set(scores)) != len(scores):
        raise t.fail("scores", "lists a score twice")
    return scores


def _targets(t: _Table, default: Any) -> Any:
    targets = t.get("targets", list, default)
    if targets is None:
        return None
    if not targets or any(isinstance(p, bool) or not isinstance(p, (int, float)) for p in targets):
        raise t.fail("targets", f"expected a non-empty array of fractions of heads, got {targets!r}")
    try:
        return tuple(check_targets(targets))
    except ValueError as e:
        raise t.fail("targets", str(e)) from None


def _search(t: _Table, key: str, parent: SearchDesign, error: Callable[[str], StudyFileError]) -> SearchDesign:
    """``parent`` with the keys of ``t``'s table ``key`` applied, each checked as :class:`SearchDesign` checks it."""
    table = _Table(t.get(key, dict, {}), f"{t.where}{key}.", error)
    design = parent
    for name in ("tolerance", "max_fraction", "resolution", "alpha"):
        value = table.get(name, (int, float), None)
        if value is not None:
            design = _apply(table, design, name, float(value))
    for name in ("max_probes", "block_size", "max_items"):
        value = table.get(name, int, None)
        if value is not None:
            design = _apply(table, design, name, value)
    table.done()
    return design


def _apply(table: _Table, design: SearchDesign, name: str, value: Any) -> SearchDesign:
    try:
        return dataclasses.replace(design, **{name: value})
    except InactiveHeadsError as e:
        raise table.fail(name, str(e)) from None


def _design_of(
    t: _Table, task: StudyTask, targets: tuple[float, ...] | None, search: SearchDesign
) -> SearchDesign | None:
    """The search of ``task`` (None for the grid); the sequential grid probes the task's targets above 0."""
    if task.design == "grid":
        if "search" in t.data:
            raise t.fail("search", 'applies to design = "adaptive" or "sequential-grid"; set design or drop it')
        if task.targets is None and targets is None:
            raise t.fail("targets", "missing: the grid design needs targets, here or at the top of the file")
        return None
    if task.design == "adaptive":
        return search
    grid = tuple(p for p in task.targets or targets or () if p > 0)
    if not grid:
        raise t.fail("targets", "the sequential grid needs targets above 0, here or at the top of the file")
    return _apply(t, search, "targets", grid)


def _default_model_name(spec: str) -> str:
    tail = spec.rstrip("/").split("/")[-1]
    return tail[: -len(".gguf")] if tail.endswith(".gguf") else tail
