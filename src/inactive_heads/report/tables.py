"""What stored runs say beyond their curves: bootstrap intervals, overlap of flagged heads, how calibrations differ.

Everything here reads run directories (cells with their per-item answers, calibration scores); nothing runs a
model. Tables are ``(header, rows)`` of strings, ready for :class:`~inactive_heads.report.document.Document`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..generation import cascade, flip_share
from ..runs.adaptive import load_searches
from ..runs.directory import Cell, RunData, score_label
from ..scores import SCORE_FUNCTIONS
from ..stats.bootstrap import (
    DEFAULT_RESAMPLES,
    Bootstrap,
    CascadeIntervals,
    Interval,
    bootstrap_cascade,
    bootstrap_difference,
    bootstrap_run,
    independent_counts,
    item_index,
    percentile_interval,
)
from ..stats.curves import Table2Row
from ..stats.overlap import Overlap, overlap, threshold_spread
from ..stats.thresholds import DEFAULT_TARGETS, resampled_thresholds, thresholds_from_cdf

__all__ = [
    "NO_AUC",
    "analysed_scores",
    "analysis_targets",
    "auc_text",
    "calibration_label",
    "cascade_table",
    "interval_text",
    "mode_agreement_table",
    "overlap_table",
    "overlap_text",
    "protocol_table",
    "run_bootstrap",
    "run_overlaps",
    "scores_flat_within_layers",
    "threshold_groups",
    "threshold_table",
]

Table = tuple[list[str], list[list[str]]]


def calibration_label(run: RunData) -> str:
    """How a run was calibrated, in words: on its evaluated items, on other items of its task, or on another task."""
    meta, task = run.calibration_meta, run.run.get("task")
    if meta.get("task") not in (None, task):
        return f"calibrated on {meta['task']}"
    return "held-out calibration" if meta.get("items") == "heldout" else "calibrated on the evaluated items"


def run_bootstrap(run: RunData, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> Bootstrap | None:
    """:func:`~inactive_heads.stats.bootstrap.bootstrap_run` over a run's stored cells; None when a cell lacks its
    per-item answers (cells stored before they were kept) or the cells disagree on the items."""
    base = next((c for c in run.cells if c.score is None), None)
    if base is None or base.per_item is None:
        return None
    ids = base.per_item.get("ids")
    baseline = base.correct(ids)
    curves = {}
    for name, curve in run.curves().items():
        points = []
        for c in curve.extra["cells"]:
            correct = c.correct(ids)
            if correct is None:
                return None
            points.append((float(c.fraction_zeroed), correct))
        curves[name] = points
    assert baseline is not None
    return bootstrap_run(baseline, curves, n_resamples=n_resamples, seed=seed)


def interval_text(iv: Interval, scale: float = 100.0, fmt: str = ".1f", signed: bool = False) -> str:
    """``value [low, high]`` scaled (percent by default)."""
    sign = "+" if signed else ""
    return f"{iv.value * scale:{sign}{fmt}} [{iv.low * scale:{sign}{fmt}}, {iv.high * scale:{sign}{fmt}}]"


#: Why a run's AUC column is empty when its baseline is 0 (a generative task the model never solves, say).
NO_AUC = "AUC: none, as the baseline accuracy is 0 and AUC is accuracy relative to it."


def auc_text(value: float) -> str:
    """A Table-2 AUC; "–" where there is none (a score that zeroes no heads, or a baseline accuracy of 0)."""
    return "–" if math.isnan(value) else f"{value:.3f}"


def max_zeroed_text(row: Table2Row, iv: Interval | None = None, fmt: str = ".1f") -> str:
    """A Table-2 value in % (with its interval): ``≥`` marks a lower bound, a curve still within tolerance at the
    largest fraction measured (:attr:`~inactive_heads.stats.curves.Table2Row.lower_bound`)."""
    mark = "≥" if row.lower_bound else ""
    if iv is None:
        return f"{mark}{100 * row.max_zeroed:{fmt}}"
    return mark + interval_text(iv, fmt=fmt)


def analysed_scores(run: RunData) -> list[str]:
    """The score functions a run's calibration analyses cover: those with cells, else (a run that searches) those
    with a stored search, in registry order."""
    if run.score_names:
        return run.score_names
    searched = {s.score for s in load_searches(run.dir)}
    return [n for n in SCORE_FUNCTIONS if n in searched] + sorted(searched - set(SCORE_FUNCTIONS))


def analysis_targets(run: RunData) -> list[float]:
    """The target fractions a run's calibration analyses are read at: its cells' targets and the default ones
    above 0 (a run that searches has probes at fractions of their own; a small grid, one or two targets)."""
    cells = {float(c.target) for c in run.cells if c.target is not None}
    return sorted(cells | {t for t in DEFAULT_TARGETS if t > 0})


def run_overlaps(
    run: RunData, targets: Sequence[float], n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> list[Overlap]:
    """:func:`~inactive_heads.stats.overlap.overlap` of the run's score functions (with cells) at each target, from its
    calibration scores, with bootstrap intervals when the calibration recorded each row's item; empty without
    scores."""
    if run.scores is None:
        return []
    names = [n for n in analysed_scores(run) if n != "random"]
    if len(names) < 2:
        return []
    scores = run.scores.derive(names)
    return [overlap(scores, names, t, run.row_items, n_resamples=n_resamples, seed=seed) for t in targets]


def scores_flat_within_layers(run: RunData) -> list[str]:
    """The run's score functions (with cells) that take one value for every head of a layer on every calibration
    row, e.g. value-vector scores when a layer has a single KV head: a threshold zeroes all of a layer's heads or
    none (and an LN variant, exactly 1 everywhere, none at all)."""
    if run.scores is None:
        return []
    out = []
    for name in analysed_scores(run):
        try:
            values = run.scores.derive([name])[name]
        except KeyError:  # raw statistics not recorded
            continue
        if values.shape[-1] > 1 and bool(torch.all(values.amax(-1) == values.amin(-1))):
            out.append(name)
    return out


def overlap_text(o: Overlap, which: str, i: int, j: int) -> str:
    """The IoU (``which`` "iou") or precision of functions ``i`` and ``j`` of ``o`` to 2 decimals, with its interval
    where ``o`` has them."""
    value = float((o.iou if which == "iou" else o.precision)[i, j])
    bounds = o.iou_interval if which == "iou" else o.precision_interval
    if bounds is None:
        return f"{value:.2f}"
    return f"{value:.2f} [{bounds[0, i, j]:.2f}, {bounds[1, i, j]:.2f}]"


def overlap_table(overlaps: Sequence[Overlap]) -> Table:
    """Per target: the largest IoU and the largest precision over all pairs, with the pairs, and AHON (LN) vs
    AVVN (LN) where both are present (the paper's closest pair); with intervals where the overlaps have them."""
    rows = []
    for o in overlaps:
        at = o.names.index
        _, ia, ib = o.max_pair("iou")
        _, pa, pb = o.max_pair("precision")
        pair = "–"
        if "ahon_ln" in o.names and "avvn_ln" in o.names:
            pair = overlap_text(o, "iou", at("ahon_ln"), at("avvn_ln"))
        rows.append(
            [
                f"{o.target:g}",
                f"{overlap_text(o, 'iou', at(ia), at(ib))} ({score_label(ia)}, {score_label(ib)})",
                f"{overlap_text(o, 'precision', at(pa), at(pb))} ({score_label(pa)} in {score_label(pb)})",
                pair,
            ]
        )
    return [
        "target",
        "max IoU (pair)",
        "max precision (A's heads that B flags too)",
        "AHON (LN) vs AVVN (LN) IoU",
    ], rows


def _resampled_thresholds(
    runs: dict[str, RunData], keys: list[tuple[str, float]], n_resamples: int, seed: int
) -> dict[tuple[str, str, float], np.ndarray] | None:
    """Per (task, score, target): the thresholds of ``n_resamples`` bootstraps of each task's calibration items
    (tasks resampled independently); None unless every calibration recorded each row's item."""
    calibrated = {t: (r.scores, r.row_items) for t, r in runs.items()}
    if n_resamples < 1 or any(scores is None or items is None for scores, items in calibrated.values()):
        return None
    dense = {t: item_index(items) for t, (_, items) in calibrated.items()}  # type: ignore[arg-type]
    counts = independent_counts([n for _, n in dense.values()], n_resamples, seed)
    out = {}
    for (task, (scores, _)), draws in zip(calibrated.items(), counts, strict=True):
        assert scores is not None  # checked above
        for score in dict.fromkeys(s for s, _ in keys if s in SCORE_FUNCTIONS):
            targets = [p for s, p in keys if s == score]
            try:
                values = scores.derive([score])[score]
            except KeyError:  # its raw statistics were not recorded: no interval for this score
                continue
            side = SCORE_FUNCTIONS[score].inactive_when
            thresholds = resampled_thresholds(values, side, targets, dense[task][0], draws)
            out.update({(task, score, p): thresholds[:, j] for j, p in enumerate(targets)})
    return out


def threshold_groups(runs: Sequence[RunData]) -> dict[tuple[str, str], list[RunData]]:
    """The runs whose thresholds a stability table sets side by side: per model, those calibrated the same way
    (on the evaluated items, or held out), keyed by (model, "same" or "heldout")."""
    groups: dict[tuple[str, str], list[RunData]] = {}
    for r in runs:
        groups.setdefault((r.name, str(r.calibration_meta.get("items", "same"))), []).append(r)
    return groups


def threshold_table(runs: Sequence[RunData], n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> Table | None:
    """Thresholds of one model's calibrations on different tasks, side by side, per score and target, with their
    spread (:func:`~inactive_heads.stats.overlap.threshold_spread`); None unless two tasks were calibrated the same way.

    Thresholds are taken from each calibration's scores as the sweep takes them (from the cells of a run kept
    without its scores), at :func:`analysis_targets`, for :func:`analysed_scores`. The spread's 95% interval
    comes from bootstraps of each task's calibration items, drawn independently (where every calibration recorded
    its rows' items)."""
    by_task: dict[str, dict[tuple[str, float], float]] = {}
    run_of: dict[str, RunData] = {}
    for run in runs:
        task = str(run.calibration_meta.get("task", run.run.get("task")))
        for score, target, threshold in _run_thresholds(run):
            by_task.setdefault(task, {})[(score, target)] = threshold
            run_of.setdefault(task, run)
    if len(by_task) < 2:
        return None
    # Tasks in one canonical order: each task's resamples, and so the intervals, do not depend on the runs' order.
    tasks = sorted(by_task)
    rank = _score_order(runs)
    keys = sorted({k for t in by_task.values() for k in t}, key=lambda k: (rank(k[0]), k[1]))
    drawn = _resampled_thresholds({t: run_of[t] for t in tasks}, keys, n_resamples, seed)
    rows = []
    for score, target in keys:
        present = {t: by_task[t][(score, target)] for t in tasks if (score, target) in by_task[t]}
        if len(present) < 2:
            continue
        cells = [f"{present[t]:.4g}" if t in present else "–" for t in tasks]
        point = float(threshold_spread(present))
        spread = f"{point:.3f}"
        if drawn is not None and all((t, score, target) in drawn for t in present):
            samples = np.asarray(threshold_spread(np.stack([drawn[t, score, target] for t in present])))
            spread = interval_text(percentile_interval(point, samples), scale=1.0, fmt=".3f")
        rows.append([score_label(score), f"{target:g}", *cells, spread])
    header = ["score", "target", *(f"threshold on {t}" for t in tasks), "spread (max − min) / |median| [95% CI]"]
    return header, rows


def _run_thresholds(run: RunData) -> list[tuple[str, float, float]]:
    """(score, target, threshold) of a run: from its calibration scores at :func:`analysis_targets` (as a sweep
    takes them); for a function the scores cannot give (a run kept without them), those its cells used."""
    used = [
        (c.score, float(c.target), float(c.threshold))
        for c in run.cells
        if c.score is not None and c.target is not None and c.threshold is not None
    ]
    if run.scores is None:
        return used
    targets, out, derived = analysis_targets(run), [], set()
    for name in analysed_scores(run):
        try:
            values = run.scores.derive([name])[name]
        except KeyError:  # raw statistics not recorded
            continue
        found = thresholds_from_cdf(values, SCORE_FUNCTIONS[name].inactive_when, targets)
        out += [(name, t, float(v)) for t, v in zip(targets, found, strict=True)]
        derived.add(name)
    return out + [u for u in used if u[0] not in derived]


def _score_order(runs: Sequence[RunData]) -> Callable[[str], int]:
    """A sort key for score names: the position in the first run that analyses the score (unknown ones last)."""
    order: dict[str, int] = {}
    for run in runs:
        for i, name in enumerate(analysed_scores(run)):
            order.setdefault(name, i)
    return lambda score: order.get(score, 1 << 30)


def protocol_table(
    variants: Sequence[tuple[RunData, Bootstrap | None]], n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> Table | None:
    """The same task and model under different calibrations: per (score, target) present in two or more of them,
    each calibration's accuracy change to baseline (95% interval) and the fraction of heads it actually zeroed, and
    how each calibration's accuracy differs from the reference one (the held-out calibration where there is one,
    else the first), with the paired bootstrap interval over the evaluated items."""
    if len(variants) < 2:
        return None
    runs = [r for r, _ in variants]
    stored = [
        {(c.score, float(c.target)): c for c in r.cells if c.score is not None and c.target is not None} for r in runs
    ]
    rank = _score_order(runs)
    keys = sorted(
        {k for cells in stored for k in cells if sum(k in t for t in stored) >= 2}, key=lambda k: (rank(k[0]), k[1])
    )
    if not keys:
        return None
    labels = [calibration_label(r) for r in runs]
    ref = labels.index("held-out calibration") if "held-out calibration" in labels else 0
    others = [i for i in range(len(runs)) if i != ref]

    def shown(i: int, key: tuple[str, float]) -> str:
        (run, boot), c = variants[i], stored[i].get(key)
        if c is None:
            return "–"
        iv = None if boot is None else boot.cells.get((key[0], float(c.fraction_zeroed)))
        delta = f"{100 * (c.accuracy - run.baseline):+.1f}" if iv is None else interval_text(iv, signed=True)
        return f"{delta} at {100 * c.fraction_zeroed:.1f}%"

    def versus(i: int, key: tuple[str, float]) -> str:
        a, b = stored[i].get(key), stored[ref].get(key)
        if a is None or b is None:
            return "–"
        ids = (b.per_item or {}).get("ids")
        x, y = a.correct(ids), b.correct(ids)
        if x is None or y is None:
            return f"{100 * (a.accuracy - b.accuracy):+.1f}"
        return interval_text(bootstrap_difference(x, y, n_resamples=n_resamples, seed=seed), signed=True)

    def short(label: str) -> str:
        return label.removeprefix("calibrated ").removesuffix(" calibration")

    header = ["score", "target", *labels, *(f"{short(labels[i])} − {short(labels[ref])}" for i in others)]
    return header, [
        [score_label(s), f"{t:g}", *(shown(i, (s, t)) for i in range(len(runs))), *(versus(i, (s, t)) for i in others)]
        for s, t in keys
    ]


def cascade_table(runs: Sequence[RunData]) -> Table | None:
    """Generative runs (one per generation mode, say): per cell, exact match and its change, the share of items
    whose generated tokens equal the baseline's, the quartiles of the first position where the others diverge,
    generation speed against the run's baseline and, in ``recompute``, the share of decoding steps at which some
    decision flipped (each re-runs its row); None when no run stored generated tokens."""
    rows = []
    for run in runs:
        generated = [(c, c.generation) for c in run.cells if c.generation]
        base, base_gen = next(((c, g) for c, g in generated if c.score is None), (None, None))
        if base is None or base_gen is None:
            continue
        rank = _score_order([run])
        cells = sorted(
            ((c.score, c.target, c, g) for c, g in generated if c.score is not None and c.target is not None),
            key=lambda t: (rank(t[0]), float(t[1])),
        )
        rows.append(
            [str(base_gen["mode"]), "baseline", "–", "0.0", f"{100 * base.accuracy:.1f}", "–", "100", "–",
             f"{base_gen['tokens_per_s']:.1f}", "1.00x", "–", "–"]
        )  # fmt: skip
        for score, target, c, gen in cells:
            iv = _paired_cascade(c, gen, base, base_gen)
            if iv is None:
                continue  # other items than the baseline's: nothing to compare token by token
            spread = " / ".join("–" if q.value != q.value else interval_text(q, scale=1, fmt=".0f")
                                for q in iv.quartiles)  # fmt: skip
            speed = gen["tokens_per_s"] / max(base_gen["tokens_per_s"], 1e-9)
            rows.append(
                [str(gen["mode"]), score_label(score), f"{float(target):g}",
                 f"{100 * c.fraction_zeroed:.1f}", f"{100 * c.accuracy:.1f}",
                 interval_text(iv.delta, signed=True), interval_text(iv.identical, fmt=".0f"), spread,
                 f"{gen['tokens_per_s']:.1f}", f"{speed:.2f}x", _flipped(gen), _kv_dropped(gen)]
            )  # fmt: skip
    if not rows:
        return None
    header = ["mode", "score", "target", "% zeroed", "exact match", "Δ [95%]", "% identical to baseline [95%]",
              "first divergence (token; q1 / median / q3 [95%])", "tokens/s", "vs baseline", "% steps flipped",
              "% KV cache unread / dropped"]  # fmt: skip
    return header, rows


def mode_agreement_table(runs: Sequence[RunData]) -> Table | None:
    """Generative runs of one model and task in several generation modes, against the ``recompute`` run (the
    paper's protocol): per cell another mode shares with it (score and target, on the same items), the share of
    items whose generated tokens equal recompute's and the change in exact match, with paired bootstrap intervals;
    None without a recompute run and a cell to compare."""
    by_mode: dict[str, dict[tuple[str, float], tuple[Cell, dict[str, Any]]]] = {}
    for run in runs:
        for c in run.cells:
            if c.generation and c.score is not None and c.target is not None:
                by_mode.setdefault(str(c.generation["mode"]), {})[(c.score, float(c.target))] = (c, c.generation)
    reference = by_mode.pop("recompute", None)
    if reference is None:
        return None
    rank = _score_order(runs)
    rows = []
    for mode, cells in by_mode.items():
        for key in sorted(cells.keys() & reference.keys(), key=lambda k: (rank(k[0]), k[1])):
            (c, gen), (ref, ref_gen) = cells[key], reference[key]
            iv = _paired_cascade(c, gen, ref, ref_gen)
            if iv is None:
                continue
            rows.append(
                [mode, score_label(key[0]), f"{key[1]:g}", f"{100 * c.fraction_zeroed:.1f}",
                 f"{100 * ref.fraction_zeroed:.1f}", interval_text(iv.identical, fmt=".0f"),
                 interval_text(iv.delta, signed=True)]
            )  # fmt: skip
    if not rows:
        return None
    header = ["mode", "score", "target", "% zeroed", "% zeroed in recompute", "% identical to recompute [95%]",
              "Δ exact match vs recompute [95%]"]  # fmt: skip
    return header, rows


def _paired_cascade(cell: Cell, gen: dict[str, Any], ref: Cell, ref_gen: dict[str, Any]) -> CascadeIntervals | None:
    """:func:`~inactive_heads.stats.bootstrap.bootstrap_cascade` of a generative cell against a reference cell (the
    baseline, or another mode's); None when either lacks per-item answers or they hold other items."""
    right, ref_right = cell.correct(), ref.correct()
    if right is None or ref_right is None or (cell.per_item or {}).get("ids") != (ref.per_item or {}).get("ids"):
        return None
    found = cascade(ref_gen["generated_tokens"], gen["generated_tokens"])
    return bootstrap_cascade(right, ref_right, found["first_divergence"])


def _flipped(gen: dict[str, Any]) -> str:
    """``recompute``'s share of decoding steps whose decisions flipped, in %."""
    flips = gen.get("flips")
    return "–" if flips is None else f"{100 * flip_share(flips, gen['generated_tokens']):.1f}"


def _kv_dropped(gen: dict[str, Any]) -> str:
    """Prompt mode's KV-cache bytes its rows leave unread and those the cache dropped, in % of the whole cache."""
    total = gen.get("kv_bytes") or 0
    if gen.get("mode") != "prompt" or not total or "kv_bytes_dropped" not in gen:
        return "–"
    return f"{100 * gen['kv_bytes_droppable'] / total:.1f} / {100 * gen['kv_bytes_dropped'] / total:.1f}"
