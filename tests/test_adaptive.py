"""The search for each score's crossing on a tiny model: records, resume after a kill without evaluating a stored
block again, replay, censoring and n/a, the report, the study file and an adaptive study end to end."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import random
import re
import shlex
import shutil
import textwrap
import threading

import pytest
import torch
from _tiny import tiny_model, tiny_tokenizer

import inactive_heads as ih
import inactive_heads.evaluation as evaluation
from inactive_heads.cli import main
from inactive_heads.report.crossings import p_text
from inactive_heads.report.quotes import QUOTE_KINDS, check_quotes, unquoted_intervals
from inactive_heads.report.tables import analysed_scores, analysis_targets, overlap_text, run_overlaps, threshold_table
from inactive_heads.report.writer import write_report
from inactive_heads.runs.adaptive import (
    Search,
    SearchDesign,
    compare_searches,
    load_searches,
    search_score,
    stored_probes,
)
from inactive_heads.runs.directory import RunDir, load_run, score_label
from inactive_heads.runs.jobs import plan_cells
from inactive_heads.scores import _SCORE_FUNCTIONS
from inactive_heads.stats.crossing import fit_crossing, format_crossing, items_to_decide, items_to_separate
from inactive_heads.stats.thresholds import thresholds_from_cdf
from inactive_heads.studies.file import StudyFileError, parse_study
from inactive_heads.tasks import _TASKS, pinned
from inactive_heads.tasks.recall import recall_task

# Small enough that a search of a few probes takes seconds: 24 items, 3 blocks of 8 per probe at most.
_DESIGN = SearchDesign(tolerance=0.02, block_size=8, max_items=16, max_probes=3)


def _task():
    return recall_task(n_items=24, seed=1, n_words=6)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A calibrated run directory of the tiny llama on the short recall task, with its model and task."""
    model, tok, task = tiny_model("llama", seed=0), tiny_tokenizer(), _task()
    run_dir = tmp_path_factory.mktemp("adaptive") / "run"
    ih.calibrate(model, tok, task, run_dir, batch_size=8, progress=False)
    return model, tok, task, run_dir


class _Killed(Exception):
    pass


def _count_blocks(monkeypatch, fail_after: int | None = None) -> list[object]:
    """Count the evaluations under a policy (search blocks); raise instead of the one after ``fail_after``."""
    calls: list[object] = []
    real = evaluation.evaluate

    def counting(*args, **kwargs):
        if kwargs.get("policy") is not None:
            if fail_after is not None and len(calls) == fail_after:
                raise _Killed
            calls.append(kwargs["policy"])
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluation, "evaluate", counting)
    return calls


def test_search_resumes_after_a_kill_and_replays(run, monkeypatch):
    model, tok, task, run_dir = run
    rd = RunDir(run_dir)
    with pytest.raises(_Killed), monkeypatch.context() as m:
        _count_blocks(m, fail_after=2)
        search_score(model, tok, task, run_dir, "ahon", _DESIGN, batch_size=8)
    assert len(list(rd.blocks_path.glob("*.json"))) == 2  # the blocks finished before the kill
    assert not list(rd.searches_path.glob("*.json"))

    with monkeypatch.context() as m:
        calls = _count_blocks(m)
        found = search_score(model, tok, task, run_dir, "ahon", _DESIGN, batch_size=8)
    blocks = list(rd.blocks_path.glob("*.json"))
    assert len(calls) == len(blocks) - 2  # the stored blocks were not evaluated again
    assert not list(rd.blocks_path.glob(".*.tmp"))

    # The record: every probe and look, read back validated; its cost adds up.
    [path] = rd.searches_path.glob("*.json")
    stored = Search.from_json(json.loads(path.read_text()))
    assert stored == found and stored.to_json() == found.to_json()
    assert found.design == _DESIGN and 1 <= len(found.probes) <= _DESIGN.max_probes
    assert found.probes[0].target == pytest.approx(_DESIGN.max_fraction)  # censoring is checked first
    assert sum(len(p.looks) for p in found.probes) == len(blocks)
    assert found.items_evaluated == sum(p.items for p in found.probes) == sum(p.looks[-1].items for p in found.probes)
    assert all(p.items <= _DESIGN.max_items for p in found.probes)
    assert found.stop in ("converged", "max_probes") and found.crossing.tolerance == _DESIGN.tolerance

    # A rerun replays: with the record gone, every block is read back, nothing is evaluated, the same record results.
    path.unlink()
    with monkeypatch.context() as m:
        calls = _count_blocks(m)
        again = search_score(model, tok, task, run_dir, "ahon", _DESIGN, batch_size=8)
    assert calls == [] and again.to_json() == found.to_json()
    assert load_searches(run_dir) == [found]


def test_a_search_whose_baseline_another_process_holds_is_left_for_later(run, tmp_path, monkeypatch):
    """With ``wait=False`` a search does not wait on a baseline cell that another process is evaluating: it returns
    None and releases its own claim, so a study's worker takes other work meanwhile."""
    model, tok, task, run_dir = run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    rd = RunDir(copy)
    shutil.rmtree(rd.searches_path, ignore_errors=True)  # what other tests of this module stored
    for stored in (copy / "cells").glob("*.json"):
        stored.unlink()
    [baseline] = plan_cells(copy, scores=["ahon"], targets=[])
    with rd.cell_store().claim(baseline.key, wait=False) as mine, monkeypatch.context() as m:
        assert mine
        calls = _count_blocks(m)
        result: dict[str, object] = {}
        worker = threading.Thread(
            target=lambda: result.update(
                r=search_score(model, tok, task, copy, "ahon", _DESIGN, batch_size=8, wait=False)
            )
        )
        worker.start()
        worker.join(timeout=120)
        assert not worker.is_alive(), "the search waited on the held baseline cell"
        assert result == {"r": None}
        assert calls == [] and not list(rd.blocks_path.glob("*.json"))
    found = search_score(model, tok, task, copy, "ahon", _DESIGN, batch_size=8, wait=False)  # its claim was let go
    assert found is not None and rd.cell_store().has(baseline.key)


def test_stored_probes_are_what_the_search_fitted_and_pairs_are_compared(run, tmp_path):
    model, tok, task, run_dir = run
    found = [search_score(model, tok, task, run_dir, s, _DESIGN, batch_size=8) for s in ("ahon", "awft")]
    probes = stored_probes(run_dir, found)
    for s in found:
        assert [(p.target, p.items.size, p.mean) for p in probes[s.score]] == [
            (p.target, p.items, p.mean) for p in s.probes
        ]
        # The search's bootstrap is seeded with the run's seed + 1.
        assert fit_crossing(probes[s.score], tolerance=_DESIGN.tolerance, seed=1) == s.crossing
    [pair] = compare_searches(run_dir, found)
    assert {pair.a, pair.b} == {"ahon", "awft"} and pair.p_holm == pair.p  # one pair: Holm changes nothing
    assert pair.significant == (pair.p <= 0.05 and pair.stable)
    md, _ = write_report([run_dir], tmp_path / "report")
    assert "Holm's step-down correction over the" in md.read_text()


def test_a_reading_s_quotes_are_checked_against_the_stored_searches(run, tmp_path, capsys):
    model, tok, task, run_dir = run
    found = {s: search_score(model, tok, task, run_dir, s, _DESIGN, batch_size=8) for s in ("ahon", "awft")}
    record = RunDir(run_dir).read_run()
    name, on = shlex.quote(record["model"]["name"]), record["task"]
    [pair] = compare_searches(run_dir, [s for s in load_searches(run_dir) if s.design == _DESIGN])  # as stored
    first = found["awft"].probes[0]
    answers = stored_probes(run_dir, [found["awft"]])["awft"][0]
    needed = items_to_decide(answers, tolerance=_DESIGN.tolerance, block_size=_DESIGN.block_size, alpha=_DESIGN.alpha)
    decide = "> 1,000,000" if needed is None else f"~{round(needed, 2 - len(str(needed))):,}"  # two digits
    decide = "–" if first.decision != "undecided" else decide
    planned = items_to_separate(pair, found["awft"].n_items, 1)
    separate = "no direction" if planned is None else f"~{round(planned, 2 - len(str(planned))):,}"
    separate = "–" if pair.significant else separate
    calibration = RunDir(run_dir).read_meta()["task"]  # type: ignore[index]
    (overlap,) = run_overlaps(load_run(run_dir), [0.25])
    shared = f"IoU {overlap_text(overlap, 'iou', overlap.names.index('awft'), overlap.names.index('ahon'))}"
    reading = tmp_path / "reading.md"
    reading.write_text(
        f"AHON: <!-- q crossing {name} {on} ahon -->{format_crossing(found['ahon'].crossing)}, after "
        f"<!-- q items {name} {on} ahon -->{found['ahon'].items_evaluated:,} item evaluations.\n"
        f"AWFT first probed <!-- q probe {name} {on} awft 1 -->{100 * first.fraction:.1f}% of heads: wrong.\n"
        f"<!-- q compare {name} {on} awft ahon -->{score_label(pair.a)} over\n"
        f"Deciding it takes <!-- q decide {name} {on} awft 1 -->{decide}.\n"
        f"Separating them: <!-- q separate {name} {on} ahon awft -->{separate}.\n"
        f"They flag <!-- q overlap {name} {calibration} 0.25 awft ahon -->{shared} of heads alike.\n"
        "An unchecked interval [1.0, 2.5].\n"
    )
    quotes = check_quotes(reading, run_dir.parent)
    wrong = [(2, False), (3, False)]  # the probe and the comparison quoted wrongly
    assert [(q.line, q.ok) for q in quotes] == [(1, True), (1, True), *wrong, (4, True), (5, True), (6, True)]
    assert re.fullmatch(r"IoU \d\.\d\d \[\d\.\d\d, \d\.\d\d\]", shared)
    assert quotes[2].expected.endswith(f"pts ({first.items:,} items, {first.decision})")
    assert quotes[3].expected.startswith(f"{score_label(pair.a)} over {score_label(pair.b)}: ")
    assert f"Holm p {pair.p_holm:.3f}" in quotes[3].expected
    assert unquoted_intervals(reading, quotes) == [(7, "[1.0, 2.5]")]  # the crossing's interval is quoted
    assert main(["check-quotes", str(reading), "--runs", str(run_dir.parent)]) == 2
    printed = capsys.readouterr()
    assert f"{reading}:2: <!-- q probe {record['model']['name']} {on} awft 1 --> the runs give" in printed.out
    assert "interval [1.0, 2.5] is not a checked quote" in printed.out and "5 of 7 quotes match" in printed.out
    assert "2 quotes differ from the runs and 1 intervals are unchecked" in printed.err
    for bad, message in (
        (f"<!-- q crossing {name} {on} fhon -->", "no stored adaptive search of fhon"),
        (f"<!-- q crossing nobody {on} ahon -->", "no run of nobody on"),
        (f"<!-- q probe {name} {on} ahon 99 -->", "probe N counts from 1"),
        (f"<!-- q overlap {name} {on} 0.25 awft random -->", "analyses both awft and random (random is never"),
        (f"<!-- q overlap {name} {on} a-tenth awft ahon -->", "TARGET is a fraction of heads"),
        (f"<!-- q crossing {name} {on} ahon grid -->", "design must be one of adaptive, sequential-grid"),
        ("<!-- q mean x -->", f"unknown quote 'mean'; one of {', '.join(QUOTE_KINDS)}"),
        (f"<!-- q crossing {name} -->", "wrong arguments"),
    ):
        reading.write_text(f"text\n{bad}")
        with pytest.raises(ih.InactiveHeadsError, match=re.escape(f"{reading}:2: ") + ".*" + re.escape(message)):
            check_quotes(reading, run_dir.parent)


def test_calibration_analyses_cover_searched_functions(run, tmp_path):
    """A run that searches has no grid cells: its overlap and threshold analyses cover the searched functions at
    the default targets, thresholds taken from the calibration scores as a sweep takes them."""
    model, tok, task, run_dir = run
    for s in ("ahon", "awft"):
        search_score(model, tok, task, run_dir, s, _DESIGN, batch_size=8)
    other = dataclasses.replace(recall_task(n_items=24, seed=2, n_words=6), name="recall_other")
    other_dir = tmp_path / "other"
    ih.calibrate(model, tok, other, other_dir, batch_size=8, progress=False)
    search_score(model, tok, other, other_dir, "awft", _DESIGN, batch_size=8)
    first, second = load_run(run_dir), load_run(other_dir)
    assert first.score_names == [] and analysed_scores(first)[:2] == ["awft", "ahon"]
    assert analysis_targets(first) == [0.05, 0.1, 0.15, 0.2, 0.25, 0.3]
    assert [o.target for o in run_overlaps(first, analysis_targets(first), n_resamples=20)] == analysis_targets(first)
    header, rows = threshold_table([first, second], n_resamples=20)
    assert header[2:4] == ["threshold on recall", "threshold on recall_other"]
    assert [(r[0], r[1]) for r in rows] == [("AWFT", f"{t:g}") for t in analysis_targets(first)]  # searched in both
    assert first.scores is not None
    wanted = thresholds_from_cdf(
        first.scores["awft"], ih.SCORE_FUNCTIONS["awft"].inactive_when, analysis_targets(first)
    )
    assert [r[2] for r in rows] == [f"{t:.4g}" for t in wanted]


def test_a_reading_quotes_the_threshold_spread_of_a_model_s_calibrations(run, tmp_path):
    model, tok, task, run_dir = run
    search_score(model, tok, task, run_dir, "awft", _DESIGN, batch_size=8)
    other = dataclasses.replace(recall_task(n_items=24, seed=2, n_words=6), name="recall_other")
    ih.calibrate(model, tok, other, run_dir.parent / "other", batch_size=8, progress=False)
    search_score(model, tok, other, run_dir.parent / "other", "awft", _DESIGN, batch_size=8)
    name = shlex.quote(RunDir(run_dir).read_run()["model"]["name"])
    _, rows = threshold_table([load_run(run_dir), load_run(run_dir.parent / "other")])
    spread = next(r[-1] for r in rows if r[0] == "AWFT" and r[1] == "0.1")
    assert re.fullmatch(r"\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]", spread)
    reading = tmp_path / "reading.md"
    reading.write_text(f"AWFT's thresholds move by <!-- q spread {name} awft 0.10 -->{spread} across tasks.\n")
    assert [q.ok for q in check_quotes(reading, run_dir.parent)] == [True]
    for bad, message in (
        (f"<!-- q spread {name} awft 0.1 heldout -->", "has no two tasks calibrated with heldout items"),
        (f"<!-- q spread {name} fhon 0.1 -->", "no threshold of fhon at 0.1"),
    ):
        reading.write_text(bad)
        with pytest.raises(ih.InactiveHeadsError, match=re.escape(message)):
            check_quotes(reading, run_dir.parent)


def test_censored_and_not_applicable_in_the_report(run, tmp_path):
    model, tok, task, run_dir = run
    # A tolerance of 50 points: zeroing at random never leaves it, so the crossing lies above the largest probe.
    loose = SearchDesign(tolerance=0.5, block_size=8, max_items=8, max_probes=2)
    censored = search_score(model, tok, task, run_dir, "random", loose, batch_size=8)
    assert censored.crossing.state == "censored" and format_crossing(censored.crossing).startswith("> ")

    # A score equal on every head passes no threshold below half of the heads: it zeroes none, so it has no crossing.
    @ih.register_score("flat_test", inactive_when="below", needs={"ahon"})
    def flat_test(s):
        return torch.ones_like(s.ahon)

    try:
        none = search_score(model, tok, task, run_dir, "flat_test", dataclasses.replace(loose, max_fraction=0.4))
        assert none.crossing.state == "not_applicable" and none.stop == "not_applicable"
        assert format_crossing(none.crossing) == "n/a" and [p.stop for p in none.probes] == ["no_heads"]
        md, _ = write_report([run_dir], tmp_path / "report")
    finally:
        _SCORE_FUNCTIONS.pop("flat_test", None)
    text = md.read_text()
    assert "Crossings searched" in text and "| flat_test | flat_test | n/a | – |" in text
    assert f"| random | Random | {format_crossing(censored.crossing)} | 1 |".replace(">", "&gt;") in text
    rows = list(csv.DictReader(io.StringIO((tmp_path / "report" / "cells.csv").read_text())))
    crossings = {r["score"]: r for r in rows if r["row"] == "crossing"}
    assert crossings["flat_test"]["state"] == "not_applicable" and crossings["flat_test"]["crossing"] == ""
    assert crossings["random"]["state"] == "censored" and crossings["random"]["high_censored"] == "true"
    assert [r["row"] for r in rows if r["score"] == "baseline"] == ["cell"]
    assert sum(r["row"] == "probe" for r in rows) == sum(len(s.probes) for s in load_searches(run_dir))


def test_pinned_items_keep_their_few_shot_examples():
    task = dataclasses.replace(_task(), fewshot_sampler="random")
    whole = pinned(task, 12, 3, shots=2)
    part = dataclasses.replace(whole, items=whole.items[5:7])
    rnd = random.Random(1234)
    drawn = {it.id: task.fewshot_examples(it, 2, rnd) for it in whole.items}  # the whole evaluation's draws
    assert [part.fewshot_examples(it, 2, rnd) for it in part.items] == [drawn[it.id] for it in part.items]


def test_design_and_study_keys_are_checked():
    with pytest.raises(ih.InactiveHeadsError, match="tolerance must be"):
        SearchDesign(tolerance=1.0)
    with pytest.raises(ih.InactiveHeadsError, match="max_probes must be"):
        SearchDesign(max_probes=0)
    base = {"models": [{"name": "m", "spec": "org/m"}], "design": "adaptive", "scores": ["ahon"]}
    study = parse_study({**base, "search": {"tolerance": 0.02}, "tasks": [{"name": "recall"}]}, where="s.toml")
    assert study.tasks[0].search == SearchDesign(tolerance=0.02) and study.grid_cells(study.tasks[0]) == 1
    bad = [
        ({"search": {"tolerance": 2}}, "s.toml: search.tolerance: tolerance must be"),
        ({"search": {"probes": 2}}, "s.toml: search.probes: unknown key"),
        ({"tasks": [{"name": "recall", "search": {"max_items": 0}}]}, r"tasks\[0\].search.max_items: max_items must"),
        ({"design": "grid", "targets": [0.1], "tasks": [{"name": "recall", "search": {}}]}, r"tasks\[0\].search: app"),
        ({"design": "grid", "tasks": [{"name": "recall"}]}, "targets: missing"),
        ({"design": "bisect"}, "design: expected one of grid, adaptive, sequential-grid"),
    ]
    for change, message in bad:
        with pytest.raises(StudyFileError, match=message):
            parse_study({**base, "tasks": [{"name": "recall"}], **change}, where="s.toml")


def test_sweep_checks_the_design_before_a_model_loads(capsys):
    assert main(["sweep", "--model", "no/such-model", "--task", "recall", "--design", "adaptive", "--tolerance", "1"])
    assert "tolerance must be an accuracy loss in (0, 1)" in capsys.readouterr().err


_PLUGIN = """
import dataclasses
import inactive_heads as ih
from inactive_heads.tasks.recall import recall_task

@ih.register_task("recall_tiny", summary="16 recall items over 6-word lists")
def recall_tiny(data_dir, source):
    return dataclasses.replace(recall_task(n_items=16, seed=1, n_words=6), name="recall_tiny")
"""


def test_adaptive_study_end_to_end(tmp_path, capsys):
    tiny_model("llama", seed=0).save_pretrained(tmp_path / "llama")
    tiny_tokenizer().save_pretrained(tmp_path / "llama")
    (tmp_path / "plugin.py").write_text(_PLUGIN)
    (tmp_path / "study.toml").write_text(
        textwrap.dedent(
            """
            name = "mixed"
            scores = ["ahon", "random"]
            targets = [0.25]
            batch_size = 8
            plugins = ["plugin.py"]

            [search]
            block_size = 8
            max_items = 8
            max_probes = 2

            [[models]]
            name = "llama"
            spec = "llama"

            [[tasks]]
            name = "recall_tiny"
            scores = ["ahon"]

            [[tasks]]
            name = "recall_tiny"
            design = "adaptive"
            search = { tolerance = 0.05 }

            # The same run searched on a fixed grid: it shares the adaptive task's run directory.
            [[tasks]]
            name = "recall_tiny"
            design = "sequential-grid"
            scores = ["ahon"]
            search = { tolerance = 0.05 }
            """
        )
    )
    out = tmp_path / "out"
    try:
        assert main(["study", str(tmp_path / "study.toml"), "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        assert "2 searches (2 run now)" not in printed and "3 searches (3 run now)" in printed
        assert "of 2 runs" in printed and "2 calibrations" in printed
        resume = ["study", str(tmp_path / "study.toml"), "--out", str(out), "--no-report"]
        assert main(resume) == 0  # resumes: nothing to run
        assert "0 evaluated now" in (printed := capsys.readouterr().out) and "3 searches (0 run now)" in printed
        assert main(["study", str(tmp_path / "study.toml"), "--out", str(out), "--status"]) == 0
        status = capsys.readouterr().out
        # Another adaptive task of the same run with another function: none of the stored searches is its own.
        other = tmp_path / "other.toml"
        other.write_text(
            (tmp_path / "study.toml").read_text()
            + '[[tasks]]\nname = "recall_tiny"\ndesign = "adaptive"\nscores = ["awft"]\nsearch = { tolerance = 0.05 }\n'
        )
        rows = ih.study_status(other, out)
        assert [len(r.search_seconds) for r in rows] == [0, 2, 1, 0] and rows[1].searches == 2
        # Kept without its full scores (as committed), a run whose search now probes a fraction with no recorded
        # threshold records its scores again (its calibration record unchanged), then searches.
        kept = {
            d: (RunDir(d).meta_path.read_bytes(), len(RunDir(d).thresholds_path.read_bytes()))
            for d in out.glob("runs/*")
        }
        for d in kept:
            RunDir(d).scores_path.unlink()
        deeper = tmp_path / "deeper.toml"
        deeper.write_text((tmp_path / "study.toml").read_text().replace("max_probes = 2", "max_probes = 4"))
        assert main(["study", str(deeper), "--out", str(out), "--no-report"]) == 0
        assert "3 searches (3 run now)" in capsys.readouterr().out
        grew = [d for d, (_, size) in kept.items() if len(RunDir(d).thresholds_path.read_bytes()) > size]
        assert grew and all(RunDir(d).scores_path.is_file() for d in grew)  # new thresholds, from scores recorded again
        assert all(RunDir(d).meta_path.read_bytes() == meta for d, (meta, _) in kept.items())
    finally:
        _TASKS.pop("recall_tiny", None)
    assert "searches stored" in status and "2/2" in status and "3 of 3 searches stored" in status
    [searched] = [d for d in (out / "runs").iterdir() if list(RunDir(d).searches_path.glob("*.json"))]
    found = [s for s in load_searches(searched) if s.design.max_probes == 2]  # the first study's
    assert [(s.design.kind, s.score) for s in found] == [
        ("adaptive", "ahon"),
        ("adaptive", "random"),
        ("sequential grid", "ahon"),
    ]
    assert {s.design.tolerance for s in found} == {0.05}
    report = (out / "report" / "report.md").read_text()
    assert "Crossing of each score function per model" in report and "Table 2:" in report  # both designs shown
    rows = list(csv.DictReader(io.StringIO((out / "report" / "cells.csv").read_text())))
    assert {r["row"] for r in rows} == {"cell", "crossing", "probe"}
    assert sum(r["row"] == "cell" and r["score"] != "baseline" for r in rows) == 1  # the grid task's cell


def test_a_p_no_resample_went_against_is_printed_as_the_bound_it_supports():
    assert p_text(0.0132, 1000) == "0.013" and p_text(1.0, 1000, 3) == "1.000"
    assert p_text(0.00018, 100_000) == "0.00018" and p_text(6e-5, 100_000) == "0.000060"  # small, never "0.000"
    # 0 of R resamples against: by the rule of three the share is below 3 / R (95%), so p below 6 / R.
    assert p_text(0.0, 1000) == "< 0.006" and p_text(0.0, 1000, 3) == "< 0.018" and p_text(0.0, 100_000) == "< 0.00006"
