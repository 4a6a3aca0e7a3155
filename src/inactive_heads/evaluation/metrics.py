"""From per-sequence reads to per-item log-likelihoods, predictions and metrics, as lm-eval computes them."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..errors import NonFiniteError, non_finite_hint
from ..tasks import Item
from .requests import _Seq


def _per_item(
    items: list[Item], seqs: list[_Seq], lls_seq: list[list[float]], greedy_seq: list[list[bool]]
) -> tuple[list[list[float]], list[list[bool]]]:
    """Per item and choice: the continuation's log-likelihood and whether it is the greedy continuation."""
    lls: list[list[float]] = [[math.nan] * it.n_choices for it in items]
    greedy: list[list[bool]] = [[False] * it.n_choices for it in items]
    for s, seq in enumerate(seqs):
        if seq.choice == -1:
            lls[seq.item], greedy[seq.item] = list(lls_seq[s]), list(greedy_seq[s])
        else:
            lls[seq.item][seq.choice] = lls_seq[s][0]
            greedy[seq.item][seq.choice] = greedy_seq[s][0]
    return lls, greedy


def _check_finite(task: str, items: list[Item], lls: list[list[float]], dtype: torch.dtype) -> None:
    for it, x in zip(items, lls, strict=True):
        if not all(math.isfinite(v) for v in x):
            # NaN compares false, so argmax would silently pick choice 0 and yield a plausible accuracy.
            raise NonFiniteError(
                f"item {it.id} of task {task!r}: log-likelihoods {x} are not finite; {non_finite_hint(dtype)}"
            )


def _argmax(values: Sequence[float]) -> int:
    best = 0
    for i, v in enumerate(values):  # first maximum, as numpy.argmax
        if v > values[best]:
            best = i
    return best


def _predictions(items: list[Item], lls: list[list[float]]) -> tuple[list[int], list[int]]:
    """Per item: the choice of highest log-likelihood, and of highest log-likelihood per character (acc_norm)."""
    pred = [_argmax(x) for x in lls]
    pred_norm = [
        _argmax([v / len(t) for v, t in zip(x, it.choice_texts, strict=True)]) for x, it in zip(lls, items, strict=True)
    ]
    return pred, pred_norm


def _accuracy(
    items: list[Item], pred: list[int], pred_norm: list[int], with_norm: bool
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """``acc`` (and ``acc_norm`` when ``with_norm``) averaged over items, and per group with the group's ``n``."""
    gold = [it.gold for it in items]
    acc = [float(p == g) for p, g in zip(pred, gold, strict=True)]
    acc_norm = [float(p == g) for p, g in zip(pred_norm, gold, strict=True)]
    n = max(len(items), 1)
    metrics = {"acc": sum(acc) / n}
    if with_norm:
        metrics["acc_norm"] = sum(acc_norm) / n
    group_metrics: dict[str, dict[str, float]] = {}
    for it, a, an in zip(items, acc, acc_norm, strict=True):
        g = group_metrics.setdefault(
            it.group, {"n": 0, "acc": 0.0, **({"acc_norm": 0.0} if "acc_norm" in metrics else {})}
        )
        g["n"] += 1
        g["acc"] += a
        if "acc_norm" in g:
            g["acc_norm"] += an
    for g in group_metrics.values():
        for key in ("acc", "acc_norm"):
            if key in g:
                g[key] /= g["n"]
    return metrics, group_metrics


def _gold_loglikelihood(items: list[Item], lls: list[list[float]]) -> float:
    """Mean log-likelihood of the correct choice."""
    return sum(x[it.gold] for x, it in zip(lls, items, strict=True)) / max(len(items), 1)


def _zeroed_fractions(zeroed: torch.Tensor | None) -> tuple[float | None, list[float] | None, list[list[float]] | None]:
    """Fraction of zeroed heads over all rows [rows, layers, heads]: overall, per layer, per (layer, head)."""
    if zeroed is None or not zeroed.numel():
        return None, None, None
    return float(zeroed.float().mean()), zeroed.float().mean(dim=(0, 2)).tolist(), zeroed.float().mean(dim=0).tolist()
