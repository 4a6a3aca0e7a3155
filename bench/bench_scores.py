"""Time and peak memory of recording all scores and of dynamic zeroing, against a plain SDPA forward and the
published approach (eager attention with the full [B,H,S,S] matrix, one score function per pass, 13 passes).

Times are measured in one process, the four methods interleaved, median of repeats. Peak memory is measured in a
fresh subprocess per method (the allocator keeps freed pages, so in-process numbers would depend on order): the
peak resident set during the forward minus the resident set just before it.

Each measured (model, S) updates its rows of the ``bench_scores`` table (overhead against a plain forward: needs the
methods sdpa, record, record_fwd and zeroing) and of ``bench_scores_published`` (the published approach against
record_fwd) in ``bench/RESULTS.md``.

    python bench/bench_scores.py [--models tiny smollm2] [--lengths 128 512 2048] [--methods ...] [--repeats N]
    python bench/bench_scores.py --quick       # the tiny model at S = 64, once, into a temporary copy of RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from _results import results_file, update_table  # bench/ is the script's directory, first on sys.path
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

import inactive_heads as ih
from inactive_heads.loading import demo_model_path, load_model

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED_SCORES = (
    "awft", "awft_ln", "aeqd", "aeqd_ln", "ftvvn", "ftvvn_ln", "avvn", "avvn_ln",
    "lthon", "lthon_ln", "lthon_hn", "ahon", "ahon_ln",
)  # fmt: skip
METHODS = ("sdpa", "record", "record_fwd", "zeroing", "published")

# ------------------------------------------------------------------ the published approach, as a registered function
_PUBLISHED: dict = {"score": None, "out": []}


def _published_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention materialising the softmax, computing the one score function of this pass from it."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    probs = torch.softmax(query @ key.transpose(-1, -2) * scaling + attention_mask, dim=-1)  # [B,H,S,S]
    out = probs @ value
    name = _PUBLISHED["score"]
    base = name.split("_")[0]
    if base == "awft":
        raw = probs[..., 0].mean(-1)
    elif base == "aeqd":
        raw = -(probs * torch.log(probs + 1e-12)).sum(-1).mean(-1)
    elif base == "ftvvn":
        raw = value[:, :, 0].norm(dim=-1)
    elif base == "avvn":
        raw = value.norm(dim=-1).mean(-1)
    elif base == "ahon":
        raw = out.norm(dim=-1).mean(-1)
    else:  # lthon*
        raw = out[:, :, -1].norm(dim=-1)
        if name in ("lthon_ln", "lthon_hn"):
            ahon = out.norm(dim=-1).mean(-1)
            raw = raw / (ahon.mean(-1, keepdim=True) if name == "lthon_ln" else ahon)
    if name.endswith("_ln") and base != "lthon":
        raw = raw / raw.mean(-1, keepdim=True)
    _PUBLISHED["out"].append(raw.cpu())
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register("published_eager", _published_attention)
AttentionMaskInterface.register("published_eager", eager_mask)


# ------------------------------------------------------------------------------------------------------- methods
def load_model_named(name: str):
    """The benchmark model ``name`` (tiny or smollm2), float32 on the CPU."""
    if name == "tiny":
        sys.path.insert(0, str(ROOT / "tests"))
        from _tiny import tiny_model

        return tiny_model("llama")
    if name == "smollm2":
        return load_model(demo_model_path())[0]
    raise SystemExit(f"unknown model {name!r}; choose tiny or smollm2")


def run_method(model, method: str, ids: torch.Tensor, threshold: float, passes: int = len(PUBLISHED_SCORES)) -> None:
    """One forward of ``method`` (one of METHODS) on ``ids``; ``passes`` of the published approach's 13."""
    with torch.no_grad():
        if method == "sdpa":
            model(input_ids=ids, use_cache=False)
        elif method == "record":  # what users call: the scores, no logits
            ih.record_scores(model, None, ids.tolist())
        elif method == "record_fwd":  # the scores riding on a full forward that also returns every logit
            with ih.watch(model, record=True):
                model(input_ids=ids, use_cache=False)
        elif method == "zeroing":
            with ih.zero_heads(model, score="ahon_ln", threshold=threshold):
                model(input_ids=ids, use_cache=False)
        elif method == "published":
            before = model.config._attn_implementation
            model.set_attn_implementation("published_eager")
            try:
                for score in PUBLISHED_SCORES[:passes]:
                    _PUBLISHED["score"] = score
                    model(input_ids=ids, use_cache=False)
            finally:
                model.set_attn_implementation(before)
        else:
            raise ValueError(method)


def random_ids(model, length: int) -> torch.Tensor:
    """One row of ``length`` random token ids (seeded by the length), on the device of the model's embeddings."""
    gen = torch.Generator().manual_seed(length)
    ids = torch.randint(4, model.config.vocab_size, (1, length), generator=gen)
    return ids.to(model.get_input_embeddings().weight.device)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _child(model_name: str, length: int, method: str) -> None:
    """Peak extra resident memory of one method's forward, printed as JSON."""
    model = load_model_named(model_name)
    ids = random_ids(model, length)
    run_method(model, method, ids[:, :64], 0.5)  # touch lazily initialised state before measuring
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.002)

    start = _rss()
    thread = threading.Thread(target=sample)
    thread.start()
    run_method(model, method, ids, 0.5, passes=1)  # passes run one after another: one pass has the peak of all 13
    stop.set()
    thread.join()
    print(json.dumps({"peak_extra_mb": (max(peak[0], _rss()) - start) / 2**20}))


def _memory(model_name: str, length: int, method: str) -> float:
    cmd = [sys.executable, __file__, "--child", model_name, str(length), method]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_extra_mb"]


def _times(model, length: int, repeats: int, methods: tuple[str, ...]) -> dict[str, float]:
    ids = random_ids(model, length)
    threshold = zeroing_threshold(model, ids)
    samples: dict[str, list[float]] = {m: [] for m in methods}
    for method in methods:  # warm-up on a short input
        run_method(model, method, ids[:, :64], threshold)
    for _ in range(repeats):
        for method in methods:
            start = time.perf_counter()
            run_method(model, method, ids, threshold)
            samples[method].append(time.perf_counter() - start)
    return {m: statistics.median(v) for m, v in samples.items()}


def zeroing_threshold(model, ids: torch.Tensor) -> float:
    """The AHON (LN) threshold that zeroes 10% of the heads on the first 256 tokens of ``ids``."""
    # 10% of heads on this input pass: a realistic zeroing load.
    with torch.no_grad(), ih.watch(model, record=True) as w:
        model(input_ids=ids[:, :256], use_cache=False)
    scores = w.scores
    assert scores is not None  # record=True
    return float(scores["ahon_ln"].quantile(0.1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"])
    parser.add_argument("--lengths", nargs="+", type=int, default=[128, 512, 2048])
    parser.add_argument("--results", type=Path, default=None, help="the results file (default: bench/RESULTS.md)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default: 1 to 5 by size)")
    parser.add_argument("--quick", action="store_true", help="a smoke run in seconds: the tiny model, S = 64, once")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]), args.child[2])
        return
    if args.quick:
        args.models, args.lengths, args.repeats = ["tiny"], [64], 1
    args.results = results_file(args.results, args.quick)
    methods = tuple(args.methods)
    for model_name in args.models:
        model = load_model_named(model_name)
        for length in args.lengths:
            big = model_name != "tiny" and length >= 2048
            repeats = args.repeats or (1 if big else (2 if model_name != "tiny" else 5))
            times = _times(model, length, repeats, methods)
            mem = {m: _memory(model_name, length, m) for m in methods}
            print(model_name, length, {m: round(t, 3) for m, t in times.items()}, {m: round(v) for m, v in mem.items()})
            _record(args.results, [model_name, str(length), str(repeats)], times, mem)  # at once: interruptions keep it


#: The two tables this script writes, the methods each needs and its columns after (model, S, repeats).
OVERHEAD_METHODS = ("sdpa", "record", "record_fwd", "zeroing")
OVERHEAD_HEADER = (
    "model", "S", "repeats", "SDPA s", "record s", "record+logits s", "zeroing s", "record/SDPA",
    "record+logits/SDPA", "zeroing/SDPA", "SDPA MB", "record MB", "record+logits MB", "zeroing MB",
    "record/SDPA mem", "record+logits/SDPA mem",
)  # fmt: skip
PUBLISHED_METHODS = ("record_fwd", "published")
PUBLISHED_HEADER = (
    "model", "S", "repeats", "record+logits s", "published s", "published/record+logits", "record+logits MB",
    "published MB",
)  # fmt: skip


def _record(path: Path, key: list[str], t: dict[str, float], m: dict[str, float]) -> None:
    """Update the rows of ``key`` in this script's sections of ``path``: each table whose methods all ran."""

    def ratio(d: dict[str, float], a: str, b: str, fmt: str) -> str:
        return format(d[a] / max(d[b], 1e-9), fmt)

    if all(x in t for x in OVERHEAD_METHODS):
        cells = [format(t[x], ".3f") for x in OVERHEAD_METHODS]
        cells += [ratio(t, x, "sdpa", ".2f") for x in ("record", "record_fwd", "zeroing")]
        cells += [format(m[x], ".0f") for x in OVERHEAD_METHODS]
        cells += [ratio(m, x, "sdpa", ".2f") for x in ("record", "record_fwd")]
        update_table("bench_scores", OVERHEAD_HEADER, [key + cells], key=2, path=path)
    if all(x in t for x in PUBLISHED_METHODS):
        cells = [format(t["record_fwd"], ".3f"), format(t["published"], ".3f")]
        cells += [ratio(t, "published", "record_fwd", ".1f"), format(m["record_fwd"], ".0f")]
        cells += [format(m["published"], ".0f")]
        update_table("bench_scores_published", PUBLISHED_HEADER, [key + cells], key=2, path=path)


if __name__ == "__main__":
    main()
