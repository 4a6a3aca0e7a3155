"""Search a calibrated run for each score function's crossing (:mod:`inactive_heads.stats.crossing`), resumably.

For one score function, :func:`search_score` runs :func:`~inactive_heads.stats.crossing.search_crossing` (or, with
fixed ``targets``, :func:`~inactive_heads.stats.crossing.grid_crossing`) with a callback that zeroes by the
threshold the run's calibration gives each target (the sweep's rule, recorded in ``calibration/thresholds.json``)
and evaluates exactly the block of items asked for, each with the few-shot examples the whole evaluation gives it
(:func:`~inactive_heads.tasks.pinned`). The baseline's per-item answers are the run's baseline cell, evaluated once.

Every evaluated block is stored atomically in ``searches/blocks/<key>.json`` (:class:`Block`) under
:func:`~inactive_heads.runs.jobs.result_key` of the run, the score's definition, the threshold, the block's index
and its item ids; the search is a deterministic function of its answers, so a killed search replays the stored
blocks and evaluates only the missing ones, and a rerun gives the same result. The finished search (every probe,
look and stop decision, the crossing and its interval, its cost) is one record, ``searches/<key>.json``
(:class:`Search`), keyed by the run, the score and the :class:`SearchDesign`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from transformers import PreTrainedModel

from .. import evaluation
from ..engine import Policy
from ..errors import InactiveHeadsError
from ..evaluation import EvalConfig
from ..scores import SCORE_FUNCTIONS
from ..stats.crossing import (
    DEFAULT_ALPHA,
    DEFAULT_MAX_FRACTION,
    DEFAULT_TOLERANCE,
    Answer,
    Comparison,
    Crossing,
    CrossingResult,
    Decision,
    Look,
    Probe,
    ProbeStop,
    compare_crossings,
    grid_crossing,
    search_crossing,
)
from ..tasks import Task, pinned
from .directory import Cell, RunDir, is_number, run_digest
from .jobs import (
    CalibrationItems,
    calibrated_run,
    compute_cell,
    open_run,
    plan_cells,
    planned_thresholds,
    result_key,
    score_names,
    sequence_bar,
)
from .store import ResultStore

__all__ = [
    "Block",
    "ProbeRecord",
    "Search",
    "SearchDesign",
    "compare_searches",
    "load_searches",
    "search",
    "search_key",
    "search_score",
    "stored_probes",
]


def _count(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise InactiveHeadsError(f"{name} must be a whole number >= {minimum}, got {value!r}")


def _fraction(name: str, value: Any, what: str, *, closed: bool = True) -> None:
    ok = is_number(value) and value > 0 and (value <= 1 if closed else value < 1)
    if not ok:
        raise InactiveHeadsError(f"{name} must be {what}, got {value!r}")


@dataclass(frozen=True)
class SearchDesign:
    """How a crossing is searched: its tolerance and budgets, checked when made (InactiveHeadsError naming the fix).

    ``tolerance``: the accuracy loss still counted as no loss (a fraction: 0.01 is one point). ``max_fraction``: the
    largest target fraction of heads searched. ``max_probes``: targets evaluated per score. ``block_size``: items
    per look of a probe's sequential test; ``max_items``: items per probe (None: every item of the run).
    ``resolution``: the step of the targets the bisection chooses from. ``alpha``: the error rate of each probe's
    test. ``targets``: a fixed grid instead of the bisection, each probe stopped once decided (the design to
    compare against); ``max_fraction``, ``max_probes`` and ``resolution`` are then unused."""

    tolerance: float = DEFAULT_TOLERANCE
    max_fraction: float = DEFAULT_MAX_FRACTION
    max_probes: int = 8
    block_size: int = 100
    max_items: int | None = None
    resolution: float = 0.01
    alpha: float = DEFAULT_ALPHA
    targets: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        _fraction("tolerance", self.tolerance, "an accuracy loss in (0, 1), e.g. 0.01 for one point", closed=False)
        _fraction("max_fraction", self.max_fraction, "a fraction of heads in (0, 1], e.g. 0.9")
        _fraction("resolution", self.resolution, f"a step in (0, max_fraction={self.max_fraction}], e.g. 0.01")
        if self.resolution > self.max_fraction:
            raise InactiveHeadsError(f"resolution {self.resolution} exceeds max_fraction {self.max_fraction}")
        _fraction("alpha", self.alpha, "an error rate in (0, 1), e.g. 0.05", closed=False)
        _count("max_probes", self.max_probes, 1)
        _count("block_size", self.block_size, 1)
        if self.max_items is not None:
            _count("max_items", self.max_items, 1)
        if self.targets is not None:
            if not self.targets:
                raise InactiveHeadsError("targets is empty; give fractions of heads in (0, 1], or None to search")
            for t in self.targets:
                _fraction("every target", t, "a fraction of heads in (0, 1] (0 zeroes nothing)")
            object.__setattr__(self, "targets", tuple(sorted({float(t) for t in self.targets})))

    @property
    def kind(self) -> str:
        """``"adaptive"`` (probabilistic bisection) or ``"sequential grid"`` (fixed targets)."""
        return "adaptive" if self.targets is None else "sequential grid"

    def identity(self) -> dict[str, Any]:
        """Every field, as plain JSON (part of a search's key: another design is another search)."""
        out = asdict(self)
        out["targets"] = None if self.targets is None else list(self.targets)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> SearchDesign:
        if not isinstance(obj, dict) or set(obj) != {f.name for f in fields(cls)}:
            raise InactiveHeadsError(f"malformed search design {obj!r}")
        targets = obj["targets"]
        return cls(**{**obj, "targets": None if targets is None else tuple(targets)})


def _malformed(what: str, obj: Any, checks: dict[str, Callable[[Any], bool]]) -> None:
    """InactiveHeadsError unless ``obj`` is a JSON object whose fields pass ``checks`` (other keys are ignored)."""
    if not isinstance(obj, dict):
        raise InactiveHeadsError(f"a {what} is a JSON object, got {type(obj).__name__}")
    missing = [k for k in checks if k not in obj]
    wrong = [k for k, ok in checks.items() if k in obj and not ok(obj[k])]
    if missing or wrong:
        raise InactiveHeadsError(f"malformed {what}: missing {missing}, wrong type {wrong}")


def _list_of(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(ok(x) for x in v)


def _or_none(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or ok(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


@dataclass(frozen=True)
class Block:
    """One evaluated block of a probe, as stored in ``searches/blocks/<key>.json``: the items' ``ids`` in the order
    asked, whether each was answered right, the realised ``fraction`` of heads zeroed on them, and the evaluation's
    wall time."""

    score: str
    threshold: float
    block: int
    ids: list[str]
    correct: list[bool]
    fraction: float
    seconds: float
    run: str

    @classmethod
    def from_json(cls, obj: Any) -> Block:
        """Parse a stored block; InactiveHeadsError (a ValueError) when a field is missing or of the wrong type."""
        _malformed("search block", obj, _BLOCK_TYPES)
        if len(obj["ids"]) != len(obj["correct"]):
            raise InactiveHeadsError("malformed search block: ids and correct differ in length")
        return cls(**{f.name: obj[f.name] for f in fields(cls)})


_BLOCK_TYPES: dict[str, Callable[[Any], bool]] = {
    "score": _is_str,
    "threshold": is_number,
    "block": _is_int,
    "ids": _list_of(_is_str),
    "correct": _list_of(lambda v: isinstance(v, bool)),
    "fraction": is_number,
    "seconds": is_number,
    "run": _is_str,
}

_LOOK_TYPES: dict[str, Callable[[Any], bool]] = {
    "block": _is_int,
    "items": _is_int,
    **dict.fromkeys(("fraction", "mean", "low", "high"), is_number),
    "decision": lambda v: v in ("within", "below", "undecided"),
}


@dataclass(frozen=True)
class ProbeRecord:
    """One probe of a search: its target and threshold, the realised ``fraction`` of heads zeroed, the ``items``
    read, their ``accuracy`` and ``mean`` paired difference to baseline, every look of its sequential test, its
    decision, why it stopped, and the evaluation seconds of its blocks."""

    target: float
    threshold: float
    fraction: float
    items: int
    accuracy: float
    mean: float
    decision: Decision
    stop: ProbeStop
    looks: tuple[Look, ...]
    seconds: float

    @classmethod
    def from_json(cls, obj: Any) -> ProbeRecord:
        _malformed("search probe", obj, _PROBE_TYPES)
        for look in obj["looks"]:
            _malformed("look of a search probe", look, _LOOK_TYPES)
        looks = tuple(Look(**{f.name: look[f.name] for f in fields(Look)}) for look in obj["looks"])
        return cls(**{**{f.name: obj[f.name] for f in fields(cls)}, "looks": looks})


_PROBE_TYPES: dict[str, Callable[[Any], bool]] = {
    **dict.fromkeys(("target", "threshold", "fraction", "accuracy", "mean", "seconds"), is_number),
    "items": _is_int,
    "decision": _LOOK_TYPES["decision"],
    "stop": lambda v: v in ("decided", "budget", "no_heads"),
    "looks": lambda v: isinstance(v, list) and bool(v),
}

_CROSSING_TYPES: dict[str, Callable[[Any], bool]] = {
    "state": lambda v: v in ("estimated", "censored", "not_applicable"),
    **dict.fromkeys(("value", "low", "high"), _or_none(is_number)),  # None: NaN (not applicable)
    "high_censored": lambda v: isinstance(v, bool),
    "level": is_number,
    "tolerance": is_number,
}


@dataclass(frozen=True)
class Search:
    """A finished search for one score function's crossing, as stored in ``searches/<key>.json``: the design, the
    crossing with its interval, every probe in the order run, why the search stopped, and its cost (``n_items``
    in the run, ``items_evaluated`` over all probes, the evaluation ``seconds`` of their blocks)."""

    score: str
    design: SearchDesign
    crossing: Crossing
    stop: str
    probes: tuple[ProbeRecord, ...]
    n_items: int
    items_evaluated: int
    seconds: float
    run: str

    def to_json(self) -> dict[str, Any]:
        """The stored JSON object (NaN, where the crossing is not applicable, as null)."""
        out = asdict(self)
        out["design"] = self.design.identity()
        out["crossing"] = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in out["crossing"].items()}
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Search:
        """Parse a stored search; InactiveHeadsError (a ValueError) when a field is missing or of the wrong type."""
        _malformed("search", obj, _SEARCH_TYPES)
        _malformed("search crossing", obj["crossing"], _CROSSING_TYPES)
        values: dict[str, Any] = {k: math.nan if v is None else v for k, v in obj["crossing"].items()}
        crossing = Crossing(**{k: values[k] for k in _CROSSING_TYPES})
        return cls(
            score=obj["score"],
            design=SearchDesign.from_json(obj["design"]),
            crossing=crossing,
            stop=obj["stop"],
            probes=tuple(ProbeRecord.from_json(p) for p in obj["probes"]),
            n_items=obj["n_items"],
            items_evaluated=obj["items_evaluated"],
            seconds=obj["seconds"],
            run=obj["run"],
        )


_SEARCH_TYPES: dict[str, Callable[[Any], bool]] = {
    "score": _is_str,
    "design": lambda v: isinstance(v, dict),
    "crossing": lambda v: isinstance(v, dict),
    "stop": lambda v: v in ("converged", "max_probes", "not_applicable", "grid"),
    "probes": lambda v: isinstance(v, list),
    "n_items": _is_int,
    "items_evaluated": _is_int,
    "seconds": is_number,
    "run": _is_str,
}


def _search_store(rd: RunDir) -> ResultStore:
    return ResultStore(rd.searches_path, validate=Search.from_json)


def _block_store(rd: RunDir) -> ResultStore:
    return ResultStore(rd.blocks_path, validate=Block.from_json)


def search_key(run: str, score: str, design: SearchDesign) -> str:
    """The store key of the search of ``score`` under ``design`` in the run with digest ``run``."""
    return result_key(run, score, search=design.identity())


def _baseline(
    model: PreTrainedModel,
    tokenizer: Any,
    task: Task,
    rd: RunDir,
    config: EvalConfig,
    score: str,
    ids: list[str],
    progress: Callable[[int], Any] | bool,
    wait: bool,
) -> npt.NDArray[np.bool_] | None:
    """The baseline's per-item correctness on ``ids``: the run's baseline cell, evaluated now unless stored; None when
    another process is evaluating it and ``wait`` is False."""
    cell = plan_cells(rd.root, scores=[score], targets=[])[0]
    if compute_cell(model, tokenizer, task, rd.root, cell, config, progress=progress, wait=wait) is None:
        return None
    correct = Cell.from_json(rd.cell_store().get(cell.key)).correct(ids)
    if correct is None:
        raise InactiveHeadsError(
            f"{rd.root}: its baseline cell holds no per-item answers for the run's items (stored by an older "
            "version); search in a new run directory"
        )
    return correct


def search_score(
    model: PreTrainedModel,
    tokenizer: Any,
    task: str | Task,
    run_dir: str | Path,
    score: str,
    design: SearchDesign | None = None,
    config: EvalConfig | None = None,
    *,
    progress: bool | Callable[[str], Callable[[int], Any] | bool] = False,
    wait: bool = True,
    **options: Any,
) -> Search | None:
    """Search ``score``'s crossing in a calibrated run (module docstring) and store the :class:`Search`.

    Returns the search, read back when it was stored already, or None when another process holds its claim or is
    evaluating the run's baseline cell (only with ``wait=False``). ``model``, ``task`` and ``config`` (``options``:
    any of its fields by name) must be the run's. Items are read in the order seeded by the run's ``seed``.
    ``progress``: a bar over the sequences of each block (True), or ``progress(label)``, what ``evaluate`` takes as its
    progress for the block of that label."""
    design = SearchDesign() if design is None else design
    config = EvalConfig.from_options(config, **options)
    score_names([score])
    bar = progress if callable(progress) else partial(sequence_bar, progress)
    rd = RunDir(run_dir)
    task_obj, config, run = open_run(model, task, rd, config)
    digest = run_digest(run)
    key = search_key(digest, score, design)
    store = _search_store(rd)
    if store.has(key):
        return Search.from_json(store.get(key))
    with store.claim(key, wait=wait) as mine:
        if not mine:
            return None
        if store.has(key):  # finished by the process that held the claim
            return Search.from_json(store.get(key))
        pool = pinned(task_obj, config.limit, config.seed, config.shots_for(task_obj))
        ids = [it.id for it in pool.items]
        baseline = _baseline(model, tokenizer, task_obj, rd, config, score, ids, bar("baseline"), wait)
        if baseline is None:  # a worker left waiting here would idle while others could search elsewhere
            return None
        blocks = _block_store(rd)
        block_config = config.replace(limit=None)  # the block's items are chosen already
        thresholds: dict[float, float] = {}
        answered: dict[float, list[Block]] = {}

        def evaluate(target: float, items: npt.NDArray[np.int64]) -> Answer:
            if target not in thresholds:
                thresholds[target] = planned_thresholds(rd, [score], [target])[score][0]
            done = answered.setdefault(target, [])
            threshold, k, chosen = thresholds[target], len(done), [pool.items[i] for i in items]
            block_ids = [it.id for it in chosen]
            block_key = result_key(digest, score, threshold=threshold, block=k, items=block_ids)
            if not blocks.has(block_key):
                result = evaluation.evaluate(
                    model,
                    tokenizer,
                    replace(pool, items=chosen),
                    block_config,
                    policy=Policy(score=score, threshold=threshold, seed=config.seed),
                    progress=bar(f"{score} p={target} block {k}"),
                )
                block = Block(
                    score=score,
                    threshold=threshold,
                    block=k,
                    ids=block_ids,
                    correct=[p == g for p, g in zip(result.pred, result.gold, strict=True)],
                    fraction=float(result.zeroed_fraction or 0.0),
                    seconds=float(result.timing["total_s"]),
                    run=digest,
                )
                blocks.put(block_key, asdict(block))
            done.append(Block.from_json(blocks.get(block_key)))  # what a replay reads, also the first time
            return Answer(np.asarray(done[-1].correct, dtype=bool), done[-1].fraction)

        common: dict[str, Any] = {"tolerance": design.tolerance, "alpha": design.alpha, "seed": config.seed}
        common |= {"block_size": design.block_size, "max_items": design.max_items}
        if design.targets is None:
            result = search_crossing(
                evaluate,
                baseline,
                max_fraction=design.max_fraction,
                max_probes=design.max_probes,
                resolution=design.resolution,
                **common,
            )
        else:
            result = grid_crossing(evaluate, baseline, design.targets, sequential=True, **common)
        found = _record(result, score, design, thresholds, answered, baseline, digest)
        store.put(key, found.to_json())
    return found


def _record(
    result: CrossingResult,
    score: str,
    design: SearchDesign,
    thresholds: dict[float, float],
    answered: dict[float, list[Block]],
    baseline: npt.NDArray[np.bool_],
    digest: str,
) -> Search:
    probes = tuple(
        ProbeRecord(
            target=p.target,
            threshold=thresholds[p.target],
            fraction=p.fraction,
            items=int(p.items.size),
            accuracy=float(baseline[p.items].mean() + p.mean),
            mean=p.mean,
            decision=p.decision,
            stop=p.stop,
            looks=p.looks,
            seconds=sum(b.seconds for b in answered[p.target]),
        )
        for p in result.probes
    )
    return Search(
        score=score,
        design=design,
        crossing=result.crossing,
        stop=result.stop,
        probes=probes,
        n_items=int(baseline.size),
        items_evaluated=result.items_evaluated,
        seconds=sum(p.seconds for p in probes),
        run=digest,
    )


def search(
    model: PreTrainedModel,
    tokenizer: Any,
    task: str | Task,
    run_dir: str | Path,
    config: EvalConfig | None = None,
    *,
    scores: str | Sequence[str] = "all",
    design: SearchDesign | None = None,
    calibration_task: str | Task | None = None,
    calibration_limit: int | None = None,
    calibration_items: CalibrationItems = "same",
    model_name: str | None = None,
    progress: bool = True,
    **options: Any,
) -> list[Search]:
    """The adaptive counterpart of :func:`~inactive_heads.runs.jobs.sweep`: calibrate (unless done), evaluate the
    baseline cell (unless stored), then :func:`search_score` for every score function not searched yet under
    ``design`` (default :class:`SearchDesign`). Options as in ``sweep``. Returns the searches in ``scores``' order."""
    design = SearchDesign() if design is None else design
    config = EvalConfig.from_options(config, **options)
    names = score_names(scores)
    task_obj, config = calibrated_run(
        model, tokenizer, task, run_dir, config, calibration_task, calibration_limit, calibration_items, model_name,
        progress,
    )  # fmt: skip
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(names), desc=f"search {RunDir(run_dir).read_run()['model']['name']}", unit="score")
    found = []
    try:
        for name in names:
            if bar is not None:
                bar.set_postfix_str(name)
            found.append(search_score(model, tokenizer, task_obj, run_dir, name, design, config, progress=progress))
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return [s for s in found if s is not None]


def load_searches(run_dir: str | Path, keys: Sequence[str] | None = None) -> list[Search]:
    """The finished searches of a run directory made for its run (``keys``: only these), by score and design.
    Corrupt or partial records are skipped."""
    rd = RunDir(run_dir)
    digest = run_digest(rd.read_run())
    store = _search_store(rd)
    wanted = store.keys() if keys is None else [k for k in keys if store.has(k)]
    found = [Search.from_json(store.get(k)) for k in wanted]
    order = {name: i for i, name in enumerate(SCORE_FUNCTIONS)}
    return sorted((s for s in found if s.run == digest), key=lambda s: (s.design.kind, order.get(s.score, -1), s.score))


def _probes(
    root: Path,
    search: Search,
    blocks: dict[tuple[str, float, int, int], Block],
    index: dict[str, int],
    base: npt.NDArray[np.int8],
) -> list[Probe]:
    """The probes of ``search`` with their per-item answers, from the run's stored ``blocks`` (keyed by score,
    threshold, block index and length; item indices are positions in ``index``, the baseline cell's items)."""
    size = search.design.block_size
    out = []
    for p in search.probes:
        ids: list[str] = []
        correct: list[bool] = []
        for k in range(math.ceil(p.items / size)):
            block = blocks.get((search.score, p.threshold, k, min(size, search.n_items - k * size)))
            if block is None:
                raise InactiveHeadsError(f"{root}: block {k} of {search.score} at threshold {p.threshold} is missing")
            ids += block.ids
            correct += block.correct
        items = np.array([index[i] for i in ids[: p.items]], dtype=np.int64)
        difference = np.asarray(correct[: p.items], dtype=np.int8) - base[items]
        out.append(Probe(p.target, p.fraction, items, difference, p.looks, p.decision, p.stop))
    return out


def stored_probes(run_dir: str | Path, searches: Sequence[Search]) -> dict[str, list[Probe]]:
    """The probes of each of ``searches`` (of one run) with their per-item answers, read back from the run's stored
    blocks and baseline cell: what the search fitted. Item indices are positions among the baseline cell's items."""
    rd = RunDir(run_dir)
    if not searches:
        return {}
    cell = plan_cells(rd.root, scores=[searches[0].score], targets=[])[0]
    baseline = Cell.from_json(rd.cell_store().get(cell.key))
    if baseline.per_item is None:
        raise InactiveHeadsError(f"{rd.root}: its baseline cell holds no per-item answers")
    index = {item: i for i, item in enumerate(baseline.per_item["ids"])}
    base = np.asarray(baseline.correct(), dtype=np.int8)
    digest = run_digest(rd.read_run())
    blocks = {
        (b.score, b.threshold, b.block, len(b.ids)): b
        for _, b in _block_store(rd).load(Block.from_json)
        if b.run == digest
    }
    return {s.score: _probes(rd.root, s, blocks, index, base) for s in searches}


def compare_searches(
    run_dir: str | Path,
    searches: Sequence[Search],
    *,
    seed: int = 0,
    probes: Mapping[str, Sequence[Probe]] | None = None,
) -> list[Comparison]:
    """Every pair of ``searches`` (of one run and one design) tested with
    :func:`~inactive_heads.stats.crossing.compare_crossings` on the per-item answers stored in the run (``probes``:
    those of :func:`stored_probes`, where the caller has read them already): one paired bootstrap over the items,
    Holm's correction over the pairs; functions that zero no head are left out."""
    if len({s.design for s in searches}) > 1:
        raise ValueError("compare searches of one design at a time")
    if not searches:
        return []
    if probes is None:
        probes = stored_probes(run_dir, searches)
    return compare_crossings(probes, tolerance=searches[0].design.tolerance, seed=seed)
