"""How much work an evaluation does: token positions, LM-head rows and FLOPs, measured and at the lower bound.

:class:`Work` counts what every forward of a model computes while it is active (hooks on the model and its
output embeddings), whichever tool runs it. :func:`minimal_work` is the least any exact evaluator of the same
requests must compute: every distinct token prefix once, no padding, the LM head only where a log-probability is
read. FLOPs (:meth:`Work.flops`) count the matrix products: the model body per token position (padding included),
the LM head per row it runs on, and attention per (query, key) pair a forward's shapes imply (a dense kernel's
work; causal kernels may skip some). Norms, activations and the softmax are left out: a few percent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Work", "minimal_work"]


@dataclass
class Work:
    """Token positions, LM-head rows and attention (query, key) pairs counted over forwards."""

    tokens: int = 0
    head_rows: int = 0
    pairs: int = 0
    forwards: int = 0

    def flops(self, model: Any) -> float:
        """Matrix-product FLOPs of this work on ``model`` (see the module docstring)."""
        cfg = model.config
        head = model.get_output_embeddings().weight
        embed = model.get_input_embeddings().weight
        tied = head.data_ptr() == embed.data_ptr()
        body = sum(p.numel() for p in model.parameters()) - embed.numel() - (0 if tied else head.numel())
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        attn = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim  # QK^T and AV per (query, key)
        return 2.0 * body * self.tokens + 2.0 * head.numel() * self.head_rows + float(attn) * self.pairs

    def count(self, model: Any) -> _Counting:
        """Context manager adding every forward of ``model`` inside it to this count."""
        return _Counting(self, model)


class _Counting:
    def __init__(self, work: Work, model: Any):
        self.work, self.model = work, model
        self.handles: list[Any] = []

    def _forward(self, _module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        mask = kwargs.get("attention_mask")
        rows, length = ids.shape
        keys = length if mask is None else mask.shape[-1]  # 2D [B, past + L] or 4D [B, 1, L, past + L]
        self.work.tokens += rows * length
        self.work.pairs += rows * length * keys
        self.work.forwards += 1

    def _head(self, _module: Any, _args: Any, out: Any) -> None:
        self.work.head_rows += out.shape[:-1].numel()  # after any hook that gathers the head's input

    def __enter__(self) -> Work:
        self.handles = [
            self.model.register_forward_pre_hook(self._forward, with_kwargs=True),
            self.model.get_output_embeddings().register_forward_hook(self._head),
        ]
        return self.work

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()


def minimal_work(seqs: list[tuple[list[int], list[int]]]) -> Work:
    """The least work an exact evaluator of ``seqs`` ((tokens, read positions), as
    :func:`inactive_heads.evaluation.requests.token_sequences` gives them) does: the nodes of the token trie of all
    sequences (each distinct prefix once, wherever it is shared: an item's choices, a few-shot block, a common
    opening), the distinct prefixes whose next-token log-probabilities are read, and causal attention over each
    node's depth."""
    root: dict[int, Any] = {}
    work = Work()
    read: set[int] = set()
    for tokens, positions in seqs:
        node = root
        reads = set(positions)
        for p, tok in enumerate(tokens):
            if tok not in node:
                node[tok] = {}
                work.tokens += 1
                work.pairs += p + 1
            node = node[tok]
            if p in reads:
                read.add(id(node))
    work.head_rows = len(read)
    return work
