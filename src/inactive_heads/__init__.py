"""inactive-heads: find the attention heads of a decoder-only LLM that do nothing, zero them, measure the cost."""

from . import analysis
from ._sweep import calibrate, sweep
from ._version import __version__
from .compare import compare_runs
from .engine import Policy, Watch, record_scores, watch, zero_heads
from .evaluation import EvalConfig, EvalResult, evaluate
from .loading import load_model
from .report import write_report
from .scores import SCORE_FUNCTIONS, HeadScores, LayerStats, register_score
from .tasks import TASKS, register_task
from .thresholds import DEFAULT_TARGETS, thresholds_from_cdf

__all__ = [
    "DEFAULT_TARGETS",
    "SCORE_FUNCTIONS",
    "TASKS",
    "EvalConfig",
    "EvalResult",
    "HeadScores",
    "LayerStats",
    "Policy",
    "Watch",
    "__version__",
    "analysis",
    "calibrate",
    "compare_runs",
    "evaluate",
    "load_model",
    "record_scores",
    "register_score",
    "register_task",
    "sweep",
    "thresholds_from_cdf",
    "watch",
    "write_report",
    "zero_heads",
]
