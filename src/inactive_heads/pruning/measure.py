"""Prune a calibrated model and measure what it saves and costs: size, KV cache, prefill speed, task accuracy."""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from ..atomic import atomic_write_json
from ..errors import InactiveHeadsError
from ..evaluation import EvalConfig, evaluate
from ..runs.directory import RunDir, check_model
from . import cost
from .checkpoint import require_new_directory, save_pruned
from .mask import static_mask
from .surgery import prune_heads

__all__ = ["PruneResult", "check_fraction", "prune_and_measure"]


@dataclass(frozen=True)
class PruneResult:
    """What :func:`prune_and_measure` found, unpruned first in each pair; also written to ``out/pruning.json``."""

    out: Path
    score: str
    fraction: float
    removed_heads: list[list[int]]
    n_heads: int
    parameter_bytes: tuple[int, int]
    kv_cache_bytes_per_token: tuple[int, int]
    prefill_tokens: int
    prefill_speedup: float
    repeats: int
    task: str
    evaluation: dict[str, Any]
    accuracy: tuple[float, float]

    @property
    def removed(self) -> int:
        return sum(len(row) for row in self.removed_heads)

    def summary(self) -> str:
        """Three lines for a terminal."""
        params, kv, (before, after) = self.parameter_bytes, self.kv_cache_bytes_per_token, self.accuracy
        return (
            f"pruned {self.removed} of {self.n_heads} heads by {self.score} -> {self.out}\n"
            f"  parameters {params[1] / params[0]:.3f}x, KV cache {kv[1] / kv[0]:.3f}x, "
            f"prefill of {self.prefill_tokens} tokens {self.prefill_speedup:.2f}x faster (median of {self.repeats})\n"
            f"  {self.task} accuracy {100 * before:.2f}% -> {100 * after:.2f}% ({100 * (after - before):+.2f} points)"
        )


def check_fraction(fraction: object, n_heads: int | None = None) -> float:
    """``fraction`` as a float in (0, 1) that removes at least one of ``n_heads`` heads (when given);
    InactiveHeadsError otherwise. Needs no model, so a command checks it before one loads."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction < 1.0:
        raise InactiveHeadsError(f"the fraction of heads to remove must be a number in (0, 1), got {fraction!r}")
    if n_heads is not None and round(fraction * n_heads) == 0:
        raise InactiveHeadsError(
            f"a fraction of {fraction:g} removes none of the model's {n_heads} heads; use a fraction >= "
            f"{0.5 / n_heads:.2g}"
        )
    return float(fraction)


def prune_and_measure(
    model: PreTrainedModel,
    tokenizer: Any,
    run_dir: str | Path,
    *,
    score: str,
    fraction: float,
    out: str | Path,
    limit: int | None = None,
    data_dir: str | Path | None = None,
    batch_size: int = 8,
    prefill_tokens: int = 512,
    repeats: int = 3,
) -> PruneResult:
    """Remove the ``fraction`` of heads most often inactive by ``score`` on the calibration of ``run_dir``, save the
    pruned model to the new directory ``out``, and measure it against ``model`` (left unpruned): parameter and
    KV-cache bytes, prefill speed-up (median of ``repeats`` interleaved runs), and accuracy on the run's task and
    evaluation settings (``limit`` items if given)."""
    rd = RunDir(run_dir)
    run = rd.read_run()
    check_model(run, model)
    fraction = check_fraction(fraction, run["n_layers"] * run["n_heads"])
    out = Path(out)
    require_new_directory(out)
    mask = static_mask(rd.read_calibration(score), score=score, fraction=fraction)
    pruned = prune_heads(copy.deepcopy(model), mask)
    save_pruned(pruned, out, tokenizer)

    config = EvalConfig(**run.get("evaluation", {}), data_dir=data_dir, batch_size=batch_size)
    if limit is not None:
        config = config.replace(limit=limit)
    task = run["task"]
    print(f"evaluating {task} ({config.limit or 'all'} items), unpruned and pruned", file=sys.stderr)
    before = evaluate(model, tokenizer, task, config).metrics["acc"]
    after = evaluate(pruned, tokenizer, task, config).metrics["acc"]
    times = cost.interleaved(
        {
            "unpruned": lambda: cost.prefill_seconds(model, prefill_tokens),
            "pruned": lambda: cost.prefill_seconds(pruned, prefill_tokens),
        },
        repeats,
    )
    ratios = sorted(b / p for b, p in zip(times["unpruned"], times["pruned"], strict=True))
    result = PruneResult(
        out=out,
        score=score,
        fraction=fraction,
        removed_heads=[row.nonzero().flatten().tolist() for row in mask],
        n_heads=mask.numel(),
        parameter_bytes=(cost.parameter_bytes(model), cost.parameter_bytes(pruned)),
        kv_cache_bytes_per_token=(cost.kv_cache_bytes(model, 1), cost.kv_cache_bytes(pruned, 1)),
        prefill_tokens=prefill_tokens,
        prefill_speedup=ratios[len(ratios) // 2],
        repeats=repeats,
        task=task,
        evaluation=config.identity(),
        accuracy=(before, after),
    )
    atomic_write_json(
        out / "pruning.json",
        {
            "run_dir": str(run_dir),
            "score": score,
            "fraction": fraction,
            "removed_heads": result.removed_heads,
            "parameter_bytes": list(result.parameter_bytes),
            "kv_cache_bytes_per_token": list(result.kv_cache_bytes_per_token),
            f"prefill_speedup_S{prefill_tokens}": result.prefill_speedup,
            "task": task,
            "evaluation": result.evaluation,
            "accuracy": list(result.accuracy),
        },
    )
    return result
