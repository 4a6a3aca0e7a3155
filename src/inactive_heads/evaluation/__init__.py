"""Benchmark evaluation by log-likelihood, reproducing lm-evaluation-harness 0.4.x (HFLM) scoring.

:func:`evaluate` takes its options as an :class:`EvalConfig` (or the same fields by name). Requests are built and
tokenised as lm-eval does (:mod:`.requests`), batched with shared contexts run once where allowed
(:mod:`.batching`, :mod:`.forward`) and scored into metrics (:mod:`.metrics`). Under a policy or with
``record=True`` all forwards run inside one :func:`inactive_heads.engine.watch`; its rows (one per sequence) are
put back in a stable order: items in evaluation order, choices in order within an item.
``EvalResult.rows[r] = (item position, choice)`` names row ``r`` (choice ``-1``: the row serves every choice of the
item).
"""

from .config import EvalConfig
from .evaluator import evaluate
from .requests import check_request
from .result import EvalResult

__all__ = ["EvalConfig", "EvalResult", "check_request", "evaluate"]
