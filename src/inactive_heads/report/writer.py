"""The Markdown + self-contained HTML report over one or more run directories, or over a study's runs."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write_bytes, atomic_write_text
from ..errors import InactiveHeadsError
from ..runs.directory import Cell, RunData, load_run, score_label, slug
from ..scores import SCORE_FUNCTIONS
from ..stats.bootstrap import DEFAULT_RESAMPLES, Bootstrap, Interval
from ..stats.curves import Table2Row, spearman, top_k_iou, within_tolerance
from ..stats.distances import shared_wasserstein
from .compare import score_distances, series_distances
from .crossings import crossings_across, crossings_csv, crossings_section, grid_comparisons_section
from .document import Document, linked_images
from .figures import cdf_figure, curves_figure, delta_figure, head_heatmap, overlap_figure, png, rank_heatmap
from .tables import (
    NO_AUC,
    analysed_scores,
    analysis_targets,
    auc_text,
    calibration_label,
    cascade_table,
    max_zeroed_text,
    mode_agreement_table,
    overlap_table,
    protocol_table,
    run_bootstrap,
    run_overlaps,
    scores_flat_within_layers,
    threshold_groups,
    threshold_table,
)

__all__ = ["write_report", "write_study_report"]


def _best_cell(run: RunData, rows: list[Table2Row]) -> tuple[str, Cell] | None:
    # The best score function (random only if it is the only one) at its largest within-1-point target.
    ordered = [r.score for r in rows if r.score != "random"] + ["random"]
    curves = run.curves()
    for name in ordered:
        if name not in curves:
            continue
        cells = [c for c in curves[name].extra["cells"] if within_tolerance(c.accuracy, run.baseline)]
        if cells:
            return name, max(cells, key=lambda c: c.fraction_zeroed)
    # No cell stays within 1 point: show the best score function's mildest intervention.
    for name in ordered:
        if name in curves:
            return name, min(curves[name].extra["cells"], key=lambda c: c.fraction_zeroed)
    return None


_TABLE2_NOTE = (
    "Max % zeroed within 1 pt: the largest measured fraction of heads zeroed whose accuracy stays within one point "
    "of baseline (last crossing of baseline − 1 pt, linearly interpolated); ≥ marks a curve still within 1 pt at "
    "the largest fraction measured, so the value is a lower bound set by the targets. AUC: area under "
    "accuracy/baseline over the fraction range all score functions of the model reach, divided by its width. Rank 1 "
    "is best."
)


def _fmt_pct(fraction: float) -> str:
    return f"{100 * fraction:.1f}"


def _table2_rows(rows: list[Table2Row]) -> list[list[str]]:
    return [[r.score, r.label, max_zeroed_text(r), auc_text(r.auc), f"{r.rank:g}"] for r in rows]


def _sorted_cells(run: RunData) -> list[Cell]:
    """The baseline first, then each score function's cells by target, score functions in the run's order."""
    order: dict[str | None, int] = {n: k for k, n in enumerate(run.score_names)}
    return sorted(run.cells, key=lambda c: (c.score is not None, order.get(c.score, -1), c.target or 0.0))


def _cell_rows(run: RunData, boot: Bootstrap | None = None) -> list[list[str]]:
    cells = _sorted_cells(run)
    base = run.baseline

    def num(value: Any, fmt: str) -> str:
        return "–" if value is None else format(value, fmt)

    return [
        [
            c.score or "baseline",
            num(c.target, "g"),
            num(c.threshold, ".4g"),
            _fmt_pct(float(c.fraction_zeroed)),
            f"{100 * c.accuracy:.2f}",
            f"{100 * (c.accuracy - base):+.2f}",
            *([] if boot is None else [_delta_interval(boot, c)]),
            num(c.mean_ll_correct, ".4f"),
            num(c.seconds, ".0f"),
        ]
        for c in cells
    ]


def _cell_interval(boot: Bootstrap | None, cell: Cell) -> Interval | None:
    """The bootstrap interval of a score cell's accuracy difference to baseline; None for the baseline."""
    if boot is None or cell.score is None:
        return None
    return boot.cells.get((cell.score, float(cell.fraction_zeroed)))


def _delta_interval(boot: Bootstrap, cell: Cell) -> str:
    iv = _cell_interval(boot, cell)
    return "–" if iv is None else f"[{100 * iv.low:+.1f}, {100 * iv.high:+.1f}]"


_CSV_HEADER = [
    "model", "task", "shots", "limit", "calibration", "score", "target", "threshold", "fraction_zeroed",
    "accuracy", "delta", "delta_low", "delta_high", "acc_norm", "n_items",
]  # fmt: skip


def _cells_csv(runs: Sequence[RunData], boots: Sequence[Bootstrap | None]) -> str:
    """Every shown cell of every run, one CSV row each: fractions as fractions (not %), ``delta`` = accuracy minus
    the run's baseline with its bootstrap interval where the run has one; empty fields where a value does not apply."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(_CSV_HEADER)

    def num(value: Any) -> str:
        return "" if value is None else f"{value:.6g}"

    for run, boot in zip(runs, boots, strict=True):
        cfg, label = run.settings, calibration_label(run)
        for c in _sorted_cells(run):
            iv = _cell_interval(boot, c)
            writer.writerow(
                [
                    run.name, cfg.get("task"), cfg.get("shots"), cfg.get("limit"), label, c.score or "baseline",
                    num(c.target), num(c.threshold), num(c.fraction_zeroed), num(c.accuracy),
                    num(c.accuracy - run.baseline), num(iv and iv.low), num(iv and iv.high),
                    num(c.acc_norm), c.n_items,
                ]
            )  # fmt: skip
    return out.getvalue()


def _pairwise_w1(runs: Sequence[RunData]) -> tuple[list[str], list[list[str]]] | None:
    with_scores = [(r.name, r.scores) for r in runs if r.scores is not None]
    if len(with_scores) < 2:
        return None
    pairs = [(a, b) for i, a in enumerate(with_scores) for b in with_scores[i + 1 :]]
    names, tables = shared_wasserstein([(a[1], b[1]) for a, b in pairs])
    header = ["score", *(f"{a[0]} vs {b[0]}" for a, b in pairs)]
    return header, [[n, *(f"{t[n]:.4g}" for t in tables)] for n in names]


def write_report(run_dirs: Iterable[str | Path], out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``report.md`` (PNG figures next to it), a self-contained ``report.html`` and ``cells.csv`` (every cell,
    a row each) into ``out_dir``."""
    runs = [load_run(d) for d in run_dirs]
    if not runs:
        raise InactiveHeadsError("no run directories given")
    out_dir = Path(out_dir)
    doc = Document()
    doc.h(1, "Inactive heads report")
    doc.p(_TABLE2_NOTE)
    all_rows = [run.table2() for run in runs]
    for i, (run, rows) in enumerate(zip(runs, all_rows, strict=True)):
        doc.h(2, f"{run.name} — {run.run.get('task')}")
        _run_section(doc, run, rows, f"{i}_{slug(run.name)}")

    _cascade_section(doc, runs)
    doc.h(2, "Ranks across models")
    _ranks_section(doc, [f"{i}: {r.name}" for i, r in enumerate(runs)], all_rows, "ranks.png")

    cdf = cdf_figure(runs)
    if cdf is not None:
        doc.h(2, "Score distributions")
        doc.img(png(cdf), "score_cdfs.png", "score CDFs")
    w1 = _pairwise_w1(runs)
    if w1 is not None:
        doc.h(2, "Wasserstein-1 distance between score distributions")
        doc.p("Pooled raw scores; raw norms depend on the model's scale, the LN variants are comparable across models.")
        doc.table(*w1)

    return _write(doc, out_dir, "Inactive heads report", crossings_csv(_cells_csv(runs, [None] * len(runs)), runs))


def _write(doc: Document, out_dir: Path, title: str, cells_csv: str) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    # A report written over an earlier one would otherwise leave the earlier one's figures it no longer links; only
    # files that report linked are removed, and only once the new report is complete.
    linked = linked_images(md_path.read_text()) if md_path.exists() else set()
    for filename, data in doc.images.items():
        atomic_write_bytes(out_dir / filename, data)
    atomic_write_text(out_dir / "cells.csv", cells_csv)
    atomic_write_text(md_path, doc.markdown())
    atomic_write_text(html_path, doc.html(title))
    for filename in linked - doc.images.keys():
        (out_dir / filename).unlink(missing_ok=True)
    return md_path, html_path


def _run_section(
    doc: Document, run: RunData, rows: list[Table2Row], tag: str, boot: Bootstrap | None = None, seed: int = 0
) -> None:
    """One run: its settings, its Table 2, its cells' fitted crossings compared pairwise (bootstrap ``seed``), the
    curves, the zeroed-heads map of its best cell, and every cell."""
    cfg = run.settings
    doc.p(
        f"shots {cfg.get('shots')}, limit {cfg.get('limit')}, seed {cfg.get('seed')}, "
        f"{cfg.get('n_layers')} layers × {cfg.get('n_heads')} heads, package {cfg.get('package_version')}; "
        f"baseline accuracy {100 * run.baseline:.2f}%."
    )
    searched = crossings_section(doc, run, tag)
    if not run.score_names:  # a run may so far hold only its baseline (and searches): no curve to measure or draw
        if not searched:
            doc.p("Only the baseline is stored so far.")
        return
    doc.table(["score", "label", "max % zeroed within 1 pt", "AUC", "rank"], _table2_rows(rows))
    if run.baseline <= 0:
        doc.p(NO_AUC)
    grid_comparisons_section(doc, run, seed=seed)
    flat = scores_flat_within_layers(run)
    if flat:
        doc.p(
            f"{', '.join(score_label(n) for n in flat)}: one value for every head of a layer on every calibration "
            "row (the heads of a layer share their value vectors when it has one KV head), so a threshold zeroes "
            "all of a layer's heads or none; an LN variant is exactly 1 everywhere and zeroes none."
        )
    doc.img(png(curves_figure(run)), f"curves_{tag}.png", f"accuracy vs % zeroed, {run.name}")
    if boot is not None:
        doc.img(png(delta_figure(run, boot.cells)), f"deltas_{tag}.png", f"accuracy − baseline, {run.name}")
    best = _best_cell(run, rows)
    if best is not None:
        doc.img(png(head_heatmap(run, *best)), f"heads_{tag}.png", f"zeroed heads, {run.name}")
        doc.p(
            "Heads zeroed on nearly every row are candidates for removal: `inactive-heads prune --run-dir` ranks "
            "heads by these frequencies (`ih.static_mask`) and removes them from the model."
        )
    ci = [] if boot is None else [f"Δ {100 * boot.level:g}% interval"]
    doc.p("Every cell of the sweep (accuracy and Δ in points; mean log-likelihood of the correct choice):")
    doc.table(
        ["score", "target", "threshold", "% zeroed", "accuracy", "Δ", *ci, "mean ll correct", "s"],
        _cell_rows(run, boot),
    )


def _cascade_section(doc: Document, runs: Sequence[RunData]) -> None:
    """Per model and generative task, the cascade of zeroing while decoding, every generation mode together."""
    groups: dict[tuple[str, str], list[RunData]] = {}
    for run in runs:
        groups.setdefault((run.name, str(run.run.get("task"))), []).append(run)
    tables = [(key, t) for key, group in groups.items() if (t := cascade_table(group)) is not None]
    if not tables:
        return
    doc.h(2, "Generation: the cascade of zeroing while decoding")
    doc.p(
        "Exact match (strict-match) per generation mode and cell; % identical: items whose generated tokens equal "
        "the unintervened run's; first divergence: the first generated token that differs, over the other items; "
        "tokens/s against the same mode's unintervened generation; % steps flipped (recompute): the decoding steps "
        "at which some layer's decision for the row changed, each of which re-runs the row's sequence; prompt "
        "mode's KV cache: the share of its bytes each row never reads after the prompt, and the share cut from the "
        "cache (the same, less one pair kept in a layer that no row reads). Intervals: 95% percentile intervals of "
        f"a bootstrap over items, paired with the unintervened run ({DEFAULT_RESAMPLES:,} resamples, seed 0)."
    )
    for (name, task), table in tables:
        doc.h(3, f"{name} — {task}")
        doc.table(*table)
        agreement = mode_agreement_table(groups[(name, task)])
        if agreement is not None:
            doc.p(
                "Against recompute (the paper's protocol, every decision on the whole sequence): the share of items "
                "each other mode generates the same tokens for, and its exact match minus recompute's, per cell."
            )
            doc.table(*agreement)


def _ranks_section(
    doc: Document,
    models: list[str],
    all_rows: list[list[Table2Row]],
    filename: str,
    boots: Sequence[Bootstrap | None] = (),
) -> None:
    """The rank heatmap of ``models`` (one Table 2 each, with bootstrap intervals where given) and, for two or
    more, their pairwise rank agreement."""
    names = [n for n in SCORE_FUNCTIONS if any(r.score == n for rows in all_rows for r in rows)]
    ranks = [{r.score: r.rank for r in rows} for rows in all_rows]
    intervals = [
        {} if b is None else {n: (iv.low, iv.high) for n, iv in b.rank.items()} for b in (boots or [None] * len(models))
    ]
    if names:
        doc.img(png(rank_heatmap(names, models, ranks, intervals)), filename, "rank heatmap")
    if len(models) >= 2:
        agree = []
        for i in range(len(models)):
            for j in range(i + 1, len(models)):
                shared = len(set(ranks[i]) & set(ranks[j]))
                # Over 2 scores Spearman is always +-1, and with 5 or fewer every shared score is in both top-5s.
                rho = f"{spearman(ranks[i], ranks[j]):.3f}" if shared >= 3 else "–"
                iou = f"{top_k_iou(ranks[i], ranks[j]):.3f}" if shared > 5 else "–"
                agree.append([f"{models[i]} vs {models[j]}", str(shared), rho, iou])
        doc.p("Rank agreement over the scores both models rank (Spearman from 3 of them, top-5 IoU from 6):")
        doc.table(["models", "shared scores", "Spearman", "top-5 IoU"], agree)


def write_study_report(
    runs: Sequence[tuple[str | Path, Iterable[str] | None]],
    out_dir: str | Path,
    *,
    title: str = "Study report",
    pairs: Sequence[tuple[str, str]] = (),
    series: Sequence[tuple[str, Sequence[str]]] = (),
    n_resamples: int = 1000,
    seed: int = 0,
) -> tuple[Path, Path]:
    """One report over the run directories of a study: ``report.md`` (PNGs beside it), ``report.html`` and
    ``cells.csv`` (every shown cell, a row each, with its bootstrap interval).

    ``runs``: (run directory, keys of the cells to show; None: all of the run's). Per task (with its shots and
    limit): Table 2 across models, the rank heatmap and rank agreement, the score CDFs and pairwise W1, then each
    model's section as in :func:`write_report`. ``pairs`` (base, other) and ``series`` (name, models in order)
    name models whose score distributions are compared on each task: a pair by W1 per relative depth
    (:func:`~inactive_heads.report.compare.score_distances`), a series by W1 of each model to the first
    (:func:`~inactive_heads.report.compare.series_distances`). Intervals are from a paired bootstrap over items
    (``n_resamples``, ``seed``; :mod:`~inactive_heads.stats.bootstrap`); then the overlap of the heads score functions
    flag, the thresholds of each task side by side, and one task's cells under different calibrations.
    """
    planned = [None if keys is None else list(keys) for _, keys in runs]
    # A study's run directory may also hold cells of an earlier version of the study: show only the current ones.
    loaded = [load_run(d, keys) for (d, _), keys in zip(runs, planned, strict=True)]
    if not loaded:
        raise InactiveHeadsError("no run directories given")
    # Runs still being computed: their values and ranks cover only the cells stored so far.
    partial = {id(r): len(k) for r, k in zip(loaded, planned, strict=True) if k is not None and len(r.cells) < len(k)}
    tasks: dict[str, list[RunData]] = {}
    for run in loaded:
        tasks.setdefault(_task_label(run), []).append(run)
    doc = Document()
    doc.h(1, title)
    n_models = len(dict.fromkeys(r.name for r in loaded))
    doc.p(f"{n_models} models × {len(tasks)} tasks, {sum(len(r.cells) for r in loaded)} cells. {_TABLE2_NOTE}")
    if partial:
        doc.p(
            "Runs still being computed: "
            + ", ".join(
                f"{r.name} ({_task_label(r)}: {len(r.cells)} of {partial[id(r)]} cells)"
                for r in loaded
                if id(r) in partial
            )
            + ". Their Table-2 values, ranks and intervals cover only the cells stored so far."
        )
    unscored = [f"{r.name} ({_task_label(r)})" for r in loaded if r.scores is None]
    if unscored:
        doc.p(
            f"No calibration scores are stored for {', '.join(unscored)}: the score CDFs, distances, overlap and "
            "thresholds leave these runs out. The study command records them again (not with --report-only)."
        )
    boots = {id(r): run_bootstrap(r, n_resamples, seed) for r in loaded}
    if any(b is not None for b in boots.values()):
        doc.p(
            f"Intervals in brackets: 95% paired bootstrap over items ({n_resamples} resamples, seed {seed}); the "
            "same resample of items is applied to every cell of a run, so an interval of a difference reflects the "
            "items on which the cells differ. The fraction of heads zeroed is kept as measured."
        )
    for t, (label, task_runs) in enumerate(tasks.items()):
        all_rows = [run.table2() for run in task_runs]
        task_boots = [boots[id(r)] for r in task_runs]
        doc.h(2, label)
        doc.p("Baseline accuracy: " + ", ".join(f"{r.name} {100 * r.baseline:.2f}%" for r in task_runs) + ".")
        crossings_across(doc, task_runs)
        if any(r.score_names for r in task_runs):  # runs that only search have no grid to tabulate
            doc.p("Table 2: max % of heads zeroed within 1 pt of baseline [interval] (rank [interval]) per model.")
            doc.table(*_table2_across(task_runs, all_rows, task_boots))
            _ranks_section(doc, [r.name for r in task_runs], all_rows, f"ranks_{t}.png", task_boots)
        cdf = cdf_figure(task_runs)
        if cdf is not None:
            doc.img(png(cdf), f"score_cdfs_{t}.png", f"score CDFs, {label}")
        w1 = _pairwise_w1(task_runs)
        if w1 is not None:
            doc.p("Wasserstein-1 distance between pooled raw calibration scores (LN variants compare across models):")
            doc.table(*w1)
        for run, rows in zip(task_runs, all_rows, strict=True):
            doc.h(3, f"{run.name} — {label}")
            if id(run) in partial:
                doc.p(f"{len(run.cells)} of {partial[id(run)]} planned cells stored so far: this run is incomplete.")
            _run_section(doc, run, rows, f"{t}_{slug(run.name)}", boots[id(run)], seed)

    _cascade_section(doc, loaded)
    _overlap_section(doc, loaded, n_resamples, seed)
    _threshold_section(doc, loaded, n_resamples, seed)
    _protocol_section(doc, loaded, boots)

    # Distributions compare calibration scores: runs without them are left out (the note at the top names them).
    by_name = {(r.name, label): r for label, task_runs in tasks.items() for r in task_runs if r.scores is not None}
    studied = list(dict.fromkeys(n for r in loaded for n in analysed_scores(r)))
    w1_note = (
        f"W1 intervals: 95% bootstrap over calibration items ({n_resamples} resamples, seed {seed}); every score of "
        "a drawn item counts as often as the item is drawn, and two models calibrated on the same items are "
        "resampled together. Distances near zero read against the interval's width: W1 cannot be negative, so its "
        "bootstrap leans upward there."
    )
    shown_pairs = [
        (t, label, a, b)
        for a, b in pairs
        for t, label in enumerate(tasks)
        if (a, label) in by_name and (b, label) in by_name
    ]
    if shown_pairs:
        doc.h(2, "Model pairs: score distributions")
        doc.p(w1_note)
        for t, label, a, b in shown_pairs:
            doc.h(3, f"{a} vs {b} — {label}")
            header, table, fig = score_distances(by_name[a, label], by_name[b, label], studied, n_resamples, seed)
            doc.table(header, table)
            doc.img(png(fig), f"pair_{t}_{slug(a)}_vs_{slug(b)}.png", f"{a} vs {b}, W1 per depth")
    shown_series = [
        (t, label, name, present)
        for name, members in series
        for t, label in enumerate(tasks)
        if len(present := [by_name[m, label] for m in members if (m, label) in by_name]) >= 2
    ]
    if shown_series:
        doc.h(2, "Model series: score distributions")
        if not shown_pairs:
            doc.p(w1_note)
        for t, label, name, present in shown_series:
            doc.h(3, f"{name} — {label}")
            header, table, fig = series_distances(present, name, studied, n_resamples, seed)
            doc.table(header, table)
            doc.img(png(fig), f"series_{t}_{slug(name)}.png", f"{name}: W1 to {present[0].name}")
            cdf = cdf_figure(present)
            if cdf is not None:
                doc.img(png(cdf), f"series_{t}_{slug(name)}_cdfs.png", f"{name}: score CDFs")
    cells_csv = _cells_csv(loaded, [boots[id(r)] for r in loaded])
    return _write(doc, Path(out_dir), title, crossings_csv(cells_csv, loaded))


def _task_label(run: RunData) -> str:
    cfg = run.settings
    limit = "all items" if cfg.get("limit") is None else f"{cfg.get('limit')} items"
    return f"{cfg.get('task')} ({cfg.get('shots')}-shot, {limit}; {calibration_label(run)})"


def _calibrations(runs: Sequence[RunData]) -> dict[tuple[Any, ...], RunData]:
    """One run per distinct calibration (model, calibration task and items, their fingerprint)."""
    out: dict[tuple[Any, ...], RunData] = {}
    for r in runs:
        m = r.calibration_meta
        out.setdefault((r.name, m.get("task"), m.get("items"), m.get("task_items"), m.get("limit")), r)
    return out


def _overlap_section(doc: Document, runs: Sequence[RunData], n_resamples: int, seed: int) -> None:
    shown = False
    for n, run in enumerate(_calibrations(runs).values()):
        overlaps = run_overlaps(run, analysis_targets(run), n_resamples, seed)
        if not overlaps:
            continue
        if not shown:
            doc.h(2, "Overlap between score functions")
            doc.p(
                "Which (row, layer, head) each score function flags at a target fraction, from the calibration "
                "scores (no extra forward pass): IoU of two functions' sets, and precision = the share of one "
                "function's flagged heads that the other flags too. Intervals in brackets: 95% bootstrap over the "
                f"calibration's items ({n_resamples} resamples, seed {seed}), thresholds kept as calibrated; the "
                "max pair is the one of the point estimate."
            )
            shown = True
        m = run.calibration_meta
        what = f"{run.name} — calibration on {m.get('task')} ({m.get('rows')} rows, {m.get('items', 'same')} items)"
        doc.h(3, what)
        doc.table(*overlap_table(overlaps))
        doc.img(png(overlap_figure(overlaps, run.name)), f"overlap_{n}_{slug(run.name)}.png", f"overlap, {what}")


def _threshold_section(doc: Document, runs: Sequence[RunData], n_resamples: int, seed: int) -> None:
    groups = threshold_groups(runs)
    tables = [(key, t) for key, group in groups.items() if (t := threshold_table(group, n_resamples, seed)) is not None]
    if not tables:
        return
    doc.h(2, "Threshold stability across tasks")
    doc.p(
        "The threshold each task's calibration gives for the same score and target. A stable score function has "
        "a small spread, so a threshold found on one task would serve another. The spread's interval: 95% "
        f"bootstrap ({n_resamples} resamples, seed {seed}) of each task's calibration items, drawn independently, "
        "thresholds taken again from each resample. A spread cannot fall below 0 and two resampled thresholds "
        "rarely coincide, so a spread near 0 can lie just below its interval: read such an interval as an upper "
        "bound on the spread."
    )
    for (model, items), table in tables:
        doc.h(3, f"{model} — {'held-out' if items == 'heldout' else 'same-items'} calibrations")
        doc.table(*table)


def _protocol_section(doc: Document, runs: Sequence[RunData], boots: dict[int, Bootstrap | None]) -> None:
    groups: dict[tuple[str, Any, Any, Any], list[RunData]] = {}
    for r in runs:
        cfg = r.settings
        groups.setdefault((r.name, cfg.get("task"), cfg.get("shots"), cfg.get("limit")), []).append(r)
    tables = [(key, t) for key, group in groups.items() if (t := protocol_table([(r, boots[id(r)]) for r in group]))]
    if not tables:
        return
    doc.h(2, "Calibration protocols")
    doc.p(
        "One model and task, its thresholds calibrated in different ways: accuracy change to baseline in points "
        "[interval] at the % of heads actually zeroed. The paper calibrates on the evaluated items themselves; a "
        "held-out calibration uses other items of the task; a transfer uses another task's calibration. The last "
        "columns: one calibration's accuracy minus the other's, in points [paired 95% bootstrap interval over the "
        "evaluated items]."
    )
    for (model, task, _, _), table in tables:
        doc.h(3, f"{model} — {task}")
        doc.table(*table)


def _table2_across(
    runs: Sequence[RunData], all_rows: list[list[Table2Row]], boots: Sequence[Bootstrap | None] = ()
) -> tuple[list[str], list[list[str]]]:
    """One row per score function, one column per model: max % zeroed within 1 pt and its rank (with bootstrap
    intervals where given); mean rank."""
    boots = list(boots) or [None] * len(runs)
    per_model = [{r.score: r for r in rows} for rows in all_rows]
    names = [n for n in SCORE_FUNCTIONS if any(n in m for m in per_model)]
    names += sorted({n for m in per_model for n in m} - set(names))
    rows = []
    for n in names:
        found = [m.get(n) for m in per_model]
        ranks = [r.rank for r in found if r is not None]
        shown = [_table2_cell(r, b, n) for r, b in zip(found, boots, strict=True)]
        rows.append([n, score_label(n), *shown, f"{np.mean(ranks):.2f}" if ranks else "–"])
    return ["score", "label", *(r.name for r in runs), "mean rank"], rows


def _table2_cell(row: Table2Row | None, boot: Bootstrap | None, name: str) -> str:
    if row is None:
        return "–"
    if boot is None or name not in boot.max_zeroed:
        return f"{max_zeroed_text(row)} ({row.rank:g})"
    rank = boot.rank[name]
    return f"{max_zeroed_text(row, boot.max_zeroed[name])} ({row.rank:g} [{rank.low:g}–{rank.high:g}])"
