"""inactive-heads: find the attention heads of a decoder-only LLM that do nothing, zero them, measure the cost."""

from .engine import Policy, Watch, record_scores, watch, zero_heads
from .scores import SCORE_FUNCTIONS, HeadScores, LayerStats, register_score

__version__ = "0.1.0"

__all__ = [
    "SCORE_FUNCTIONS",
    "HeadScores",
    "LayerStats",
    "Policy",
    "Watch",
    "__version__",
    "record_scores",
    "register_score",
    "watch",
    "zero_heads",
]
