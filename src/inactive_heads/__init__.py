"""inactive-heads: find the attention heads of a decoder-only LLM that do nothing, zero them, measure the cost."""

from . import analysis
from ._sweep import calibrate, sweep
from ._version import __version__
from .compare import compare_runs
from .engine import Policy, RunningStats, Watch, record_scores, watch, zero_heads
from .evaluation import EvalConfig, EvalResult, evaluate
from .executors import EXECUTORS, Executor, register_executor
from .loading import load_model
from .pruning import HeadInactivity, head_inactivity, prune_heads, save_pruned, static_mask
from .report import write_report
from .scores import SCORE_FUNCTIONS, HeadScores, LayerStats, register_score
from .study import RunStatus, StudyResult, study, study_status
from .studyfile import Study, load_study
from .tasks import TASKS, register_task
from .thresholds import DEFAULT_TARGETS, thresholds_from_cdf

__all__ = [
    "DEFAULT_TARGETS",
    "EXECUTORS",
    "SCORE_FUNCTIONS",
    "TASKS",
    "EvalConfig",
    "EvalResult",
    "Executor",
    "HeadInactivity",
    "HeadScores",
    "LayerStats",
    "Policy",
    "RunStatus",
    "RunningStats",
    "Study",
    "StudyResult",
    "Watch",
    "__version__",
    "analysis",
    "calibrate",
    "compare_runs",
    "evaluate",
    "head_inactivity",
    "load_model",
    "load_study",
    "prune_heads",
    "record_scores",
    "register_executor",
    "register_score",
    "register_task",
    "save_pruned",
    "static_mask",
    "study",
    "study_status",
    "sweep",
    "thresholds_from_cdf",
    "watch",
    "write_report",
    "zero_heads",
]
