"""What :func:`~inactive_heads.evaluation.evaluate` returns, and the provenance recorded with it."""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import transformers
from transformers import PreTrainedModel

from .. import _compat
from ..engine import Policy
from ..scores import HeadScores
from ..tasks import FEWSHOT_SEED, Task
from .config import EvalConfig

__all__ = ["EvalResult"]


@dataclass
class EvalResult:
    """Outcome of :func:`evaluate`. Lists are per evaluated item, in evaluation order (file order of the subset).

    ``metrics``: ``acc`` (micro average over items) and ``acc_norm`` where the task defines it (argmax of the
    log-likelihood divided by the choice's character length). ``loglikelihoods[i][c]``: summed log-probability of
    choice ``c``'s continuation tokens. ``zeroed_*``: measured fraction of zeroed heads over all rows (sequences),
    overall / per layer / per (layer, head), when a policy is active. ``scores``/``zeroed``: per-row tensors
    (rows as in ``rows``), not part of :meth:`to_dict`.

    Generative tasks (GSM8K): ``metrics`` holds lm-eval's ``exact_match,<filter>`` per filter and ``acc``, the first
    filter's (lm-eval's headline, strict-match); ``generations`` the text per item, ``answers[filter]`` the
    extracted answer and ``item_metrics[metric]`` the 0/1 score per item; ``generation`` the mode, tokens and
    tokens/s. ``pred`` is then 1 where the first filter's answer is right, ``gold`` all 1, and there are no
    log-likelihoods (``gold_loglikelihood`` None). ``zeroed`` rows are forward rows: one per prompt and step.
    """

    task: str
    metrics: dict[str, float]
    n_items: int
    item_ids: list[str]
    groups: list[str]
    gold: list[int]
    pred: list[int]
    pred_norm: list[int]
    loglikelihoods: list[list[float]]
    is_greedy: list[list[bool]]
    gold_loglikelihood: float | None
    group_metrics: dict[str, dict[str, float]]
    rows: list[tuple[int, int]]
    timing: dict[str, float]
    config: dict[str, Any]
    zeroed_fraction: float | None = None
    zeroed_per_layer: list[float] | None = None
    zeroed_per_head: list[list[float]] | None = None
    scores: HeadScores | None = field(default=None, repr=False)
    zeroed: torch.Tensor | None = field(default=None, repr=False)
    generations: list[str] | None = None
    answers: dict[str, list[str]] | None = None
    item_metrics: dict[str, list[float]] | None = None
    generation: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable view (everything but the ``scores`` and ``zeroed`` tensors)."""
        out = {k: v for k, v in asdict(self).items() if k not in ("scores", "zeroed")}
        out["rows"] = [list(r) for r in self.rows]
        return out


def _timing(
    t0: float, t_build: float, t_run: float, *, items: int, sequences: int, tokens: int, forward_tokens: int
) -> dict[str, float]:
    """``EvalResult.timing`` of an evaluation that started at ``t0``, finished building its requests at ``t_build``
    and its forwards at ``t_run`` (``time.perf_counter`` seconds); now is its end."""
    return {
        "total_s": time.perf_counter() - t0,
        "build_s": t_build - t0,
        "forward_s": t_run - t_build,
        "items_per_s": items / max(t_run - t_build, 1e-9),
        "sequences": sequences,
        "tokens": tokens,
        "forward_tokens": forward_tokens,
    }


def _policy_config(policy: Policy | None) -> dict[str, Any] | None:
    if policy is None:
        return None
    return {
        "score": policy.score,
        "threshold": policy.threshold,
        "seed": policy.seed,
        "mask": None if policy.mask is None else policy.mask.to(torch.int8).tolist(),
    }


def _provenance(
    task: Task, config: EvalConfig, shots: int, policy: Policy | None, record: bool, model: PreTrainedModel
) -> dict[str, Any]:
    """``EvalResult.config``: the options, the task's lm-eval settings, the model and the library versions."""
    return {
        "task": task.name,
        "shots": shots,
        "limit": config.limit,
        "seed": config.seed,
        "batch_size": config.batch_size,
        "fewshot_sampler": task.fewshot_sampler,
        "fewshot_seed": FEWSHOT_SEED,
        "fewshot_split": task.fewshot_split,
        "split": task.split,
        "sources": list(task.sources),
        "source": config.source,
        "data_dir": None if config.data_dir is None else str(config.data_dir),
        "apply_chat_template": config.apply_chat_template,
        "share_prefix": config.share_prefix,
        "fewshot_as_multiturn": config.fewshot_as_multiturn,
        "target_delimiter": task.target_delimiter,
        "fewshot_delimiter": task.fewshot_delimiter,
        "generation_mode": config.generation_mode,
        "max_gen_toks": config.max_gen_toks,
        "policy": _policy_config(policy),
        "record": record,
        "model": _compat.name_or_path(model),
        "model_class": type(model).__name__,
        "dtype": str(next(model.parameters()).dtype),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "notes": task.notes,
    }
