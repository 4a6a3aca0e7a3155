"""Small tensor helpers shared by the engine, the evaluator and generation: padding token rows (right for scoring,
left for generation), undoing a reordering."""

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


def pad_left(
    sequences: Sequence[Sequence[int]], *, pad_id: int = 0, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad token id lists, as generation pads prompts: input_ids, attention_mask and position_ids [B, S], the
    positions counting real tokens only (pads get 0), so each row sees the positions it has alone."""
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        input_ids[row, width - len(seq) :] = torch.as_tensor(list(seq), dtype=torch.long)
        attention_mask[row, width - len(seq) :] = 1
    return input_ids.to(device), attention_mask.to(device), real_positions(attention_mask).to(device)


def real_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids [B, S] that count real tokens only (pads get 0), as transformers' generate derives them."""
    return (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)


def inverse_permutation(order: Sequence[int]) -> torch.Tensor:
    """``inverse`` with ``inverse[order[i]] = i``: indexing rows produced in ``order`` by it restores index order."""
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
    return inverse
