"""The errors a user can fix: every error naming a file, key or option derives from :class:`InactiveHeadsError`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["InactiveHeadsError", "non_finite_hint"]


class InactiveHeadsError(ValueError):
    """Bad input that the user can fix (a file, key, option or value); the message names the fix.

    The CLI prints it as one line with exit status 2; any other exception is a bug and keeps its traceback.
    """


def non_finite_hint(dtype: torch.dtype) -> str:
    """What to try when a model computes NaN/inf: half precision overflows; a float32 model has bad weights."""
    # By name, so that importing this module (the CLI does, to catch its errors) does not import torch.
    if str(dtype) in ("torch.float32", "torch.float64"):
        return f"the model is {dtype}, so its weights (or inputs) hold NaN/inf: check the checkpoint"
    return f"the model is {dtype}, which can overflow: load it with dtype=torch.float32"


class UnknownNameError(InactiveHeadsError, KeyError):
    """A name that no registry holds (a score function, task or executor); also a KeyError, as a lookup."""

    def __str__(self) -> str:  # KeyError's own quotes the message as a repr
        return str(self.args[0]) if self.args else ""


class UnsupportedModelError(InactiveHeadsError, NotImplementedError):
    """A model the engine cannot hook or pruning cannot shrink (its architecture, not the user's call, is the cause)."""


class NonFiniteError(InactiveHeadsError, FloatingPointError):
    """A model computed NaN/inf; the message says what to try (:func:`non_finite_hint`)."""
