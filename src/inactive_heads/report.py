"""Run directories and the Markdown + self-contained HTML report over one or more of them.

Run directory layout::

    run.json                        {model: {name, identity}, task, shots, limit, seed, package_version,
                                     n_layers, n_heads}
    calibration/scores.safetensors  HeadScores.save of the calibration pass
    calibration/meta.json
    cells/<key>.json                one finished cell, see CELL_FIELDS; score is null for the baseline;
                                     per_head is [L][H] fractions of rows in which the head was zeroed

Figures are drawn with matplotlib's Agg canvas directly (no pyplot), so the global backend is never touched.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .analysis import Curve, spearman, table2, top_k_iou, wasserstein_table, zero_frequency
from .scores import SCORE_FUNCTIONS, HeadScores
from .store import ResultStore, atomic_write_bytes, atomic_write_text

__all__ = ["CELL_FIELDS", "RUN_FIELDS", "RunData", "compare_runs", "load_run", "write_report"]

RUN_FIELDS = ("model", "task", "shots", "limit", "seed", "package_version", "n_layers", "n_heads")
CELL_FIELDS = (
    "score",
    "target",
    "threshold",
    "inactive_when",
    "accuracy",
    "acc_norm",
    "mean_ll_correct",
    "fraction_zeroed",
    "per_layer",
    "per_head",
    "n_items",
    "seconds",
)
_TOL = 0.01  # one accuracy point: the Table-2 tolerance
_MAX_CDF_POINTS = 2000  # quantiles drawn per CDF; enough for a smooth line, small PNGs


def _label(score: str) -> str:
    spec = SCORE_FUNCTIONS.get(score)
    return spec.label if spec is not None else score


@dataclass
class RunData:
    """One loaded run directory."""

    dir: Path
    run: dict[str, Any]
    cells: list[dict[str, Any]]
    scores: HeadScores | None = None
    calibration_meta: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        model = self.run.get("model") or {}
        return str(model.get("name") or self.dir.name) if isinstance(model, dict) else str(model)

    @property
    def baseline(self) -> float:
        """Accuracy of the baseline cell (``score`` null)."""
        for c in self.cells:
            if c.get("score") is None:
                return float(c["accuracy"])
        raise ValueError(f"run {self.dir} has no baseline cell (score null)")

    @property
    def score_names(self) -> list[str]:
        """Score functions with at least one cell, in registry order (unknown names last, sorted)."""
        present = {c["score"] for c in self.cells if c.get("score") is not None}
        return [n for n in SCORE_FUNCTIONS if n in present] + sorted(present - set(SCORE_FUNCTIONS))

    def curves(self) -> dict[str, Curve]:
        """Accuracy-vs-fraction-zeroed curve per score function (baseline point at 0 unless a p=0 cell exists)."""
        out = {}
        base = self.baseline
        for name in self.score_names:
            cells = sorted((c for c in self.cells if c.get("score") == name), key=lambda c: c["fraction_zeroed"])
            out[name] = Curve(
                name,
                [(float(c["fraction_zeroed"]), float(c["accuracy"])) for c in cells],
                base,
                label=_label(name),
                extra={"cells": cells},
            )
        return out

    def table2(self, tol: float = _TOL) -> list[dict[str, object]]:
        return table2(self.curves().values(), tol)


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory (see the module docstring). Corrupt or partial cells are skipped."""
    run_dir = Path(run_dir)
    run_path = run_dir / "run.json"
    if not run_path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory: no run.json")
    run = json.loads(run_path.read_text(encoding="utf-8"))
    store = ResultStore(run_dir / "cells", required=("score", "accuracy", "fraction_zeroed"))
    cells = [cell for _, cell in store.items()]
    scores_path = run_dir / "calibration" / "scores.safetensors"
    meta_path = run_dir / "calibration" / "meta.json"
    scores = HeadScores.load(scores_path) if scores_path.is_file() else None
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
    return RunData(run_dir, run, cells, scores, meta)


# --- figures -----------------------------------------------------------------------------------------------------


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def _curves_figure(run: RunData) -> Any:
    import matplotlib

    fig = _figure(7.5, 4.8)
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
    ax.axhline(100 * (base - _TOL), color="grey", ls=":", lw=1, label="baseline − 1 pt")
    ax.set_xlabel("% of heads zeroed (measured)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"{run.name} — {run.run.get('task', '')}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="lower left")
    return fig


def _rank_heatmap(names: list[str], models: list[str], ranks: list[dict[str, float]]) -> Any:
    mat = np.array([[r.get(n, np.nan) for r in ranks] for n in names], dtype=float)
    fig = _figure(1.6 + 1.3 * len(models), 0.9 + 0.32 * len(names))
    ax = fig.add_subplot()
    im = ax.imshow(mat, cmap="viridis_r", aspect="auto")
    ax.set_yticks(range(len(names)), [_label(n) for n in names], fontsize=8)
    ax.set_xticks(range(len(models)), models, rotation=30, ha="right", fontsize=8)
    for i in range(mat.shape[0]):
        for j in range(mat.shape[1]):
            if not math.isnan(mat[i, j]):
                # viridis_r is bright at low ranks: dark text there, light text on the dark end.
                dark = mat[i, j] <= np.nanmean(mat)
                ax.text(
                    j, i, f"{mat[i, j]:g}", ha="center", va="center", fontsize=7, color="black" if dark else "white"
                )
    fig.colorbar(im, ax=ax, label="rank (1 = best)")
    ax.set_title("Rank by max % zeroed within 1 pt")
    return fig


def _cdf_figure(runs: Sequence[RunData]) -> Any | None:
    with_scores = [r for r in runs if r.scores is not None]
    if not with_scores:
        return None
    names = [n for n in SCORE_FUNCTIONS if any(n in r.scores for r in with_scores)]  # type: ignore[operator]
    names += sorted({n for r in with_scores for n in r.scores} - set(names))  # type: ignore[union-attr]
    cols = 4
    rows = math.ceil(len(names) / cols)
    fig = _figure(3.2 * cols, 2.4 * rows)
    u = np.linspace(0, 1, _MAX_CDF_POINTS)
    for k, name in enumerate(names):
        ax = fig.add_subplot(rows, cols, k + 1)
        for r in with_scores:
            if name not in r.scores:  # type: ignore[operator]
                continue
            v = r.scores[name].reshape(-1).double().numpy()  # type: ignore[index]
            v = v[np.isfinite(v)]
            if v.size:
                ax.plot(np.quantile(v, u), u, lw=1.2, label=r.name)
        ax.set_title(_label(name), fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if k == 0:
            ax.legend(fontsize=6)
    fig.suptitle("Empirical CDF of calibration scores (pooled over rows × layers × heads)", fontsize=10)
    fig.tight_layout()
    return fig


def _best_cell(run: RunData, rows: list[dict[str, object]]) -> tuple[str, dict[str, Any]] | None:
    # The best score function (random only if it is the only one) at its largest within-1-point target.
    ordered = [r["score"] for r in rows if r["score"] != "random"] + ["random"]
    curves = run.curves()
    for name in ordered:
        if name not in curves:
            continue
        cells = [
            c
            for c in curves[name].extra["cells"]
            if c["accuracy"] >= run.baseline - _TOL - 1e-9 and _head_frequency(run, c) is not None
        ]
        if cells:
            return str(name), max(cells, key=lambda c: c["fraction_zeroed"])
    # No cell stays within 1 point: show the best score function's mildest intervention.
    for name in ordered:
        cells = [
            c for c in (curves[name].extra["cells"] if name in curves else []) if _head_frequency(run, c) is not None
        ]
        if cells:
            return str(name), min(cells, key=lambda c: c["fraction_zeroed"])
    return None


def _head_frequency(run: RunData, cell: dict[str, Any]) -> np.ndarray | None:
    # Measured per-head fractions from the sweep; else what the threshold does to the calibration scores.
    if cell.get("per_head") is not None:
        return np.asarray(cell["per_head"], dtype=float)
    name, threshold = cell.get("score"), cell.get("threshold")
    if run.scores is None or name not in run.scores or name not in SCORE_FUNCTIONS or threshold is None:
        return None
    return zero_frequency(SCORE_FUNCTIONS[name].passes(run.scores[name], float(threshold))).numpy()


def _head_heatmap(run: RunData, name: str, cell: dict[str, Any]) -> Any:
    freq = _head_frequency(run, cell)
    assert freq is not None  # _best_cell only picks cells that have one
    fig = _figure(1.5 + 0.22 * freq.shape[1], 1.2 + 0.16 * freq.shape[0])
    ax = fig.add_subplot()
    im = ax.imshow(freq, cmap="magma", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    target = cell.get("target")
    ax.set_title(
        f"{run.name}: how often each head is zeroed\n{_label(name)}, target {target}, "
        f"{100 * cell['fraction_zeroed']:.1f}% zeroed",
        fontsize=9,
    )
    fig.colorbar(im, ax=ax, label="fraction of rows zeroed")
    return fig


# --- document model: blocks rendered both to Markdown and to HTML -------------------------------------------------


@dataclass
class _Doc:
    blocks: list[tuple[str, Any]] = field(default_factory=list)
    images: dict[str, bytes] = field(default_factory=dict)

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", (level, text)))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(("table", (header, rows)))

    def img(self, fig: Any, filename: str, alt: str) -> None:
        self.images[filename] = _png(fig)
        self.blocks.append(("img", (filename, alt)))

    def markdown(self) -> str:
        out = []
        for kind, val in self.blocks:
            if kind == "h":
                out.append("#" * val[0] + " " + val[1])
            elif kind == "p":
                out.append(val)
            elif kind == "table":
                header, rows = val
                esc = [[c.replace("|", "\\|") for c in r] for r in [header, *rows]]
                out.append("| " + " | ".join(esc[0]) + " |")
                out[-1] += "\n|" + "|".join("---" for _ in header) + "|"
                out[-1] += "".join("\n| " + " | ".join(r) + " |" for r in esc[1:])
            else:
                out.append(f"![{val[1]}]({val[0]})")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        e = html.escape
        body = []
        for kind, val in self.blocks:
            if kind == "h":
                body.append(f"<h{val[0]}>{e(val[1])}</h{val[0]}>")
            elif kind == "p":
                body.append(f"<p>{e(val)}</p>")
            elif kind == "table":
                header, rows = val
                head = "".join(f"<th>{e(c)}</th>" for c in header)
                trs = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows)
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>")
            else:
                data = base64.b64encode(self.images[val[0]]).decode("ascii")
                body.append(f'<figure><img alt="{e(val[1])}" src="data:image/png;base64,{data}"></figure>')
        style = (
            "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
            "table{border-collapse:collapse;margin:1em 0;font-size:14px}"
            "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}"
            "td:first-child,td:nth-child(2){text-align:left}img{max-width:100%}"
        )
        return (
            f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
        )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "run"


def _fmt_pct(fraction: float) -> str:
    return f"{100 * fraction:.1f}"


def _table2_rows(rows: list[dict[str, object]]) -> list[list[str]]:
    return [
        [str(r["score"]), str(r["label"]), _fmt_pct(float(r["max_zeroed"])), f"{r['auc']:.3f}", f"{r['rank']:g}"]  # type: ignore[arg-type]
        for r in rows
    ]


def _cell_rows(run: RunData) -> list[list[str]]:
    order: dict[str | None, int] = {n: k for k, n in enumerate(run.score_names)}
    cells = sorted(
        run.cells, key=lambda c: (c.get("score") is not None, order.get(c.get("score"), -1), c.get("target") or 0.0)
    )
    base = run.baseline

    def num(value: Any, fmt: str) -> str:
        return "–" if value is None else format(value, fmt)

    return [
        [
            str(c.get("score") or "baseline"),
            num(c.get("target"), "g"),
            num(c.get("threshold"), ".4g"),
            _fmt_pct(float(c["fraction_zeroed"])),
            f"{100 * c['accuracy']:.2f}",
            f"{100 * (c['accuracy'] - base):+.2f}",
            num(c.get("mean_ll_correct"), ".4f"),
            num(c.get("seconds"), ".0f"),
        ]
        for c in cells
    ]


def _pairwise_w1(runs: Sequence[RunData]) -> tuple[list[str], list[list[str]]] | None:
    with_scores = [r for r in runs if r.scores is not None]
    if len(with_scores) < 2:
        return None
    pairs = [(a, b) for i, a in enumerate(with_scores) for b in with_scores[i + 1 :]]
    tables = [wasserstein_table(a.scores, b.scores) for a, b in pairs]  # type: ignore[arg-type]
    names = [n for n in tables[0] if all(n in t for t in tables)]
    header = ["score", *(f"{a.name} vs {b.name}" for a, b in pairs)]
    return header, [[n, *(f"{t[n]:.4g}" for t in tables)] for n in names]


def write_report(run_dirs: Iterable[str | Path], out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``report.md`` (PNG figures next to it) and a self-contained ``report.html`` into ``out_dir``."""
    runs = [load_run(d) for d in run_dirs]
    if not runs:
        raise ValueError("no run directories given")
    out_dir = Path(out_dir)
    doc = _Doc()
    doc.h(1, "Inactive heads report")
    doc.p(
        "Max % zeroed within 1 pt: the largest measured fraction of heads zeroed whose accuracy stays within one "
        "point of baseline (last crossing of baseline − 1 pt, linearly interpolated). AUC: area under "
        "accuracy/baseline over the fraction range all score functions of the model reach, divided by its width."
    )
    all_rows: list[list[dict[str, object]]] = []
    for i, run in enumerate(runs):
        rows = run.table2()
        all_rows.append(rows)
        cfg = run.run
        doc.h(2, f"{run.name} — {cfg.get('task')}")
        doc.p(
            f"shots {cfg.get('shots')}, limit {cfg.get('limit')}, seed {cfg.get('seed')}, "
            f"{cfg.get('n_layers')} layers × {cfg.get('n_heads')} heads, package {cfg.get('package_version')}; "
            f"baseline accuracy {100 * run.baseline:.2f}%."
        )
        doc.table(["score", "label", "max % zeroed within 1 pt", "AUC", "rank"], _table2_rows(rows))
        doc.img(_curves_figure(run), f"curves_{i}_{_slug(run.name)}.png", f"accuracy vs % zeroed, {run.name}")
        best = _best_cell(run, rows)
        if best is not None:
            doc.img(_head_heatmap(run, *best), f"heads_{i}_{_slug(run.name)}.png", f"zeroed heads, {run.name}")
        doc.p("Every cell of the sweep (accuracy and Δ in points; mean log-likelihood of the correct choice):")
        doc.table(
            ["score", "target", "threshold", "% zeroed", "accuracy", "Δ", "mean ll correct", "s"], _cell_rows(run)
        )

    doc.h(2, "Ranks across models")
    names = [n for n in SCORE_FUNCTIONS if any(r["score"] == n for rows in all_rows for r in rows)]
    ranks = [{str(r["score"]): float(r["rank"]) for r in rows} for rows in all_rows]  # type: ignore[arg-type]
    models = [f"{i}: {r.name}" for i, r in enumerate(runs)]
    if names:
        doc.img(_rank_heatmap(names, models, ranks), "ranks.png", "rank heatmap")
    if len(runs) >= 2:
        header = ["models", "Spearman", "top-5 IoU"]
        agree = [
            [
                f"{models[i]} vs {models[j]}",
                f"{spearman(ranks[i], ranks[j]):.3f}",
                f"{top_k_iou(ranks[i], ranks[j]):.3f}",
            ]
            for i in range(len(runs))
            for j in range(i + 1, len(runs))
        ]
        doc.table(header, agree)

    cdf = _cdf_figure(runs)
    if cdf is not None:
        doc.h(2, "Score distributions")
        doc.img(cdf, "score_cdfs.png", "score CDFs")
    w1 = _pairwise_w1(runs)
    if w1 is not None:
        doc.h(2, "Wasserstein-1 distance between score distributions")
        doc.p("Pooled raw scores; raw norms depend on the model's scale, the LN variants are comparable across models.")
        doc.table(*w1)

    out_dir.mkdir(parents=True, exist_ok=True)
    for filename, data in doc.images.items():
        atomic_write_bytes(out_dir / filename, data)
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    atomic_write_text(md_path, doc.markdown())
    atomic_write_text(html_path, doc.html("Inactive heads report"))
    return md_path, html_path


def compare_runs(
    run_a: str | Path | RunData, run_b: str | Path | RunData, out_dir: str | Path | None = None
) -> tuple[str, Path]:
    """Distribution distances between two runs' calibration scores: a Markdown table and a figure.

    Per score function: pooled W1 and W1 per layer (per relative-depth bin when layer counts differ, see
    :func:`inactive_heads.analysis.wasserstein_table`). The figure (W1 vs relative depth, one line per score) goes
    to ``out_dir`` (default: ``run_a``'s directory) as ``compare_<a>_vs_<b>.png``.
    """
    a = run_a if isinstance(run_a, RunData) else load_run(run_a)
    b = run_b if isinstance(run_b, RunData) else load_run(run_b)
    if a.scores is None or b.scores is None:
        raise ValueError("both runs need calibration/scores.safetensors")
    pooled = wasserstein_table(a.scores, b.scores)
    per = wasserstein_table(a.scores, b.scores, per_layer=True)
    lines = [
        f"W1 between calibration scores of {a.name} and {b.name}",
        "",
        "| score | W1 pooled | W1 per depth (mean) | W1 per depth (max) |",
        "|---|---|---|---|",
    ]
    for n, d in pooled.items():
        vals = per[n]
        lines.append(f"| {n} | {d:.4g} | {np.mean(vals):.4g} | {np.max(vals):.4g} |")
    fig = _figure(7, 4.2)
    ax = fig.add_subplot()
    for n in pooled:
        vals = per[n]
        depth = (np.arange(len(vals)) + 0.5) / len(vals)
        ax.plot(depth, vals, marker="o", ms=3, lw=1.2, color="black" if n == "random" else None, label=_label(n))
    ax.set_xlabel("relative depth")
    ax.set_ylabel("W1 distance")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_title(f"{a.name} vs {b.name}: per-depth score distance")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    path = Path(out_dir) if out_dir is not None else a.dir
    fig_path = path / f"compare_{_slug(a.name)}_vs_{_slug(b.name)}.png"
    atomic_write_bytes(fig_path, _png(fig))
    return "\n".join(lines) + "\n", fig_path
