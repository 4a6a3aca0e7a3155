"""Run directories for tests, written through the package's own records: ``run_record``, :class:`Cell`, ``RunDir``
and its cell store, so a fixture holds exactly what a sweep would have stored."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from inactive_heads.runs.directory import Cell, RunDir, run_digest, run_record
from inactive_heads.runs.store import cell_key
from inactive_heads.scores import SCORE_FUNCTIONS, HeadScores


def make_cell(
    score: str | None = None,
    target: float | None = None,
    *,
    accuracy: float | None = None,
    fraction_zeroed: float = 0.0,
    shape: tuple[int, int] = (2, 2),
    correct: Collection[bool] | None = None,
    ids: Sequence[str] | None = None,
    **fields: Any,
) -> Cell:
    """A valid cell (``score`` None: the baseline) zeroing ``fraction_zeroed`` of every head of its ``shape``
    (layers, heads); ``fields`` set any other :class:`Cell` field.

    ``correct[i]``: whether item ``i`` (named ``ids[i]``, default ``q0, q1, ...``) was answered right; it gives the
    per-item answers (gold 0, pred 0 when right, else 1) and, unless given, the accuracy.
    """
    n_layers, n_heads = shape
    per_item: dict[str, Any] | None = None
    if correct is not None:
        pred = [0 if c else 1 for c in correct]
        names = list(ids) if ids is not None else [f"q{i}" for i in range(len(pred))]
        per_item = {"ids": names, "gold": [0] * len(pred), "pred": pred, "pred_norm": pred, "loglikelihoods": []}
        if accuracy is None:
            accuracy = sum(correct) / len(pred)
    if accuracy is None:
        raise ValueError("give the cell's accuracy or its per-item answers")
    inactive_when = None
    if score is not None:
        inactive_when = SCORE_FUNCTIONS[score].inactive_when if score in SCORE_FUNCTIONS else "below"
    values: dict[str, Any] = {
        "score": score,
        "target": target,
        "threshold": None if score is None else target,
        "inactive_when": inactive_when,
        "accuracy": accuracy,
        "acc_norm": None,
        "mean_ll_correct": None,
        "fraction_zeroed": fraction_zeroed,
        "per_layer": [fraction_zeroed] * n_layers,
        "per_head": [[fraction_zeroed] * n_heads for _ in range(n_layers)],
        "n_items": len(per_item["ids"]) if per_item is not None else 1,
        "seconds": 1.0,
        "per_item": per_item,
    }
    return Cell(**{**values, **fields})


def make_run(
    root: Path,
    cells: Iterable[Cell],
    *,
    name: str = "m",
    task: str = "piqa",
    shape: tuple[int, int] = (2, 2),
    evaluation: dict[str, Any] | None = None,
    identity: dict[str, Any] | None = None,
    scores: HeadScores | None = None,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write a valid run directory at ``root`` and return it: the run record of model ``name`` (``identity``: its
    :func:`~inactive_heads.runs.directory.model_identity`, default a stand-in) with ``shape`` (layers, heads) on
    ``task``; a calibration when ``scores`` or ``meta`` is given; and ``cells``, each made for this run and stored
    under its own key as a sweep stores it."""
    rd = RunDir(root)
    n_layers, n_heads = shape
    run = run_record(
        name=name,
        identity=identity if identity is not None else {"source": None, "name_or_path": name, "class": "Tiny"},
        task=task,
        task_items="test-items",
        evaluation=evaluation or {},
        n_layers=n_layers,
        n_heads=n_heads,
    )
    rd.write_run(run)
    if scores is not None:
        scores.save(rd.scores_path)
    if scores is not None or meta is not None:
        rd.write_meta(meta or {})
    digest = run_digest(run)
    store = rd.cell_store()
    for c in cells:
        key = cell_key(run=digest, score=c.score, target=c.target, threshold=c.threshold)
        store.put(key, replace(c, run=digest).to_json())
    return rd.root
