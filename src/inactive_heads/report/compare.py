"""Runs side by side: distances between their calibration score distributions, as tables and figures."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_write_bytes
from ..errors import InactiveHeadsError
from ..runs.directory import RunData, load_run, score_label, slug
from ..stats.bootstrap import DEFAULT_RESAMPLES, Interval, bootstrap_wasserstein
from ..stats.distances import depth_bins, shared_wasserstein, wasserstein_table
from .document import render_table
from .figures import figure, png
from .tables import interval_text

__all__ = ["compare_runs", "depth_w1_intervals", "score_distances", "series_distances", "w1_interval"]


def _same_items(a: RunData, b: RunData) -> bool:
    keys = ("task", "task_items", "n_items")
    ma, mb = a.calibration_meta, b.calibration_meta
    return all(ma.get(k) is not None and ma.get(k) == mb.get(k) for k in keys)


def _bootstrap_inputs(
    a: RunData, b: RunData, name: str, n_resamples: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool] | None:
    """Scores and row items of both runs, and whether they hold the same items; None when either lacks them."""
    if n_resamples < 1 or a.scores is None or b.scores is None or a.row_items is None or b.row_items is None:
        return None
    return a.scores[name].numpy(), a.row_items, b.scores[name].numpy(), b.row_items, _same_items(a, b)


def w1_interval(
    a: RunData, b: RunData, name: str, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> Interval | None:
    """Pooled W1 between two runs' calibration scores ``name`` with its 95% bootstrap interval over items
    (:func:`~inactive_heads.stats.bootstrap.bootstrap_wasserstein`; paired when both calibrated on the same items).
    None when a calibration did not record the item of each row, or ``n_resamples`` is 0."""
    inputs = _bootstrap_inputs(a, b, name, n_resamples)
    if inputs is None:
        return None
    sa, ia, sb, ib, paired = inputs
    return bootstrap_wasserstein(sa, ia, sb, ib, paired=paired, n_resamples=n_resamples, seed=seed)


def depth_w1_intervals(
    a: RunData, b: RunData, name: str, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> list[Interval] | None:
    """W1 per relative-depth bin (:func:`~inactive_heads.stats.distances.depth_bins`, as in the per-depth
    :func:`~inactive_heads.stats.distances.wasserstein_table`) with 95% bootstrap intervals over items, resampled as in
    :func:`w1_interval`; every bin sees the same resamples of items. None where :func:`w1_interval` gives None."""
    inputs = _bootstrap_inputs(a, b, name, n_resamples)
    if inputs is None:
        return None
    sa, ia, sb, ib, paired = inputs
    return [
        bootstrap_wasserstein(sa[:, la], ia, sb[:, lb], ib, paired=paired, n_resamples=n_resamples, seed=seed)
        for la, lb in depth_bins(sa.shape[1], sb.shape[1])
    ]


def _w1_text(distance: float, iv: Interval | None) -> str:
    return f"{distance:.4g}" if iv is None else interval_text(iv, scale=1.0, fmt=".4g")


def compare_runs(
    run_a: str | Path | RunData,
    run_b: str | Path | RunData,
    out_dir: str | Path | None = None,
    names: Sequence[str] | None = None,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[str, Path]:
    """Distribution distances between two runs' calibration scores: a Markdown table and a figure.

    Per score function (``names``, default: all recorded in both): pooled W1 with its bootstrap interval
    (:func:`w1_interval`; ``n_resamples=0``: none) and W1 per layer (per relative-depth bin when layer counts
    differ, see :func:`inactive_heads.stats.distances.wasserstein_table`) with intervals (:func:`depth_w1_intervals`).
    The figure (W1 vs relative depth, one line and band per score) goes to ``out_dir`` (default: the working
    directory; run directories are only read) as ``compare_<a>_vs_<b>.png``.
    """
    a = run_a if isinstance(run_a, RunData) else load_run(run_a)
    b = run_b if isinstance(run_b, RunData) else load_run(run_b)
    if a.scores is not None and b.scores is not None and names is not None:
        missing = [n for n in names if n not in a.scores or n not in b.scores]
        if missing:
            shared = [n for n in a.scores if n in b.scores]
            raise InactiveHeadsError(f"scores {missing} are not recorded in both runs; both have: {', '.join(shared)}")
    header, rows, fig = score_distances(a, b, names, n_resamples, seed)
    text = f"W1 between calibration scores of {a.name} and {b.name}\n\n" + render_table(header, rows) + "\n"
    path = Path(out_dir) if out_dir is not None else Path.cwd()
    fig_path = path / f"compare_{slug(a.name)}_vs_{slug(b.name)}.png"
    atomic_write_bytes(fig_path, png(fig))
    return text, fig_path


def score_distances(
    a: RunData, b: RunData, names: Sequence[str] | None = None, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> tuple[list[str], list[list[str]], Any]:
    """Per score function (``names``, default: all recorded in both), W1 between two runs' calibration scores
    (pooled, with its bootstrap interval where :func:`w1_interval` gives one; mean and max over relative-depth bins,
    the max with its bin's interval from :func:`depth_w1_intervals`), as a table (header, rows), and the figure of
    W1 against relative depth with the bins' intervals as bands."""
    if a.scores is None or b.scores is None:
        raise InactiveHeadsError("both runs need calibration/scores.safetensors")
    pooled = wasserstein_table(a.scores, b.scores, names=names)
    ivs = {n: w1_interval(a, b, n, n_resamples, seed) for n in pooled}
    depth_ivs = {n: depth_w1_intervals(a, b, n, n_resamples, seed) for n in pooled}
    # The intervals carry each bin's W1: compute it anew only where there are none.
    bare = [n for n, bins in depth_ivs.items() if bins is None]
    per = wasserstein_table(a.scores, b.scores, per_layer=True, names=bare) if bare else {}
    per.update({n: [iv.value for iv in bins] for n, bins in depth_ivs.items() if bins is not None})
    ci = " [95% CI]" if any(iv is not None for iv in ivs.values()) else ""
    header = ["score", f"W1 pooled{ci}", "W1 per depth (mean)", f"W1 per depth (max){ci}"]
    rows = []
    for n, d in pooled.items():
        top = int(np.argmax(per[n]))
        bins = depth_ivs[n]
        rows.append(
            [
                n,
                _w1_text(d, ivs[n]),
                f"{np.mean(per[n]):.4g}",
                _w1_text(per[n][top], None if bins is None else bins[top]),
            ]
        )
    fig = figure(7, 4.2)
    ax = fig.add_subplot()
    for n in pooled:
        vals = per[n]
        depth = (np.arange(len(vals)) + 0.5) / len(vals)
        color = "black" if n == "random" else None
        (line,) = ax.plot(depth, vals, marker="o", ms=3, lw=1.2, color=color, label=score_label(n))
        bins = depth_ivs[n]
        if bins is not None:
            lo, hi = [iv.low for iv in bins], [iv.high for iv in bins]
            ax.fill_between(depth, lo, hi, color=line.get_color(), alpha=0.12, lw=0)
    ax.set_xlabel("relative depth")
    ax.set_ylabel("W1 distance" + (" (band: 95% CI)" if ci else ""))
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_title(f"{a.name} vs {b.name}\nper-depth score distance", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return header, rows, fig


def series_distances(
    runs: Sequence[RunData],
    title: str,
    names: Sequence[str] | None = None,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[list[str], list[list[str]], Any]:
    """Along a series of models (e.g. one family at growing scale): pooled W1 between each run's calibration scores
    and the first run's, per score function (``names``, default: all recorded in every run), with bootstrap
    intervals as in :func:`score_distances`, as a table and a figure (one line per score along the series, intervals
    as error bars)."""
    scores = [r.scores for r in runs if r.scores is not None]
    if len(runs) < 2 or len(scores) < len(runs):
        raise InactiveHeadsError("a series needs two or more runs, each with calibration/scores.safetensors")
    first = runs[0]
    names, tables = shared_wasserstein([(scores[0], s) for s in scores[1:]], names)
    ivs = {(n, i): w1_interval(first, r, n, n_resamples, seed) for n in names for i, r in enumerate(runs[1:])}
    ci = " [95% CI]" if any(iv is not None for iv in ivs.values()) else ""
    header = ["score", *(f"{first.name} → {r.name}{ci}" for r in runs[1:])]
    rows = [[n, *(_w1_text(t[n], ivs[n, i]) for i, t in enumerate(tables))] for n in names]
    fig = figure(1.5 + 1.4 * len(runs), 4.2)
    ax = fig.add_subplot()
    xs = list(range(len(runs)))
    for n in names:
        ys = [0.0, *(t[n] for t in tables)]
        color = "black" if n == "random" else None
        (line,) = ax.plot(xs, ys, marker="o", ms=3, lw=1.2, color=color, label=score_label(n))
        # A W1 bootstrap leans upward, so an interval need not contain its point: draw the span, not +- errors.
        spans = [(i + 1, iv.low, iv.high) for i in range(len(tables)) if (iv := ivs[n, i]) is not None]
        if spans:
            ax.vlines(*zip(*spans, strict=True), color=line.get_color(), lw=2.5, alpha=0.5)
    ax.set_xticks(xs, [r.name for r in runs], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(f"W1 to {first.name}")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_title(f"{title}\ndistance of each model's score distribution to the first", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return header, rows, fig
