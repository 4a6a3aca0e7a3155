"""The report on searched crossings (:mod:`inactive_heads.runs.adaptive`): each run's crossings with their intervals,
ranks and cost, every probe with its stop decision, the crossings of a task's models side by side, and their rows
in ``cells.csv``. A run without searches adds nothing, so a grid-only report is unchanged."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..runs.adaptive import ProbeRecord, Search, SearchDesign, compare_searches, load_searches, stored_probes
from ..runs.directory import RunData, score_label
from ..stats.crossing import (
    Answer,
    Comparison,
    Crossing,
    CrossingResult,
    Probe,
    compare_crossings,
    format_crossing,
    grid_crossing,
    items_to_decide,
    items_to_separate,
)
from .document import Document
from .figures import crossing_figure, png
from .tables import calibration_label

__all__ = [
    "CROSSING_NOTE",
    "crossing_ranks",
    "crossings_across",
    "crossings_csv",
    "crossings_section",
    "decide_text",
    "difference_text",
    "grid_comparisons_section",
    "grid_crossings",
    "p_text",
    "probe_change_text",
    "separate_text",
    "verdict_text",
]

CROSSING_NOTE = (
    "Crossing: the largest realised fraction of heads zeroed at which expected accuracy stays within the tolerance "
    "of baseline, from an isotonic (non-increasing) fit of the paired accuracy difference against the fraction, "
    "with a 95% paired bootstrap interval over items. > X%: the fit stays within the tolerance up to X, the "
    "largest fraction probed (censored; an interval ending in > X has the same meaning for its upper end). n/a: "
    "the score function zeroes no head, so it has no crossing and is not ranked. Rank 1 tolerates most zeroing, by "
    "the point estimate; a censored crossing > X ranks above estimates at or below X only, so where the order is "
    "not known the rank is the range it may take (1–3). Ranks order estimates; they do not test their differences."
)


def _groups(searches: Sequence[Search]) -> dict[str, list[Search]]:
    """Searches by design (kind and budgets), in order of appearance: only searches of one design are compared."""
    out: dict[str, list[Search]] = {}
    for s in searches:
        out.setdefault(_design_text(s), []).append(s)
    return out


def _design_text(s: Search) -> str:
    d = s.design
    items = "every item" if d.max_items is None else f"at most {d.max_items} items"
    if d.targets is None:
        where = f"probabilistic bisection up to {100 * d.max_fraction:g}% of heads, at most {d.max_probes} probes"
    else:
        where = f"fixed targets {', '.join(f'{100 * t:g}%' for t in d.targets)}"
    return (
        f"{s.design.kind} design: {where}, {items} per probe in blocks of {d.block_size}, tolerance "
        f"{100 * d.tolerance:g} pt, each probe's test at alpha {d.alpha:g}"
    )


def probe_change_text(p: ProbeRecord) -> str:
    """A probe's accuracy change to baseline in points with its confidence sequence at the last look."""
    return f"{100 * p.mean:+.1f} [{100 * p.looks[-1].low:+.1f}, {100 * p.looks[-1].high:+.1f}]"


# The most items decide_text looks ahead; beyond, it prints the bound.
_DECIDE_LIMIT = 1_000_000


def decide_text(probe: Probe, design: SearchDesign) -> str:
    """The items an undecided probe's test would need to decide had the shares of its answers held
    (:func:`~inactive_heads.stats.crossing.items_to_decide`), to two significant digits, or the bound ``> 1,000,000``;
    "–" for a probe that decided."""
    if probe.decision != "undecided":
        return "–"
    n = items_to_decide(
        probe, tolerance=design.tolerance, block_size=design.block_size, alpha=design.alpha, limit=_DECIDE_LIMIT
    )
    return f"> {_DECIDE_LIMIT:,}" if n is None else _planned(n)


def separate_text(c: Comparison, n_items: int, pairs: int) -> str:
    """The items at which a pair not significant would be, had its difference held
    (:func:`~inactive_heads.stats.crossing.items_to_separate`), to two significant digits; "–" for a significant
    pair, "no direction" where the resamples favour neither."""
    if c.significant:
        return "–"
    n = items_to_separate(c, n_items, pairs)
    return "no direction" if n is None else _planned(n)


def _planned(n: int) -> str:
    return f"~{round(n, 2 - len(str(n))):,}"


def difference_text(c: Comparison) -> str:
    """A pair's difference in points of heads; blank where a crossing is censored (only the order is known)."""
    return "" if c.difference != c.difference else f"{100 * c.difference:+.1f}"


def p_text(p: float, resamples: int, factor: int = 1) -> str:
    """A bootstrap p to 3 decimals (below 0.001, to 2 significant digits: never a bare "0.000"); where no resample
    went against the pair, the bound it supports instead: below twice the rule of three's 3 / resamples, times
    ``factor`` (Holm's largest, the pairs, for an adjusted p)."""
    if p >= 0.001:
        return f"{p:.3f}"
    if p > 0:
        return f"{p:.{1 - math.floor(math.log10(p))}f}"
    bound = min(1.0, 6 * factor / resamples)
    return f"< {bound:.{max(3, -math.floor(math.log10(bound)))}f}"


def verdict_text(c: Comparison) -> str:
    return "significant" if c.significant else ("not significant" if c.stable else "too close to call")


def crossing_ranks(crossings: Mapping[str, Crossing]) -> dict[str, str]:
    """Rank of each score function with a crossing (1: tolerates most zeroing), by the point estimate. A censored
    crossing ``> X`` is above every estimate at or below X and unordered against the rest, so where the order is not
    known (ties included) the rank is the range the function may take ("1–3"). n/a has none."""
    ranked = {n: c for n, c in crossings.items() if c.state != "not_applicable"}

    def above(a: Crossing, b: Crossing) -> bool:
        if b.state == "censored":
            return False  # b may lie anywhere above its bound
        return a.value >= b.value if a.state == "censored" else a.value > b.value

    ranks = {}
    for n, c in ranked.items():
        best = 1 + sum(above(o, c) for o in ranked.values())
        worst = len(ranked) - sum(above(c, o) for o in ranked.values())
        ranks[n] = f"{best}" if best == worst else f"{best}–{worst}"
    return ranks


def crossings_section(doc: Document, run: RunData, tag: str) -> bool:
    """The crossings searched in ``run``, per design: a table of crossings with rank and cost, the pairwise
    comparisons, a figure (files named with ``tag``), then every probe. Returns whether the run has any."""
    searches = load_searches(run.dir)
    for i, (text, group) in enumerate(_groups(searches).items()):
        doc.p(f"Crossings searched ({text}). {CROSSING_NOTE}")
        ranks = crossing_ranks({s.score: s.crossing for s in group})
        doc.table(
            ["score", "label", "crossing [95% interval]", "rank", "probes", "search stop", "items evaluated", "eval s"],
            [
                [
                    s.score,
                    score_label(s.score),
                    format_crossing(s.crossing),
                    ranks.get(s.score, "–"),
                    str(len(s.probes)),
                    s.stop.replace("_", " "),
                    f"{s.items_evaluated:,} ({s.items_evaluated / s.n_items:.1f} × {s.n_items:,})",
                    f"{s.seconds:.0f}",
                ]
                for s in group
            ],
        )
        answers = stored_probes(run.dir, group)  # every probe's per-item answers, read once
        _comparisons(doc, run, group, answers)
        name = f"crossings_{tag}_{i}.png"
        doc.img(png(crossing_figure(group, run.name)), name, f"crossings, {run.name}, {text}")
        doc.p(
            "Probes in the order run: accuracy change to baseline on the probe's items in points with its "
            "anytime-valid confidence sequence at the last look, and the test's decision (within or below the "
            "tolerance, or undecided at the item budget). Items to decide: for an undecided probe, the items its test "
            "would need had the shares of its answers (worse, same, better than baseline) held; a planning figure, "
            "not an estimate (a true change nearer the tolerance needs many more)."
        )
        doc.table(
            [
                "score",
                "target %",
                "% zeroed",
                "items",
                "looks",
                "Δ acc [CS]",
                "decision",
                "probe stop",
                "items to decide",
            ],
            [
                [
                    s.score,
                    f"{100 * p.target:g}",
                    f"{100 * p.fraction:.1f}",
                    str(p.items),
                    str(len(p.looks)),
                    probe_change_text(p),
                    p.decision,
                    p.stop.replace("_", " "),
                    decide_text(a, s.design),
                ]
                for s in group
                for p, a in zip(s.probes, answers[s.score], strict=True)
            ],
        )
    return bool(searches)


def _comparisons(
    doc: Document, run: RunData, searches: Sequence[Search], answers: Mapping[str, Sequence[Probe]]
) -> None:
    """Which score function tolerates more zeroing than which, pair by pair, with Holm's correction."""
    _comparison_table(doc, compare_searches(run.dir, searches, probes=answers), searches[0].n_items)


def _comparison_table(doc: Document, found: Sequence[Comparison], n_items: int) -> None:
    if not found:
        return
    doc.p(
        f"Pairwise: does the first function tolerate more zeroing than the second? One paired bootstrap over items "
        f"refits every crossing per resample; p is twice the share of resamples not ordering the pair so, adjusted "
        f"by Holm's step-down correction over the {len(found)} pairs (functions that zero no head left out). "
        "Significant: Holm p at most 0.05 and more than 3 Monte-Carlo errors (on Holm's scale) from it; where a "
        "Holm p lay within 5 errors of 0.05 after 1,000 resamples, 100,000 were drawn. Where no resample went "
        "against the pair, p is given as the bound the resamples support (< 6 / resamples, times the pairs for Holm's "
        "p: twice the rule of three). A difference is blank where a crossing is censored (only the order is known). "
        "Items to separate: for a pair not significant, the items at which it would be had its difference held (the "
        "bootstrap's z, the normal quantile of the share, growing as the root of the items to Holm's strictest cut, "
        "0.05 over the pairs); a planning figure, not an estimate."
    )
    doc.table(
        ["first", "second", "difference (pts of heads)", "share of resamples", "p", "Holm p", "MC error", "resamples",
         "verdict", "items to separate"],
        [
            [
                score_label(c.a),
                score_label(c.b),
                difference_text(c),
                f"{c.share:.3f}",
                p_text(c.p, c.resamples),
                p_text(c.p_holm, c.resamples, len(found)),
                f"{c.mc_se:.3f}",
                f"{c.resamples:,}",
                verdict_text(c),
                separate_text(c, n_items, len(found)),
            ]
            for c in found
        ],
    )  # fmt: skip


def grid_crossings(run: RunData, *, seed: int = 0) -> dict[str, CrossingResult]:
    """A fixed-grid run's cells read by the searches' estimator, per score function: each cell is a probe that read
    every item once (one look, no stopping), paired with the baseline cell on the same items
    (:func:`~inactive_heads.stats.crossing.grid_crossing`), so its crossing, interval and comparisons follow the
    searches' rules. Empty where the cells lack per-item answers."""
    base = next((c for c in run.cells if c.score is None), None)
    ids = None if base is None or base.per_item is None else base.per_item.get("ids")
    baseline = None if base is None else base.correct(ids)
    if baseline is None:
        return {}
    out = {}
    for name, curve in run.curves().items():
        cells = {round(float(c.target), 12): c for c in curve.extra["cells"] if c.target is not None}
        answers = {t: (c.correct(ids), float(c.fraction_zeroed)) for t, c in cells.items()}
        # A probe per target: cells that share a target (or have none) are no grid the estimator can read.
        if len(answers) != len(curve.extra["cells"]) or any(a is None for a, _ in answers.values()):
            return {}
        out[name] = grid_crossing(_lookup(answers), baseline, list(answers), block_size=baseline.size, seed=seed)
    return out


def _lookup(answers: Mapping[float, tuple[Any, float]]) -> Callable[[float, npt.NDArray[np.int64]], Answer]:
    """The estimator's ``evaluate`` over stored cells: (per-item correctness, fraction zeroed) per target."""

    def evaluate(target: float, items: npt.NDArray[np.int64]) -> Answer:
        correct, fraction = answers[target]
        return Answer(correct[items], fraction)

    return evaluate


def grid_comparisons_section(doc: Document, run: RunData, *, seed: int = 0) -> None:
    """A fixed-grid run's crossings as the estimator reads them (:func:`grid_crossings`) and their pairwise
    comparisons with Holm's correction, in place of ranks read off the raw curve."""
    found = grid_crossings(run, seed=seed)
    if not found:
        return
    crossings = {n: r.crossing for n, r in found.items()}
    ranks = crossing_ranks(crossings)
    n_items = next(iter(found.values())).probes[0].items.size
    doc.p(
        f"{run.name}: the grid's cells read as probes of the crossing estimator (each cell one probe over all "
        f"{n_items:,} items). {CROSSING_NOTE}"
    )
    doc.table(
        ["score", "label", "crossing [95% interval]", "rank"],
        [[n, score_label(n), format_crossing(c), ranks.get(n, "–")] for n, c in crossings.items()],
    )
    _comparison_table(doc, compare_crossings({n: r.probes for n, r in found.items()}, seed=seed), n_items)


def crossings_across(doc: Document, runs: Sequence[RunData]) -> None:
    """The crossings of one task's runs side by side, a column per model and a table per design (nothing without
    searches)."""
    by_run = [load_searches(r.dir) for r in runs]
    designs = list(dict.fromkeys(_design_text(s) for found in by_run for s in found))
    for text in designs:
        found = [{s.score: s for s in searches if _design_text(s) == text} for searches in by_run]
        shown = [(r, f) for r, f in zip(runs, found, strict=True) if f]
        ranks = [crossing_ranks({n: s.crossing for n, s in f.items()}) for _, f in shown]
        names = list(dict.fromkeys(n for _, f in shown for n in f))
        doc.p(f"Crossing of each score function per model (rank), {text}. {CROSSING_NOTE}")
        rows = []
        for n in names:
            cells = []
            for (_, f), rank in zip(shown, ranks, strict=True):
                s = f.get(n)
                ranked = f" ({rank[n]})" if n in rank else ""
                cells.append("–" if s is None else format_crossing(s.crossing) + ranked)
            rows.append([n, score_label(n), *cells])
        doc.table(["score", "label", *(r.name for r, _ in shown)], rows)


_CSV_EXTRA = [
    "row", "design", "state", "crossing", "crossing_low", "crossing_high", "high_censored", "decision", "stop",
    "seconds",
]  # fmt: skip


def crossings_csv(text: str, runs: Sequence[RunData]) -> str:
    """``cells.csv`` (``text``) with the searches of ``runs`` added: when any run has one, extra columns (``row``:
    cell, crossing or probe), a row per search (its crossing, ``n_items`` the items it evaluated) and a row per
    probe (``delta`` its mean paired difference, ``delta_low``/``delta_high`` its confidence sequence at the last
    look); ``text`` itself otherwise. ``high_censored``: the interval's upper end is the bound ``> crossing_high``."""
    searches = [(r, s) for r in runs for s in load_searches(r.dir)]
    if not searches:
        return text
    rows = list(csv.reader(io.StringIO(text)))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(rows[0] + _CSV_EXTRA)
    for row in rows[1:]:
        writer.writerow(row + ["cell"] + [""] * (len(_CSV_EXTRA) - 1))

    def num(value: float) -> str:
        return f"{value:.6g}"

    for run, s in searches:
        cfg, c = run.settings, s.crossing
        common = [run.name, cfg.get("task"), cfg.get("shots"), cfg.get("limit"), calibration_label(run), s.score]
        applicable = c.state != "not_applicable"
        values = [num(v) if applicable else "" for v in (c.value, c.low, c.high)]
        censored = str(c.high_censored).lower() if applicable else ""
        writer.writerow(
            [*common, *[""] * 8, s.items_evaluated, "crossing", s.design.kind, c.state, *values, censored, "", s.stop,
             num(s.seconds)]
        )  # fmt: skip
        for p in s.probes:
            look = p.looks[-1]
            writer.writerow(
                [*common, num(p.target), num(p.threshold), num(p.fraction), num(p.accuracy), num(p.mean),
                 num(look.low), num(look.high), "", p.items, "probe", s.design.kind, *[""] * 5, p.decision, p.stop,
                 num(p.seconds)]
            )  # fmt: skip
    return out.getvalue()
