"""The Markdown + self-contained HTML report over one or more run directories."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .analysis import spearman, top_k_iou, wasserstein_table, within_tolerance
from .document import Document
from .figures import cdf_figure, curves_figure, head_heatmap, png, rank_heatmap
from .rundir import RunData, load_run, slug
from .scores import SCORE_FUNCTIONS
from .store import atomic_write_bytes, atomic_write_text

__all__ = ["write_report"]


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
            if within_tolerance(c["accuracy"], run.baseline) and run.head_frequency(c) is not None
        ]
        if cells:
            return str(name), max(cells, key=lambda c: c["fraction_zeroed"])
    # No cell stays within 1 point: show the best score function's mildest intervention.
    for name in ordered:
        cells = [
            c for c in (curves[name].extra["cells"] if name in curves else []) if run.head_frequency(c) is not None
        ]
        if cells:
            return str(name), min(cells, key=lambda c: c["fraction_zeroed"])
    return None


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
    doc = Document()
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
        cfg = {**run.run.get("evaluation", {}), **run.run}
        doc.h(2, f"{run.name} — {cfg.get('task')}")
        doc.p(
            f"shots {cfg.get('shots')}, limit {cfg.get('limit')}, seed {cfg.get('seed')}, "
            f"{cfg.get('n_layers')} layers × {cfg.get('n_heads')} heads, package {cfg.get('package_version')}; "
            f"baseline accuracy {100 * run.baseline:.2f}%."
        )
        doc.table(["score", "label", "max % zeroed within 1 pt", "AUC", "rank"], _table2_rows(rows))
        doc.img(png(curves_figure(run)), f"curves_{i}_{slug(run.name)}.png", f"accuracy vs % zeroed, {run.name}")
        best = _best_cell(run, rows)
        if best is not None:
            doc.img(png(head_heatmap(run, *best)), f"heads_{i}_{slug(run.name)}.png", f"zeroed heads, {run.name}")
        doc.p("Every cell of the sweep (accuracy and Δ in points; mean log-likelihood of the correct choice):")
        doc.table(
            ["score", "target", "threshold", "% zeroed", "accuracy", "Δ", "mean ll correct", "s"], _cell_rows(run)
        )

    doc.h(2, "Ranks across models")
    names = [n for n in SCORE_FUNCTIONS if any(r["score"] == n for rows in all_rows for r in rows)]
    ranks = [{str(r["score"]): float(r["rank"]) for r in rows} for rows in all_rows]  # type: ignore[arg-type]
    models = [f"{i}: {r.name}" for i, r in enumerate(runs)]
    if names:
        doc.img(png(rank_heatmap(names, models, ranks)), "ranks.png", "rank heatmap")
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

    cdf = cdf_figure(runs)
    if cdf is not None:
        doc.h(2, "Score distributions")
        doc.img(png(cdf), "score_cdfs.png", "score CDFs")
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
