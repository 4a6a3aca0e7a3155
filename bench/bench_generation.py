"""GSM8K generation under zeroing: the cascade in each generation mode, and generation speed.

Per mode (``--modes``), one sweep of ``gsm8k`` (``--limit`` items, ``--max-gen-toks``, ``--scores`` x ``--targets``,
calibrated on the evaluated prompts as the paper does) into ``--out/<model>-<mode>``; the runs resume when the
script is run again. Then:

* ``bench_generation_cascade`` in ``bench/RESULTS.md``: per mode and cell, exact match, the share of items whose
  generated tokens equal the unintervened run's, where the others first diverge, and tokens/s against the mode's
  unintervened generation (the report's cascade table, :func:`inactive_heads.report.tables.cascade_table`);
* ``bench_generation_speed``: tokens/s of transformers' ``generate`` (batched, left-padded, greedy) and of
  inactive-heads' generation without a policy and in each mode under AHON (LN), on ``--speed-prompts`` prompts
  with ``--speed-tokens`` new tokens (``--recompute-tokens`` for ``recompute``), one after the other in this process;
* a report over the runs in ``--out/report`` (its generation section is the same table).

    python bench/bench_generation.py --model FILE.gguf [--limit 20] [--max-gen-toks 128] [--modes step running]
    python bench/bench_generation.py --model FILE.gguf ... --write   # render what is stored so far
    python bench/bench_generation.py --model FILE.gguf --modes recompute running prompt --targets 0.1 0.2 \
        --device cuda --dtype bfloat16 --batch-size 32   # the full cascade on a GPU
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from _results import RESULTS, update_table  # bench/ is the script's directory, first on sys.path
from torch.nn.utils.rnn import pad_sequence

import inactive_heads as ih
from inactive_heads.evaluation.generative import prompt_tokens
from inactive_heads.generation import MODES, generate_until
from inactive_heads.report.tables import cascade_table
from inactive_heads.runs.directory import load_run, slug
from inactive_heads.tasks import get_task, subset

ROOT = Path(__file__).resolve().parent.parent


def _speed(model, tok, args: argparse.Namespace) -> list[list[str]]:
    """Tokens/s of transformers' generate, of generate_until without a policy and of each mode under AHON (LN) at
    the threshold that zeroes ``--speed-target`` of the heads on these prompts; each on the same prompts and batch
    size, one after the other, against transformers' generate with the same token budget (``recompute``, which re-runs
    every prefix, has its own smaller budget)."""
    task = get_task("gsm8k", args.data_dir)
    items = subset(task.items, args.speed_prompts, 0)
    config = ih.EvalConfig(limit=args.speed_prompts, data_dir=args.data_dir)
    prompts = prompt_tokens(task, items, config.shots_for(task), config, tok)
    spec = task.generation
    assert spec is not None
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def hf_generate(budget: int) -> float:
        new_tokens, start = 0, time.perf_counter()
        with torch.no_grad():
            for i in range(0, len(prompts), args.batch_size):
                rows = [torch.tensor(p) for p in prompts[i : i + args.batch_size]]
                ids = pad_sequence(rows, batch_first=True, padding_value=pad, padding_side="left")
                mask = pad_sequence([torch.ones_like(r) for r in rows], batch_first=True, padding_side="left")
                out = model.generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=budget, do_sample=False,
                    pad_token_id=pad, stop_strings=list(spec.until), tokenizer=tok,
                )  # fmt: skip
                new_tokens += int((out[:, ids.shape[1] :] != pad).sum())
        return new_tokens / (time.perf_counter() - start)

    scores = ih.record_scores(model, None, prompts, batch_size=args.batch_size)["ahon_ln"]
    threshold = ih.thresholds_from_cdf(scores, ih.SCORE_FUNCTIONS["ahon_ln"].inactive_when, [args.speed_target])[0]
    policy = ih.Policy(score="ahon_ln", threshold=threshold)
    label, target = args.name or Path(args.model).stem, f"AHON (LN) at {args.speed_target:g}"
    rows = []
    for budget, runs in (
        (
            args.speed_tokens,
            [("no policy", None, "step")] + [(f"{m}, {target}", policy, m) for m in ("step", "running", "prompt")],
        ),
        (args.recompute_tokens, [(f"recompute, {target}", policy, "recompute")]),
    ):
        hf_rate = hf_generate(budget)  # the baseline of every row with this token budget
        rows.append(
            [label, "transformers generate (KV cache)", str(len(prompts)), str(budget), f"{hf_rate:.1f}", "1.00x"]
        )
        for name, pol, mode in runs:
            got = generate_until(
                model, tok, prompts, until=spec.until, max_gen_toks=budget, batch_size=args.batch_size, policy=pol,
                mode=mode,
            )  # fmt: skip
            rows.append([label, f"inactive-heads: {name}", str(len(prompts)), str(budget), f"{got.tokens_per_s:.1f}",
                         f"{got.tokens_per_s / hf_rate:.2f}x"])  # fmt: skip
    return rows


def _write(run_dirs: list[Path], label: str, args: argparse.Namespace) -> None:
    """The cascade table of the runs' stored cells into RESULTS.md, and their report."""
    table = cascade_table([load_run(d) for d in run_dirs])
    if table is None:
        raise SystemExit("no generative cells stored yet")
    header, rows = table
    update_table(
        "bench_generation_cascade", ["model", "items", "max new tokens", *header],
        [[label, str(args.limit), str(args.max_gen_toks), *r] for r in rows], key=6, path=args.results,
    )  # fmt: skip
    ih.write_report(run_dirs, args.out / "report")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a .gguf file or model directory")
    parser.add_argument("--name", default=None)
    parser.add_argument("--modes", nargs="+", default=["step", "running", "prompt"], choices=MODES)
    parser.add_argument("--scores", default="ahon_ln,awft,random")
    parser.add_argument("--targets", type=float, nargs="+", default=[0.1])
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--max-gen-toks", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default=None, help="where the model goes, e.g. cuda (default: CPU)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_generation"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--no-speed", action="store_true", help="skip the generation speed table")
    parser.add_argument("--speed-only", action="store_true", help="only the generation speed table")
    parser.add_argument("--speed-prompts", type=int, default=8, help="prompts of the speed table")
    parser.add_argument("--speed-tokens", type=int, default=32, help="new tokens per prompt in the speed table")
    parser.add_argument("--recompute-tokens", type=int, default=8, help="new tokens per prompt, recompute mode")
    parser.add_argument("--speed-target", type=float, default=0.1, help="fraction of heads the policy zeroes")
    parser.add_argument("--write", action="store_true", help="only render the cells stored so far")
    args = parser.parse_args()

    label = args.name or Path(args.model).stem
    run_dirs = [args.out / slug(f"{label}-gsm8k-n{args.limit}-t{args.max_gen_toks}-{mode}") for mode in args.modes]
    if args.write:  # the cells stored so far
        run_dirs = [d for d in run_dirs if (d / "run.json").is_file()]
        _write(run_dirs, label, args)
        return
    model, tok = ih.load_model(args.model, getattr(torch, args.dtype), device_map=args.device)
    for mode, run_dir in zip([] if args.speed_only else args.modes, run_dirs, strict=False):
        ih.sweep(
            model, tok, "gsm8k", run_dir, scores=args.scores.split(","), targets=args.targets, limit=args.limit,
            max_gen_toks=args.max_gen_toks, generation_mode=mode, batch_size=args.batch_size, data_dir=args.data_dir,
            model_name=label,
        )  # fmt: skip
    if not args.speed_only:
        _write(run_dirs, label, args)
    if not args.no_speed:
        speed_header = ["model", "generation", "prompts", "max new tokens", "new tokens/s", "vs transformers generate"]
        update_table("bench_generation_speed", speed_header, _speed(model, tok, args), key=4, path=args.results)


if __name__ == "__main__":
    main()
