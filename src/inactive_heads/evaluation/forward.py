"""Right-padded batched forwards that compute logits only where a continuation is read, and the reading.

Only the needed (row, position) pairs go through the LM head; each sequence's continuation log-likelihoods and
greedy flags are then read from their log-probabilities.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

from .. import _compat
from .._tensors import pad_right
from .requests import _positions, _Seq

_Read = tuple[int, int, list[int]]  # (sequence, batch row, positions in that row predicting its continuation)


def _score_rows(
    seqs: list[_Seq],
    reads: list[_Read],
    logp: torch.Tensor,
    at: dict[tuple[int, int], int],
    lls: list[list[float]],
    greedy: list[list[bool]],
) -> None:
    """Read each sequence's continuation log-likelihoods from ``logp`` [kept, vocab]; ``at[row, position]`` is the
    kept index of a position."""
    for s, r, ps in reads:
        seq = seqs[s]
        rows = logp[torch.tensor([at[r, p] for p in ps], device=logp.device)]  # [n_positions, vocab]
        if seq.choice == -1:
            toks = torch.tensor([c[0] for c in seq.conts], device=logp.device)
            lls[s] = rows[0, toks].tolist()
            top = int(rows[0].argmax())
            greedy[s] = [int(t) == top for t in toks]
        else:
            toks = torch.tensor(seq.conts[0], device=logp.device)
            lls[s] = [float(rows.gather(1, toks[:, None]).sum())]
            greedy[s] = [bool((rows.argmax(-1) == toks).all())]


def _reads(seqs: list[_Seq], chunk: list[int], offsets: list[int]) -> list[_Read]:
    """Row ``r`` holds sequence ``chunk[r]`` minus its first ``offsets[r]`` tokens (a cached prefix)."""
    return [
        (s, r, [p - off for p in _positions(seqs[s])]) for r, (s, off) in enumerate(zip(chunk, offsets, strict=True))
    ]


class _Forward:
    """Right-padded batched forwards that compute logits only at the continuation positions of each row."""

    def __init__(self, model: PreTrainedModel, pad_id: int):
        self.model, self.pad_id = model, pad_id
        self.device = _compat.input_embedding_weight(model).device
        self.gather_ok = True
        self.tokens = 0  # token positions run through the model, padding included
        self.cache_kw = _compat.cache_kwarg(model)

    def prefill(self, rows: list[list[int]]) -> tuple[Any, torch.Tensor]:
        """KV cache of right-padded prefixes and their attention mask [G, width]."""
        ids, mask = pad_right(rows, pad_id=self.pad_id)
        self.tokens += ids.numel()
        out = self.model(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device), use_cache=True, logits_to_keep=1
        )
        return _compat.output_cache(out), mask

    def __call__(
        self,
        rows: list[list[int]],
        reads: list[_Read],
        past: Any = None,
        past_mask: torch.Tensor | None = None,
        starts: list[int] | None = None,
        tree: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, dict[tuple[int, int], int]]:
        """log-probs [N, vocab] of the N distinct (row, position) pairs that ``reads`` name, and the index of each
        pair; positions count from the row's first token.

        With ``past`` (a KV cache whose padded prefixes are described by ``past_mask``), row ``r`` continues a
        prefix of ``starts[r]`` real tokens: its positions start there, the padding between is masked out.
        With ``tree`` = (bool [B, 1, L, L] of allowed (query, key) pairs, position ids [B, L]) the rows are packed
        (see :func:`_run_packed`).
        """
        ids, mask = pad_right(rows, pad_id=self.pad_id)
        self.tokens += ids.numel()
        kwargs: dict[str, Any] = {"input_ids": ids.to(self.device), "use_cache": past is not None}
        if past is not None:
            assert past_mask is not None and starts is not None  # given with past
            mask = torch.cat([past_mask, mask], dim=1)
            pos = torch.tensor(starts)[:, None] + torch.arange(ids.shape[1])[None, :]
            kwargs.update({self.cache_kw: past, "position_ids": pos.to(self.device)})
        if tree is not None:
            allowed, pos = tree
            mask = allowed  # transformers passes a 4D mask through as is: bool for SDPA, additive for eager
            if _compat.attn_implementation(self.model) == "eager":
                dtype = _compat.input_embedding_weight(self.model).dtype
                mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
            kwargs["position_ids"] = pos.to(self.device)
        kwargs["attention_mask"] = mask.to(self.device)
        # Choices whose common start runs in the shared prefix of a packed row read the same positions.
        at = {rp: j for j, rp in enumerate(dict.fromkeys((r, p) for _, r, ps in reads for p in ps))}
        row_idx = torch.tensor([r for r, _ in at])
        col_idx = torch.tensor([p for _, p in at])
        head = self.model.get_output_embeddings()
        if self.gather_ok and head is not None:
            # Only the needed (row, position) pairs go through the LM head: its input is gathered to [1, N, hidden].
            # Anything after the head (soft-capping, scaling) is elementwise, so the logits are those of a full run.
            def gather(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
                h = args[0]
                return (h[row_idx.to(h.device), col_idx.to(h.device)][None], *args[1:])

            handle = head.register_forward_pre_hook(gather)
            try:
                logits = self.model(**kwargs).logits
            finally:
                handle.remove()
            if logits.shape[:2] == (1, len(at)):
                return torch.log_softmax(logits[0].float(), dim=-1), at
            self.gather_ok = False  # this model does not feed its hidden states through the output embeddings
        logits = self.model(**kwargs).logits
        return torch.log_softmax(logits[row_idx.to(logits.device), col_idx.to(logits.device)].float(), dim=-1), at
