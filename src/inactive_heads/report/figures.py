"""Figures of runs: accuracy curves, rank heatmap, score CDFs, zeroed-head heatmap, and PNG encoding.

Figures are drawn with matplotlib's Agg canvas directly (no pyplot), so the global backend is never touched.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InactiveHeadsError
from ..runs.adaptive import Search
from ..runs.directory import Cell, RunData, score_label
from ..scores import SCORE_FUNCTIONS
from ..stats.bootstrap import Interval
from ..stats.crossing import fitted_curve, format_crossing
from ..stats.curves import TABLE2_TOLERANCE
from ..stats.overlap import Overlap

__all__ = [
    "cdf_figure",
    "crossing_figure",
    "curves_figure",
    "delta_figure",
    "figure",
    "head_heatmap",
    "overlap_figure",
    "png",
    "rank_heatmap",
]

_MAX_CDF_POINTS = 2000  # quantiles drawn per CDF; enough for a smooth line, small PNGs


def figure(width: float, height: float) -> Any:
    """A new matplotlib Figure (inches, 100 dpi), not registered with pyplot."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)


def png(fig: Any) -> bytes:
    """``fig`` as a 256-colour PNG (tight bounding box, no software stamp: the same figure gives the same bytes)."""
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", metadata={"Software": None})
    # Plots hold few distinct colours: a palette keeps them and makes reports ~3x smaller than true-colour PNGs.
    image = Image.open(buf).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    image.save(out, format="png", optimize=True)
    return out.getvalue()


def curves_figure(run: RunData) -> Any:
    """Accuracy vs % of heads zeroed, one line per score function, with the baseline and the tolerance line."""
    import matplotlib

    fig = figure(7.5, 4.8)
    ax = fig.add_subplot()
    base = run.baseline
    colors = matplotlib.colormaps["tab20"]
    for i, (name, c) in enumerate(run.curves().items()):
        xs = [100 * x for x in c.fractions]
        ys = [100 * a for a in c.accuracies]
        if name == "random":
            ax.plot(xs, ys, color="black", lw=2, marker="o", ms=3, label=c.label, zorder=5)
        else:
            ax.plot(xs, ys, color=colors(i % 20), lw=1.3, marker="o", ms=3, label=c.label)
    ax.axhline(100 * base, color="grey", ls="--", lw=1, label="baseline")
    ax.axhline(100 * (base - TABLE2_TOLERANCE), color="grey", ls=":", lw=1, label="baseline − 1 pt")
    ax.set_xlabel("% of heads zeroed (measured)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"{run.name} — {run.run.get('task', '')}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="lower left")
    return fig


def delta_figure(run: RunData, cells: Mapping[tuple[str, float], Interval]) -> Any:
    """Accuracy minus baseline against % of heads zeroed, one panel per score function, each cell's paired
    bootstrap interval (``cells[(score, fraction zeroed)]``, :class:`~inactive_heads.stats.bootstrap.Bootstrap`) as a
    band; random's points in grey on every panel, and the one-point tolerance line."""
    curves = run.curves()
    if not curves:
        raise InactiveHeadsError(f"{run.name} has no cells of a score function to draw")
    cols = min(3, len(curves))
    rows = math.ceil(len(curves) / cols)
    fig = figure(3.2 * cols, 2.4 * rows + 0.4)
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).ravel()

    def points(name: str) -> tuple[list[float], list[float], list[float], list[float]]:
        xs, ys, lo, hi = [0.0], [0.0], [0.0], [0.0]
        for c in curves[name].extra["cells"]:
            frac = float(c.fraction_zeroed)
            iv = cells.get((name, frac))
            if iv is not None:
                xs.append(100 * frac)
                ys.append(100 * iv.value)
                lo.append(100 * iv.low)
                hi.append(100 * iv.high)
        return xs, ys, lo, hi

    reference = points("random") if "random" in curves else None
    for ax, name in zip(axes, curves, strict=False):
        xs, ys, lo, hi = points(name)
        if reference is not None and name != "random":
            ax.plot(reference[0], reference[1], color="grey", lw=1, marker=".", ms=3, label="random")
        ax.fill_between(xs, lo, hi, color="tab:blue", alpha=0.2, lw=0, label="95% interval")
        ax.plot(xs, ys, color="black" if name == "random" else "tab:blue", lw=1.3, marker="o", ms=3)
        ax.axhline(-100 * TABLE2_TOLERANCE, color="grey", ls=":", lw=1)
        ax.axhline(0, color="grey", ls="--", lw=0.8)
        ax.set_title(score_label(name), fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in axes[len(curves) :]:
        ax.set_visible(False)
    axes[0].legend(fontsize=6, loc="lower left")
    fig.supxlabel("% of heads zeroed (measured)", fontsize=9)
    fig.supylabel("accuracy − baseline (points)", fontsize=9)
    fig.suptitle(f"{run.name} — {run.run.get('task', '')}: paired bootstrap intervals", fontsize=10)
    return fig


def rank_heatmap(
    names: list[str],
    models: list[str],
    ranks: list[dict[str, float]],
    intervals: Sequence[dict[str, tuple[float, float]]] = (),
) -> Any:
    """Rank of each score function (rows) per model (columns); ``intervals`` (per model, score -> (low, high))
    are written beneath each rank."""
    mat = np.array([[r.get(n, np.nan) for r in ranks] for n in names], dtype=float)
    spans = list(intervals) or [{} for _ in models]
    fig = figure(1.6 + 1.3 * len(models), 0.9 + (0.42 if any(spans) else 0.32) * len(names))
    ax = fig.add_subplot()
    im = ax.imshow(mat, cmap="viridis_r", aspect="auto")
    ax.set_yticks(range(len(names)), [score_label(n) for n in names], fontsize=8)
    ax.set_xticks(range(len(models)), models, rotation=30, ha="right", fontsize=8)
    for i in range(mat.shape[0]):
        for j in range(mat.shape[1]):
            if not math.isnan(mat[i, j]):
                # viridis_r is bright at low ranks: dark text there, light text on the dark end.
                dark = mat[i, j] <= np.nanmean(mat)
                span = spans[j].get(names[i])
                text = f"{mat[i, j]:g}" if span is None else f"{mat[i, j]:g}\n[{span[0]:g}–{span[1]:g}]"
                ax.text(j, i, text, ha="center", va="center", fontsize=6.5, color="black" if dark else "white")
    fig.colorbar(im, ax=ax, label="rank (1 = best)")
    ax.set_title("Rank by max % zeroed within 1 pt" + (" [bootstrap interval]" if any(spans) else ""))
    return fig


def cdf_figure(runs: Sequence[RunData]) -> Any | None:
    """Empirical CDF of each score function's calibration scores, one line per run; None when no run has scores."""
    with_scores = [(r.name, r.scores) for r in runs if r.scores is not None]
    if not with_scores:
        return None
    names = [n for n in SCORE_FUNCTIONS if any(n in s for _, s in with_scores)]
    names += sorted({n for _, s in with_scores for n in s} - set(names))
    cols = 4
    rows = math.ceil(len(names) / cols)
    fig = figure(3.2 * cols, 2.4 * rows)
    u = np.linspace(0, 1, _MAX_CDF_POINTS)
    for k, name in enumerate(names):
        ax = fig.add_subplot(rows, cols, k + 1)
        for run_name, scores in with_scores:
            if name not in scores:
                continue
            v = scores[name].reshape(-1).double().numpy()
            v = v[np.isfinite(v)]
            if v.size:
                ax.plot(np.quantile(v, u), u, lw=1.2, label=run_name)
        ax.set_title(score_label(name), fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if k == 0:
            ax.legend(fontsize=6)
    fig.suptitle("Empirical CDF of calibration scores (pooled over rows × layers × heads)", fontsize=10)
    fig.tight_layout()
    return fig


def head_heatmap(run: RunData, name: str, cell: Cell) -> Any:
    """How often each (layer, head) was zeroed in ``cell`` (its measured ``per_head`` fractions)."""
    freq = np.asarray(cell.per_head, dtype=float)
    fig = figure(1.5 + 0.22 * freq.shape[1], 1.2 + 0.16 * freq.shape[0])
    ax = fig.add_subplot()
    im = ax.imshow(freq, cmap="magma", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(
        f"{run.name}: how often each head is zeroed\n{score_label(name)}, target {cell.target}, "
        f"{100 * cell.fraction_zeroed:.1f}% zeroed",
        fontsize=9,
    )
    fig.colorbar(im, ax=ax, label="fraction of rows zeroed")
    return fig


def overlap_figure(overlaps: Sequence[Overlap], title: str) -> Any:
    """IoU matrices, one panel per target (lower triangle: IoU; upper: precision of the row's function)."""
    k = len(overlaps)
    n = len(overlaps[0].names)
    fig = figure(0.6 + (1.2 + 0.36 * n) * k, 1.4 + 0.36 * n)
    labels = [score_label(x) for x in overlaps[0].names]
    for j, o in enumerate(overlaps):
        ax = fig.add_subplot(1, k, j + 1)
        upper = np.triu(np.ones((n, n), dtype=bool), 1)
        mat = np.where(upper, o.precision, o.iou)
        np.fill_diagonal(mat, np.nan)  # 1 by definition; left blank
        ax.imshow(mat, cmap="Blues", vmin=0, vmax=1)
        for a in range(n):
            for b in range(n):
                if a != b and not np.isnan(mat[a, b]):
                    ax.text(b, a, f"{mat[a, b]:.2f}", ha="center", va="center", fontsize=5.5)
        ax.set_xticks(range(n), labels if j == 0 else [""] * n, rotation=90, fontsize=6)
        ax.set_yticks(range(n), labels if j == 0 else [""] * n, fontsize=6)
        ax.set_title(f"target {o.target:g}", fontsize=8)
    fig.suptitle(f"{title}: IoU (below the diagonal), precision of the row's heads (above)", fontsize=9)
    fig.tight_layout()
    return fig


def crossing_figure(searches: Sequence[Search], title: str) -> Any:
    """Per searched score function (one design): each probe's paired accuracy change with its confidence sequence at
    the last look, the isotonic fit the estimate reads, the tolerance line, and the crossing: its 95% interval as a
    band (hatched and open to the right where its upper end is a bound "> X") and the estimate as a line."""
    cols = min(3, len(searches))
    rows = math.ceil(len(searches) / cols)
    fig = figure(max(3.4 * cols, 5.0), 2.5 * rows + 0.6)
    fig.set_layout_engine("constrained")
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).ravel()
    for ax, s in zip(axes, searches, strict=False):
        c = s.crossing
        probes = [p for p in s.probes if p.items]
        tol = 100 * s.design.tolerance
        ax.axhline(-tol, color="grey", ls=":", lw=1)
        ax.axhline(0, color="grey", ls="--", lw=0.8)
        ax.set_title(f"{score_label(s.score)}: {format_crossing(c, interval=False)}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
        if c.state == "not_applicable" or not probes:
            ax.text(0.5, 0.5, "n/a: zeroes no head", ha="center", va="center", transform=ax.transAxes, fontsize=8)
            continue
        top = 100 * max(p.fraction for p in probes)
        if c.high_censored:
            ax.axvspan(100 * c.low, top, color="tab:orange", alpha=0.15, hatch="//", lw=0, label="95% interval (> X)")
            ax.annotate(
                "", xy=(top + 4, -tol), xytext=(top, -tol), arrowprops={"arrowstyle": "->", "color": "tab:orange"}
            )
        else:
            ax.axvspan(100 * c.low, 100 * c.high, color="tab:orange", alpha=0.25, lw=0, label="95% interval")
        ax.axvline(100 * c.value, color="tab:orange", lw=1.5, ls="-" if c.state == "estimated" else "--")
        xs, fit = fitted_curve([p.fraction for p in probes], [p.mean for p in probes], [p.items for p in probes])
        ax.plot(100 * xs, 100 * fit, color="tab:blue", lw=1.3, label="isotonic fit")
        for p in probes:
            look = p.looks[-1]
            ax.errorbar(
                100 * p.fraction, 100 * p.mean, yerr=[[100 * (p.mean - look.low)], [100 * (look.high - p.mean)]],
                fmt="o", ms=3, lw=0.8, color={"within": "tab:green", "below": "tab:red"}.get(p.decision, "black"),
            )  # fmt: skip
    for ax in axes[len(searches) :]:
        ax.set_visible(False)
    labelled = [ax for ax in axes if ax.get_legend_handles_labels()[1]]
    if labelled:
        labelled[0].legend(fontsize=6, loc="lower left")
    fig.supxlabel("% of heads zeroed (measured)", fontsize=9)
    fig.supylabel("accuracy − baseline (points)", fontsize=9)
    fig.suptitle(f"{title}: probes (green within, red below, black undecided), crossing", fontsize=9)
    return fig
