"""Two runs side by side: distances between their calibration score distributions, as a table and a figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .analysis import wasserstein_table
from .document import render_table
from .figures import figure, png
from .rundir import RunData, load_run, score_label, slug
from .store import atomic_write_bytes

__all__ = ["compare_runs"]


def compare_runs(
    run_a: str | Path | RunData, run_b: str | Path | RunData, out_dir: str | Path | None = None
) -> tuple[str, Path]:
    """Distribution distances between two runs' calibration scores: a Markdown table and a figure.

    Per score function: pooled W1 and W1 per layer (per relative-depth bin when layer counts differ, see
    :func:`inactive_heads.analysis.wasserstein_table`). The figure (W1 vs relative depth, one line per score) goes
    to ``out_dir`` (default: the working directory; run directories are only read) as ``compare_<a>_vs_<b>.png``.
    """
    a = run_a if isinstance(run_a, RunData) else load_run(run_a)
    b = run_b if isinstance(run_b, RunData) else load_run(run_b)
    if a.scores is None or b.scores is None:
        raise ValueError("both runs need calibration/scores.safetensors")
    pooled = wasserstein_table(a.scores, b.scores)
    per = wasserstein_table(a.scores, b.scores, per_layer=True)
    header = ["score", "W1 pooled", "W1 per depth (mean)", "W1 per depth (max)"]
    rows = [[n, f"{d:.4g}", f"{np.mean(per[n]):.4g}", f"{np.max(per[n]):.4g}"] for n, d in pooled.items()]
    text = f"W1 between calibration scores of {a.name} and {b.name}\n\n" + render_table(header, rows) + "\n"
    fig = figure(7, 4.2)
    ax = fig.add_subplot()
    for n in pooled:
        vals = per[n]
        depth = (np.arange(len(vals)) + 0.5) / len(vals)
        ax.plot(depth, vals, marker="o", ms=3, lw=1.2, color="black" if n == "random" else None, label=score_label(n))
    ax.set_xlabel("relative depth")
    ax.set_ylabel("W1 distance")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_title(f"{a.name} vs {b.name}: per-depth score distance")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    path = Path(out_dir) if out_dir is not None else Path.cwd()
    fig_path = path / f"compare_{slug(a.name)}_vs_{slug(b.name)}.png"
    atomic_write_bytes(fig_path, png(fig))
    return text, fig_path
