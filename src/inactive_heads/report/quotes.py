"""Numbers a hand-written reading of a study quotes, each checked against the study's stored runs.

A reading marks every number it takes from the runs with an HTML comment (invisible once rendered) naming what it
quotes; the text right after the marker must begin with that number as the report formats it::

    AWFT's crossing on PIQA is <!-- q crossing SmolLM2-135M-Instruct piqa awft -->26.3% [0.0, 87.5].

Quotes (``MODEL`` is a run's model name, ``TASK`` its task, ``DESIGN`` ``adaptive`` (default) or
``sequential-grid``, the search design whose record is read):

- ``crossing MODEL TASK SCORE [DESIGN]``: the crossing with its 95% interval (``26.3% [0.0, 87.5]``, ``> 87.5% [...]``
  or ``n/a``);
- ``probe MODEL TASK SCORE N [DESIGN]``: the N-th probe run (from 1): ``20.1% of heads: -0.7 [-2.6, +1.2] pts
  (1,838 items, undecided)``, the accuracy change with its confidence sequence at the last look;
- ``compare MODEL TASK A B [DESIGN]``: the pairwise test of the two functions (either order): ``AWFT over random:
  +12.3 pts of heads, Holm p 0.004 (significant)``;
- ``items MODEL TASK SCORE [DESIGN]``: the item evaluations the search spent (``8,052``);
- ``decide MODEL TASK SCORE N [DESIGN]``: the items the N-th probe's test would need to decide had the shares of its
  answers held (``~4,500``, ``> 1,000,000``; ``–`` once decided), as the report's probe table gives them;
- ``separate MODEL TASK A B [DESIGN]``: the items at which the pair would be significant had its difference held
  (``~59,000``; ``–`` once significant), as the report's comparisons give them;
- ``overlap MODEL CALIBRATION TARGET A B``: the IoU of the heads two functions flag at ``TARGET`` on the model's
  calibration on task ``CALIBRATION``, with its bootstrap interval as the report's overlap section computes it
  (``IoU 0.30 [0.29, 0.30]``);
- ``spread MODEL SCORE TARGET [ITEMS]``: how far the thresholds of the model's calibrations on different tasks
  (``ITEMS`` ``same`` (default) or ``heldout``, as the report groups them) lie apart, with its bootstrap interval, as
  the report's threshold-stability table gives it (``0.412 [0.301, 0.530]``).

:func:`check_quotes` returns every quote with what the runs give; :func:`unquoted_intervals` finds bracketed
intervals outside any quote (a reading that claims only what holds quotes each one).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..errors import InactiveHeadsError
from ..runs.adaptive import Search, SearchDesign, compare_searches, load_searches, stored_probes
from ..runs.directory import RunData, RunDir, load_run, score_label
from ..stats.crossing import Comparison, Probe, format_crossing
from .crossings import decide_text, difference_text, p_text, probe_change_text, separate_text, verdict_text
from .tables import analysed_scores, overlap_text, run_overlaps, threshold_groups, threshold_table

__all__ = ["QUOTE_KINDS", "Quote", "check_quotes", "unquoted_intervals"]

_MARKER = re.compile(r"<!--\s*q\s+(.*?)\s*-->")
_INTERVAL = re.compile(r"\[[-+]?\d[\d.,]*%?,\s*(?:> ?)?[-+]?\d[\d.,]*%?\]")
_DESIGNS = {"adaptive": "adaptive", "sequential-grid": "sequential grid"}


@dataclass(frozen=True)
class Quote:
    """One marked quote: its ``line`` (from 1), the ``query`` inside the marker, what the runs give (``expected``)
    and the text following the marker (as long as ``expected``, to compare); ``ok`` when they match."""

    line: int
    offset: int  # of the quoted text in the file
    query: str
    expected: str
    found: str

    @property
    def ok(self) -> bool:
        return self.found == self.expected


class _Runs:
    """The study's run directories by (model name, task); what quotes read of them (searches, per-item answers,
    comparisons, runs, overlaps, threshold tables) is computed once."""

    def __init__(self, runs_dir: Path):
        self.dirs: dict[tuple[str, str], list[Path]] = {}
        for d in sorted(p for p in runs_dir.iterdir() if (p / "run.json").is_file()):
            run = RunDir(d).read_run()
            self.dirs.setdefault((run["model"]["name"], run["task"]), []).append(d)
        self.searches = cache(load_searches)
        self.probes = cache(self._probes)
        self.comparisons = cache(self._compare)
        self.run = cache(load_run)
        self.overlaps = cache(lambda run_dir, target: run_overlaps(self.run(run_dir), [target])[0])
        self.thresholds = cache(self._thresholds)

    def _of(self, run_dir: Path, design: SearchDesign) -> list[Search]:
        return [s for s in self.searches(run_dir) if s.design == design]

    def _probes(self, run_dir: Path, design: SearchDesign) -> dict[str, list[Probe]]:
        return stored_probes(run_dir, self._of(run_dir, design))

    def _compare(self, run_dir: Path, design: SearchDesign) -> list[Comparison]:
        return compare_searches(run_dir, self._of(run_dir, design), probes=self.probes(run_dir, design))

    def _thresholds(self, model: str, items: str) -> list[list[str]] | None:
        """The rows of ``model``'s threshold-stability table over its calibrations with ``items``."""
        loaded = [self.run(d) for (m, _), dirs in sorted(self.dirs.items()) if m == model for d in dirs]
        group = threshold_groups([r for r in loaded if r.calibration_meta]).get((model, items))
        table = None if group is None else threshold_table(group)
        return None if table is None else table[1]

    def search(self, model: str, task: str, score: str, design: str) -> tuple[Path, Search]:
        found = [(d, s) for d in self._dirs(model, task) for s in self.searches(d) if s.score == score]
        found = [(d, s) for d, s in found if s.design.kind == _design(design)]
        if len(found) != 1:
            what = "no" if not found else f"{len(found)}"
            raise InactiveHeadsError(f"{what} stored {design} search of {score} for {model} on {task}")
        return found[0]

    def calibrated_on(self, model: str, calibration: str) -> list[RunData]:
        """The runs of ``model`` calibrated on task ``calibration`` whose scores are stored."""
        found = []
        for (m, _), dirs in sorted(self.dirs.items()):
            for d in dirs:
                meta = RunDir(d).read_meta() if m == model else None
                if meta is not None and meta.get("task") == calibration and (run := self.run(d)).scores is not None:
                    found.append(run)
        return found

    def _dirs(self, model: str, task: str) -> list[Path]:
        dirs = self.dirs.get((model, task))
        if not dirs:
            known = ", ".join(f"{m} {t}" for m, t in sorted(self.dirs))
            raise InactiveHeadsError(f"no run of {model} on {task}; the runs are: {known}")
        return dirs


def _design(name: str) -> str:
    if name not in _DESIGNS:
        raise InactiveHeadsError(f"design must be one of {', '.join(_DESIGNS)}, got {name!r}")
    return _DESIGNS[name]


def _crossing(runs: _Runs, model: str, task: str, score: str, design: str = "adaptive") -> str:
    return format_crossing(runs.search(model, task, score, design)[1].crossing)


def _nth(n: str, count: int) -> int:
    if not n.isdigit() or not 1 <= int(n) <= count:
        raise InactiveHeadsError(f"probe N counts from 1 to {count} (the search's probes), got {n!r}")
    return int(n) - 1


def _probe(runs: _Runs, model: str, task: str, score: str, n: str, design: str = "adaptive") -> str:
    probes = runs.search(model, task, score, design)[1].probes
    p = probes[_nth(n, len(probes))]
    return f"{100 * p.fraction:.1f}% of heads: {probe_change_text(p)} pts ({p.items:,} items, {p.decision})"


def _pair(runs: _Runs, model: str, task: str, a: str, b: str, design: str) -> tuple[Comparison, int, int]:
    """The comparison of ``a`` and ``b``, the items compared and the pairs of its family."""
    run_dir, first = runs.search(model, task, a, design)
    family = runs.comparisons(run_dir, first.design)
    found = [c for c in family if {c.a, c.b} == {a, b}]
    if not found:
        raise InactiveHeadsError(f"{a} and {b} are not compared for {model} on {task} (one zeroes no head?)")
    return found[0], first.n_items, len(family)


def _compare(runs: _Runs, model: str, task: str, a: str, b: str, design: str = "adaptive") -> str:
    c, _, pairs = _pair(runs, model, task, a, b, design)
    difference = difference_text(c)
    what = f"{difference} pts of heads" if difference else "order only (a crossing is censored)"
    holm = p_text(c.p_holm, c.resamples, pairs)
    return f"{score_label(c.a)} over {score_label(c.b)}: {what}, Holm p {holm} ({verdict_text(c)})"


def _separate(runs: _Runs, model: str, task: str, a: str, b: str, design: str = "adaptive") -> str:
    return separate_text(*_pair(runs, model, task, a, b, design))


def _items(runs: _Runs, model: str, task: str, score: str, design: str = "adaptive") -> str:
    return f"{runs.search(model, task, score, design)[1].items_evaluated:,}"


def _decide(runs: _Runs, model: str, task: str, score: str, n: str, design: str = "adaptive") -> str:
    run_dir, search = runs.search(model, task, score, design)
    probe = runs.probes(run_dir, search.design)[score][_nth(n, len(search.probes))]
    return decide_text(probe, search.design)


def _fraction(target: str) -> float:
    try:
        return float(target)
    except ValueError:
        raise InactiveHeadsError(f"TARGET is a fraction of heads, e.g. 0.1, got {target!r}") from None


def _overlap(runs: _Runs, model: str, calibration: str, target: str, a: str, b: str) -> str:
    at = _fraction(target)
    for run in runs.calibrated_on(model, calibration):  # runs sharing a calibration hold the same scores
        if a in (names := analysed_scores(run)) and b in names and "random" not in (a, b):
            o = runs.overlaps(run.dir, at)
            return f"IoU {overlap_text(o, 'iou', o.names.index(a), o.names.index(b))}"
    raise InactiveHeadsError(
        f"no run of {model} calibrated on {calibration} analyses both {a} and {b} (random is never analysed)"
    )


def _spread(runs: _Runs, model: str, score: str, target: str, items: str = "same") -> str:
    rows = runs.thresholds(model, items)
    if rows is None:
        raise InactiveHeadsError(f"{model} has no two tasks calibrated with {items} items to compare thresholds of")
    for row in rows:
        if row[0] == score_label(score) and row[1] == f"{_fraction(target):g}":
            return row[-1]
    raise InactiveHeadsError(f"no threshold of {score} at {target} on {model}'s calibrations")


#: Each quote kind and its function of the runs and the marker's arguments.
QUOTE_KINDS: dict[str, Callable[..., str]] = {
    "crossing": _crossing,
    "probe": _probe,
    "compare": _compare,
    "items": _items,
    "decide": _decide,
    "separate": _separate,
    "overlap": _overlap,
    "spread": _spread,
}


def check_quotes(reading: str | Path, runs_dir: str | Path) -> list[Quote]:
    """Every marked quote of the reading (a Markdown file) with what the study's runs (``runs_dir``: the run
    directories) give; InactiveHeadsError naming the line for a marker that does not parse or names nothing
    stored."""
    text = Path(reading).read_text()
    runs = _Runs(Path(runs_dir))
    quotes = []
    for m in _MARKER.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        try:
            kind, *args = shlex.split(m.group(1))
            if kind not in QUOTE_KINDS:
                raise InactiveHeadsError(f"unknown quote {kind!r}; one of {', '.join(QUOTE_KINDS)}")
            expected = QUOTE_KINDS[kind](runs, *args)
        except TypeError:
            raise InactiveHeadsError(f"{reading}:{line}: wrong arguments in <!-- q {m.group(1)} -->") from None
        except (InactiveHeadsError, ValueError) as e:
            raise InactiveHeadsError(f"{reading}:{line}: {e}") from None
        quotes.append(Quote(line, m.end(), m.group(1), expected, text[m.end() : m.end() + len(expected)]))
    return quotes


def unquoted_intervals(reading: str | Path, quotes: Sequence[Quote]) -> list[tuple[int, str]]:
    """Bracketed intervals (``[0.0, 87.5]``, ``[-2.6, +1.2]``) that no matching quote of ``quotes`` (the reading's,
    from :func:`check_quotes`) covers, with their line: numbers the reading states without a check."""
    text = Path(reading).read_text()
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(0))
        for m in _INTERVAL.finditer(text)
        if not any(q.ok and q.offset <= m.start() and m.end() <= q.offset + len(q.expected) for q in quotes)
    ]
