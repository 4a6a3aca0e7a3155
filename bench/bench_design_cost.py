"""What the adaptive search costs against the fixed grid on real models: the same crossings, on the same items.

Reads a study whose runs are searched by both designs (``design = "adaptive"`` and ``"sequential-grid"`` tasks on
the same model, task and calibration share one run directory, so both read the same baseline and item order;
``docs/study/study.toml``) and writes ``bench_design_cost`` in ``bench/RESULTS.md``: per (model, task, score
function) searched by both, each design's crossing with its 95% interval, whether the intervals overlap, the item
evaluations and evaluation hours each spent (the blocks' wall time, one single-threaded process per core), their
ratio, and the interval half-widths; then per run, the pairwise verdicts of each design (Holm over the pairs,
``ih.runs.adaptive.compare_searches``) and whether they agree; and the totals. Rows appear as searches finish.

    python bench/bench_design_cost.py [--study docs/study/study.toml] [--out docs/study]
    python bench/bench_design_cost.py --quick   # both designs on a tiny random model, printed to a temporary copy
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _quick import tiny_dir
from _results import results_file, write_table

import inactive_heads as ih
from inactive_heads.runs.adaptive import Search, compare_searches, load_searches
from inactive_heads.runs.directory import RunDir, score_label
from inactive_heads.stats.crossing import Crossing, format_crossing

ROOT = Path(__file__).resolve().parent.parent


def _half_width(c: Crossing) -> str:
    if c.state == "not_applicable":
        return "n/a"
    if c.high_censored:
        return "bound"  # the upper end is "> X": no width
    return f"{100 * (c.high - c.low) / 2:.1f}"


def _overlap(a: Crossing, b: Crossing) -> str:
    if "not_applicable" in (a.state, b.state):
        return "yes" if a.state == b.state else "NO"
    a_high = float("inf") if a.high_censored else a.high
    b_high = float("inf") if b.high_censored else b.high
    return "yes" if a.low <= b_high and b.low <= a_high else "NO"


def _verdicts(run_dir: Path, searches: list[Search]) -> str:
    found = compare_searches(run_dir, searches)
    claims = [f"{score_label(c.a)} > {score_label(c.b)}" for c in found if c.significant]
    return "; ".join(claims) or "none"


def measure(study: Path, out: Path) -> tuple[list[list[str]], list[list[str]]]:
    """Rows of both tables from the searches stored so far."""
    spec = ih.load_study(study)
    rows, runs = [], []
    totals: dict[str, list[float]] = {}
    seen: set[Path] = set()
    for model, task in spec.runs():
        run_dir = out / "runs" / spec.run_name(model, task)
        if task.search is None or run_dir in seen or not RunDir(run_dir).run_path.is_file():
            continue
        seen.add(run_dir)
        found = load_searches(run_dir)
        by_design = {
            kind: {s.score: s for s in found if s.design.kind == kind} for kind in ("adaptive", "sequential grid")
        }
        adaptive, grid = by_design["adaptive"], by_design["sequential grid"]
        both = [name for name in adaptive if name in grid]
        for name in both:
            a, g = adaptive[name], grid[name]
            rows.append([
                model.name, task.name, score_label(name), format_crossing(a.crossing), format_crossing(g.crossing),
                _overlap(a.crossing, g.crossing), f"{a.items_evaluated:,}", f"{g.items_evaluated:,}",
                f"{a.items_evaluated / g.items_evaluated:.2f}", f"{a.seconds / 3600:.2f}", f"{g.seconds / 3600:.2f}",
                _half_width(a.crossing), _half_width(g.crossing),
            ])  # fmt: skip
            t = totals.setdefault(model.name, [0, 0, 0, 0])
            for i, v in enumerate((a.items_evaluated, g.items_evaluated, a.seconds, g.seconds)):
                t[i] += v
        if len(both) >= 2:
            pair_a = _verdicts(run_dir, [adaptive[n] for n in both])
            pair_g = _verdicts(run_dir, [grid[n] for n in both])
            runs.append([model.name, task.name, str(len(both)), pair_a, pair_g, "yes" if pair_a == pair_g else "NO"])
    for name, (ia, ig, sa, sg) in [*totals.items(), ("all", [sum(t[i] for t in totals.values()) for i in range(4)])]:
        if ig:
            rows.append([name, "all", "all", "", "", "", f"{ia:,.0f}", f"{ig:,.0f}", f"{ia / ig:.2f}",
                         f"{sa / 3600:.2f}", f"{sg / 3600:.2f}", "", ""])  # fmt: skip
    return rows, runs


def _quick(root: Path) -> tuple[Path, Path]:
    """A tiny random model searched by both designs on 16 recall items."""
    model = tiny_dir(root)
    study = root / "study.toml"
    study.write_text(
        f'name = "quick"\nscores = ["ahon", "random"]\ntargets = [0.25, 0.5]\nbatch_size = 8\n\n'
        f"[search]\nblock_size = 8\nmax_probes = 3\ntolerance = 0.05\n\n"
        f'[[models]]\nname = "tiny"\nspec = "{model}"\n\n'
        f'[[tasks]]\nname = "recall"\nlimit = 16\ndesign = "adaptive"\n\n'
        f'[[tasks]]\nname = "recall"\nlimit = 16\ndesign = "sequential-grid"\n',
        encoding="utf-8",
    )
    ih.study(study, root / "out", progress=False, report=False)
    return study, root / "out"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", type=Path, default=ROOT / "docs" / "study" / "study.toml")
    parser.add_argument("--out", type=Path, default=None, help="the study directory (default: the file's folder)")
    parser.add_argument("--results", type=Path, default=None, help="the results file (default: bench/RESULTS.md)")
    parser.add_argument("--quick", action="store_true", help="both designs on a tiny random model")
    args = parser.parse_args()
    results = results_file(args.results, args.quick)
    study, out = args.study, args.out or args.study.parent
    if args.quick:
        study, out = _quick(Path(tempfile.mkdtemp(prefix="bench_design_cost-")))
    rows, runs = measure(study, out)
    header = ["model", "task", "score", "adaptive crossing [95%]", "grid crossing [95%]", "intervals overlap",
              "adaptive items", "grid items", "items adaptive / grid", "adaptive hours", "grid hours",
              "adaptive half-width (pts)", "grid half-width (pts)"]  # fmt: skip
    # Every row comes from the stored searches: the table is rewritten whole, each model's total after its rows.
    write_table("bench_design_cost", header, rows, path=results)
    header = ["model", "task", "functions", "significant (adaptive)", "significant (grid)", "same verdicts"]
    write_table("bench_design_cost_verdicts", header, runs, path=results)
    print(f"{len(rows)} rows, {len(runs)} runs compared -> {results}")


if __name__ == "__main__":
    main()
