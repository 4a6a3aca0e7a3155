"""Small tensor helpers shared by the engine and the evaluator: right-padding token rows, undoing a reordering."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_right(
    sequences: Sequence[Sequence[int]], *, pad_id: int = 0, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token id lists into input_ids [B, S] and attention_mask [B, S] (real tokens keep positions 0..n-1)."""
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        input_ids[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
        attention_mask[row, : len(seq)] = 1
    return input_ids.to(device), attention_mask.to(device)


def inverse_permutation(order: Sequence[int]) -> torch.Tensor:
    """``inverse`` with ``inverse[order[i]] = i``: indexing rows produced in ``order`` by it restores index order."""
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
    return inverse
