"""Distances between score distributions: exact 1-D Wasserstein-1, per score function and per relative depth."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, overload

import numpy as np
import torch

from ..errors import InactiveHeadsError

__all__ = ["depth_bins", "shared_wasserstein", "wasserstein1", "wasserstein_table"]

_Sample = torch.Tensor | np.ndarray | Sequence[float]


def _sample(x: _Sample) -> np.ndarray:
    arr = x.detach().cpu().double().reshape(-1).numpy() if isinstance(x, torch.Tensor) else np.asarray(x, np.float64)
    arr = np.sort(arr.reshape(-1)[~np.isnan(arr.reshape(-1))])
    if arr.size == 0:
        raise InactiveHeadsError("empty sample (or all NaN)")
    return arr


def wasserstein1(a: _Sample, b: _Sample) -> float:
    """Exact 1-Wasserstein distance between two 1-D empirical samples of any sizes (NaNs dropped).

    ``W1 = ∫ |F_a(x) - F_b(x)| dx``, equal to ``∫_0^1 |Q_a(u) - Q_b(u)| du`` for the quantile functions; both CDFs are
    step functions, so the integral is an exact sum over the merged sorted sample.
    """
    sa, sb = _sample(a), _sample(b)
    allv = np.concatenate([sa, sb])
    allv.sort()
    deltas = np.diff(allv)
    cdf_a = np.searchsorted(sa, allv[:-1], side="right") / sa.size
    cdf_b = np.searchsorted(sb, allv[:-1], side="right") / sb.size
    return float(np.sum(np.abs(cdf_a - cdf_b) * deltas))


def _depth_bins(n_layers: int, n_bins: int) -> list[list[int]]:
    # Layer l sits at relative depth (l + 0.5) / n_layers; bin b covers depths [b / n_bins, (b + 1) / n_bins).
    bins: list[list[int]] = [[] for _ in range(n_bins)]
    for layer in range(n_layers):
        bins[min(int((layer + 0.5) / n_layers * n_bins), n_bins - 1)].append(layer)
    return bins


def depth_bins(n_layers_a: int, n_layers_b: int) -> list[tuple[list[int], list[int]]]:
    """The layers of two models matched by relative depth: ``min(L_a, L_b)`` equal-width bins over depth
    ``(l + 0.5) / L``, each as (layers of a, layers of b); one layer each when the layer counts are equal."""
    n = min(n_layers_a, n_layers_b)
    return list(zip(_depth_bins(n_layers_a, n), _depth_bins(n_layers_b, n), strict=True))


@overload
def wasserstein_table(
    scores_a: Mapping[str, torch.Tensor],
    scores_b: Mapping[str, torch.Tensor],
    per_layer: Literal[False] = False,
    names: Iterable[str] | None = None,
) -> dict[str, float]: ...


@overload
def wasserstein_table(
    scores_a: Mapping[str, torch.Tensor],
    scores_b: Mapping[str, torch.Tensor],
    per_layer: Literal[True],
    names: Iterable[str] | None = None,
) -> dict[str, list[float]]: ...


@overload
def wasserstein_table(
    scores_a: Mapping[str, torch.Tensor],
    scores_b: Mapping[str, torch.Tensor],
    per_layer: bool,
    names: Iterable[str] | None = None,
) -> dict[str, float] | dict[str, list[float]]: ...


def wasserstein_table(
    scores_a: Mapping[str, torch.Tensor],
    scores_b: Mapping[str, torch.Tensor],
    per_layer: bool = False,
    names: Iterable[str] | None = None,
) -> dict[str, float] | dict[str, list[float]]:
    """W1 between two runs' recorded scores, per score function recorded in both (raw values, no rescaling).

    ``per_layer=False``: name -> distance between the pooled (rows x layers x heads) samples.
    ``per_layer=True``: name -> one distance per layer when both have the same layer count; otherwise per relative
    depth bin (:func:`depth_bins`), each bin's layers pooled, so a 12-layer and a 24-layer model are compared as 12
    bins of 1 resp. 2 layers. Head counts may differ.
    """
    chosen = [n for n in (scores_a if names is None else names) if n in scores_a and n in scores_b]
    if not per_layer:
        return {n: wasserstein1(scores_a[n], scores_b[n]) for n in chosen}
    out: dict[str, list[float]] = {}
    for n in chosen:
        ta, tb = scores_a[n], scores_b[n]
        out[n] = [wasserstein1(ta[:, ia], tb[:, ib]) for ia, ib in depth_bins(ta.shape[1], tb.shape[1])]
    return out


def shared_wasserstein(
    pairs: Sequence[tuple[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]]], names: Iterable[str] | None = None
) -> tuple[list[str], list[dict[str, float]]]:
    """Pooled W1 per score function of each pair of recorded scores (:func:`wasserstein_table`), and the score
    functions that every pair holds, in the first pair's order."""
    tables = [wasserstein_table(a, b, names=names) for a, b in pairs]
    shared = [n for n in tables[0] if all(n in t for t in tables)] if tables else []
    return shared, tables
