"""What the bench scripts' ``--quick`` runs share: the tests' tiny random llama, in memory or as a model folder."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

__all__ = ["tiny", "tiny_dir"]

_TESTS = Path(__file__).resolve().parent.parent / "tests"


def tiny() -> tuple[Any, Any]:
    """The tests' tiny random llama and its byte-level tokenizer."""
    if str(_TESTS) not in sys.path:
        sys.path.insert(0, str(_TESTS))
    from _tiny import tiny_model, tiny_tokenizer

    return tiny_model("llama"), tiny_tokenizer()


def tiny_dir(root: Path, max_positions: int | None = None) -> Path:
    """:func:`tiny` saved as ``root / "tiny"``, loadable by path as a study or the CLI loads a model;
    ``max_positions`` raises its position limit (byte-level tokens make long prompts)."""
    model, tokenizer = tiny()
    if max_positions is not None:
        model.config.max_position_embeddings = max_positions
    model.save_pretrained(root / "tiny")
    tokenizer.save_pretrained(root / "tiny")
    return root / "tiny"
