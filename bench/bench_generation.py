"""GSM8K generation under zeroing: the cascade in each generation mode, and generation speed.

Per mode (``--modes``), one sweep of ``gsm8k`` (``--limit`` items, ``--max-gen-toks``, ``--scores`` x ``--targets``,
calibrated on the evaluated prompts as the paper does) into ``--out/<model>-<mode>``; the runs resume when the
script is run again. Then:

* ``bench_generation_cascade`` in ``bench/RESULTS.md``: per mode and cell, exact match, the share of items whose
  generated tokens equal the unintervened run's, where the others first diverge, and tokens/s against the mode's
  unintervened generation (the report's cascade table, :func:`inactive_heads.report.tables.cascade_table`);
* ``bench_generation_modes``: with ``recompute`` among the modes, per cell of another mode, the share of items
  whose generated tokens equal recompute's and the change in exact match against it
  (:func:`inactive_heads.report.tables.mode_agreement_table`);
* ``bench_generation_speed``: tokens/s of transformers' ``generate`` (batched, left-padded, greedy) and of
  inactive-heads' generation without a policy and in each mode under AHON (LN), on ``--speed-prompts`` prompts
  with ``--speed-tokens`` new tokens, one after the other in this process;
* ``bench_generation_recompute``: ``recompute`` (cached) against re-running every pass (the naive
  ``recompute``), ``running`` and transformers' ``generate``, per score of ``--recompute-scores`` at
  ``--speed-target`` and per budget of ``--recompute-tokens``: new tokens/s, the share of decoding steps at which
  some decision flipped (each re-runs its row), and whether the cached tokens equal the naive ones;
* a report over the runs in ``--out/report`` (its generation section is the same table).

    python bench/bench_generation.py --model FILE.gguf [--limit 20] [--max-gen-toks 128] [--modes step running]
    python bench/bench_generation.py --model FILE.gguf ... --write   # render what is stored so far
    python bench/bench_generation.py --model FILE.gguf --modes recompute running prompt --targets 0.1 0.2 \
        --device cuda --dtype bfloat16 --batch-size 32   # the full cascade on a GPU
    python bench/bench_generation.py --model FILE.gguf --recompute-only --recompute-tokens 64 256
    python bench/bench_generation.py --quick   # a tiny random model: every table on 2 bare questions, 8 tokens,
                                               # into a temporary copy of RESULTS.md
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from _quick import tiny_dir
from _results import results_file, update_table  # bench/ is the script's directory, first on sys.path
from torch.nn.utils.rnn import pad_sequence

import inactive_heads as ih
from inactive_heads.evaluation.generative import prompt_tokens
from inactive_heads.generation import MODES, NAIVE_RECOMPUTE, Generated, Mode, generate_until
from inactive_heads.report.tables import cascade_table, mode_agreement_table
from inactive_heads.runs.directory import load_run, slug
from inactive_heads.tasks import get_task, subset

ROOT = Path(__file__).resolve().parent.parent


class _SpeedPrompts:
    """The speed tables' GSM8K prompts (``--speed-prompts`` items, ``--shots`` or the task's few-shot block), and
    what runs on them: transformers' generate and policies calibrated on them."""

    def __init__(self, model, tok, args: argparse.Namespace):
        task = get_task("gsm8k", args.data_dir)
        items = subset(task.items, args.speed_prompts, 0)
        config = ih.EvalConfig(limit=args.speed_prompts, data_dir=args.data_dir, shots=args.shots)
        self.shots = config.shots_for(task)
        self.prompts = prompt_tokens(task, items, self.shots, config, tok)
        assert task.generation is not None
        self.spec = task.generation
        self.model, self.tok, self.batch_size = model, tok, args.batch_size
        self.scores = ih.record_scores(model, None, self.prompts, batch_size=args.batch_size)

    def hf_generate(self, budget: int) -> float:
        """New tokens/s of transformers' generate (batched, left-padded, greedy, the task's stop strings)."""
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id
        new_tokens, start = 0, time.perf_counter()
        with torch.no_grad():
            for i in range(0, len(self.prompts), self.batch_size):
                rows = [torch.tensor(p) for p in self.prompts[i : i + self.batch_size]]
                ids = pad_sequence(rows, batch_first=True, padding_value=pad, padding_side="left")
                mask = pad_sequence([torch.ones_like(r) for r in rows], batch_first=True, padding_side="left")
                out = self.model.generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=budget, do_sample=False,
                    pad_token_id=pad, stop_strings=list(self.spec.until), tokenizer=self.tok,
                )  # fmt: skip
                new_tokens += int((out[:, ids.shape[1] :] != pad).sum())
        return new_tokens / (time.perf_counter() - start)

    def policy(self, score: str, target: float) -> ih.Policy:
        """``score`` at the threshold that zeroes ``target`` of the heads on these prompts."""
        side = ih.SCORE_FUNCTIONS[score].inactive_when
        return ih.Policy(score=score, threshold=ih.thresholds_from_cdf(self.scores[score], side, [target])[0])

    def generate(self, budget: int, policy: ih.Policy | None, mode: Mode | Literal["naive-recompute"]) -> Generated:
        return generate_until(
            self.model, self.tok, self.prompts, until=self.spec.until, max_gen_toks=budget,
            batch_size=self.batch_size, policy=policy, mode=mode,
        )  # fmt: skip


def _speed(runs: _SpeedPrompts, args: argparse.Namespace) -> list[list[str]]:
    """Tokens/s of transformers' generate, of generate_until without a policy and of each mode under AHON (LN) at
    the threshold that zeroes ``--speed-target`` of the heads on these prompts; each on the same prompts and batch
    size, one after the other, against transformers' generate with the same token budget."""
    policy = runs.policy("ahon_ln", args.speed_target)
    label, target, budget = args.name or Path(args.model).stem, f"AHON (LN) at {args.speed_target:g}", args.speed_tokens
    n = str(len(runs.prompts))
    hf_rate = runs.hf_generate(budget)  # the baseline of every row
    rows = [[label, "transformers generate (KV cache)", n, str(budget), f"{hf_rate:.1f}", "1.00x"]]
    cases: list[tuple[str, ih.Policy | None, Mode]] = [("no policy", None, "step")]
    for name, pol, mode in cases + [(f"{m}, {target}", policy, m) for m in MODES]:
        got = runs.generate(budget, pol, mode)
        rows.append([label, f"inactive-heads: {name}", n, str(budget), f"{got.tokens_per_s:.1f}",
                     f"{got.tokens_per_s / hf_rate:.2f}x"])  # fmt: skip
    return rows


def _recompute_speed(runs: _SpeedPrompts, args: argparse.Namespace, emit: Callable[[list[list[str]]], None]) -> None:
    """Per score and budget: new tokens/s of transformers' generate, the naive and the cached ``recompute`` and
    ``running``, the share of decoding steps that flipped and whether the cached tokens are the naive ones; each
    (budget, score)'s rows are emitted as soon as they are measured."""
    label, n = args.name or Path(args.model).stem, str(len(runs.prompts))
    for budget in args.recompute_tokens:
        hf_rate = runs.hf_generate(budget)
        for score in args.recompute_scores.split(","):
            policy = runs.policy(score, args.speed_target)
            key = [label, f"{ih.SCORE_FUNCTIONS[score].label} at {args.speed_target:g}", n, str(runs.shots),
                   str(budget)]  # fmt: skip
            cached = runs.generate(budget, policy, "recompute")
            running = runs.generate(budget, policy, "running")
            measured: list[tuple[str, float, float | None, str]] = [
                ("transformers generate (KV cache)", hf_rate, None, ""),
                ("running", running.tokens_per_s, None, ""),
            ]
            naive_rate = None
            if args.naive_passes:
                naive_rate, same = _replayed_naive(runs, budget, policy, cached, args.naive_passes)
                name = f"recompute, naive (re-runs every pass; {args.naive_passes} passes timed)"
                measured.append((name, naive_rate, None, ""))
            elif not args.no_naive:
                naive = runs.generate(budget, policy, NAIVE_RECOMPUTE)
                naive_rate, same = naive.tokens_per_s, "yes" if cached.tokens == naive.tokens else "NO"
                measured.append(("recompute, naive (re-runs every pass)", naive_rate, naive.flip_share, ""))
            measured.append(
                ("recompute (cached)", cached.tokens_per_s, cached.flip_share, "" if naive_rate is None else same)
            )
            emit([
                [*key, name, f"{rate:.2f}", "" if naive_rate is None else f"{rate / naive_rate:.2f}x",
                 f"{rate / running.tokens_per_s:.2f}x", "" if share is None else f"{100 * share:.1f}%", equal]
                for name, rate, share, equal in measured
            ])  # fmt: skip


def _replayed_naive(
    runs: _SpeedPrompts, budget: int, policy: ih.Policy, cached: Generated, passes: int
) -> tuple[float, str]:
    """The naive ``recompute``'s new tokens/s, from ``passes`` of its passes timed and the rest interpolated.

    Decoding step ``s`` of the naive loop is one pass over every row of the batch, each its prompt plus its first
    ``s`` tokens (a row that has stopped is fed padding, as in the loop), under the policy. With the cached run's
    tokens (the naive ones: the equality is tested) that pass is replayed as ``generate_until(..., max_gen_toks=1)``
    in naive mode at evenly spread steps, and its time, linear between timed steps, summed over every step. Returns
    the rate and whether each timed pass chose the token the cached run generated there ("yes (k steps)")."""
    pad = runs.tok.pad_token_id if runs.tok.pad_token_id is not None else runs.tok.eos_token_id
    steps = max(map(len, cached.tokens))
    timed = sorted({round(k * (steps - 1) / max(passes - 1, 1)) for k in range(passes)})
    seconds, same = [], True
    for s in timed:
        fed = [(t + [pad] * steps)[:s] for t in cached.tokens]
        one = generate_until(
            runs.model, runs.tok, [list(p) + f for p, f in zip(runs.prompts, fed, strict=True)],
            until=runs.spec.until, max_gen_toks=1, batch_size=runs.batch_size, policy=policy, mode=NAIVE_RECOMPUTE,
        )  # fmt: skip
        seconds.append(one.seconds)
        same &= all(o[0] == t[s] for o, t in zip(one.tokens, cached.tokens, strict=True) if len(t) > s)
    total = float(np.interp(np.arange(steps), timed, seconds).sum())
    return cached.new_tokens / total, f"{'yes' if same else 'NO'} ({len(timed)} steps)"


def _emit(name: str, header: list[str], rows: list[list[str]], key: int, args: argparse.Namespace) -> None:
    """Rows into section ``name`` of the results file."""
    update_table(name, header, rows, key=key, path=args.results)


def _quick(args: argparse.Namespace) -> None:
    """Every table at smoke size: a tiny random model (unless ``--model``), 2 bare questions, 8 new tokens, in
    temporary folders."""
    root = Path(tempfile.mkdtemp(prefix="bench_generation-"))
    if args.model is None:
        args.model, args.name = str(tiny_dir(root, max_positions=8192)), "tiny"  # a 5-shot prompt: ~3,000 bytes
    args.out, args.limit, args.max_gen_toks, args.shots = root / "runs", 2, 8, 0
    if "recompute" not in args.modes:  # the modes table compares the others with it
        args.modes = [*args.modes, "recompute"]
    args.speed_prompts, args.speed_tokens, args.recompute_tokens = 2, 8, [8]


def _write(run_dirs: list[Path], label: str, args: argparse.Namespace) -> None:
    """The cascade table of the runs' stored cells into RESULTS.md, and the report of those whose baseline is
    stored (a run still computing its baseline has nothing to compare against)."""
    runs = [load_run(d) for d in run_dirs]
    table = cascade_table(runs)
    if table is None:
        raise SystemExit("no generative cells stored yet")
    key = [label, str(args.limit), str(args.max_gen_toks)]
    header, rows = table
    update_table(
        "bench_generation_cascade", ["model", "items", "max new tokens", *header], [[*key, *r] for r in rows],
        key=6, path=args.results,
    )  # fmt: skip
    agreement = mode_agreement_table(runs)
    if agreement is not None:
        header, rows = agreement
        update_table(
            "bench_generation_modes", ["model", "items", "max new tokens", *header], [[*key, *r] for r in rows],
            key=6, path=args.results,
        )  # fmt: skip
    ih.write_report([r.dir for r in runs if any(c.score is None for c in r.cells)], args.out / "report")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a .gguf file or model directory (needed but with --quick)")
    parser.add_argument("--name", default=None)
    parser.add_argument("--modes", nargs="+", default=["step", "running", "prompt"], choices=MODES)
    parser.add_argument("--scores", default="ahon_ln,awft,random")
    parser.add_argument("--targets", type=float, nargs="+", default=[0.1])
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--max-gen-toks", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default=None, help="where the model goes, e.g. cuda (default: CPU)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--data-dir", type=Path, default=None, help="default: $INACTIVE_HEADS_DATA")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_generation"))
    parser.add_argument("--results", type=Path, default=None, help="default: bench/RESULTS.md")
    parser.add_argument("--no-speed", action="store_true", help="skip the generation speed table")
    parser.add_argument("--speed-only", action="store_true", help="only the generation speed table")
    parser.add_argument("--speed-prompts", type=int, default=8, help="prompts of the speed table")
    parser.add_argument("--speed-tokens", type=int, default=32, help="new tokens per prompt in the speed table")
    parser.add_argument("--speed-target", type=float, default=0.1, help="fraction of heads the policy zeroes")
    parser.add_argument("--shots", type=int, default=None, help="few-shot examples of the speed prompts (default 5)")
    parser.add_argument("--recompute-tokens", type=int, nargs="+", default=[64, 256],
                        help="new tokens per prompt of the recompute table")  # fmt: skip
    parser.add_argument("--recompute-scores", default="ahon_ln,awft", help="policies of the recompute table")
    parser.add_argument("--recompute-only", action="store_true", help="only the recompute table")
    parser.add_argument("--no-naive", action="store_true", help="recompute table without the naive recompute")
    parser.add_argument(
        "--naive-passes", type=int, default=0,
        help="time this many of the naive recompute's passes (replayed) instead of running all of them",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="every table at smoke size, into a temporary copy")
    parser.add_argument("--write", action="store_true", help="only render the cells stored so far")
    args = parser.parse_args()
    args.results = results_file(args.results, args.quick)
    if args.quick:
        _quick(args)
    if args.model is None:
        parser.error("--model is needed (a .gguf file or model directory), except with --quick")

    label = args.name or Path(args.model).stem
    run_dirs = [args.out / slug(f"{label}-gsm8k-n{args.limit}-t{args.max_gen_toks}-{mode}") for mode in args.modes]
    if args.write:  # the cells stored so far
        run_dirs = [d for d in run_dirs if (d / "run.json").is_file()]
        _write(run_dirs, label, args)
        return
    model, tok = ih.load_model(args.model, getattr(torch, args.dtype), device_map=args.device)
    if args.recompute_only:
        args.speed_only = args.no_speed = True
    for mode, run_dir in zip([] if args.speed_only else args.modes, run_dirs, strict=False):
        ih.sweep(
            model, tok, "gsm8k", run_dir, scores=args.scores.split(","), targets=args.targets, limit=args.limit,
            max_gen_toks=args.max_gen_toks, generation_mode=mode, batch_size=args.batch_size, data_dir=args.data_dir,
            model_name=label,
        )  # fmt: skip
    if not args.speed_only:
        _write(run_dirs, label, args)
    if args.no_speed and not args.recompute_only:
        return
    runs = _SpeedPrompts(model, tok, args)
    if not args.no_speed:
        speed_header = ["model", "generation", "prompts", "max new tokens", "new tokens/s", "vs transformers generate"]
        _emit("bench_generation_speed", speed_header, _speed(runs, args), 4, args)
    recompute_header = ["model", "policy", "prompts", "shots", "max new tokens", "generation", "new tokens/s",
                        "vs naive recompute", "vs running", "steps flipped", "tokens = naive"]  # fmt: skip
    _recompute_speed(runs, args, lambda rows: _emit("bench_generation_recompute", recompute_header, rows, 6, args))


if __name__ == "__main__":
    main()
