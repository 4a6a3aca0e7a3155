"""inactive-heads: find the attention heads of a decoder-only LLM that do nothing, zero them, measure the cost.

Names are imported on first use (PEP 562), so ``import inactive_heads`` and the command line's ``--help`` do not load
torch, transformers or matplotlib.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from . import stats as analysis
    from .engine import Policy, RunningStats, Watch, watch, zero_heads
    from .errors import InactiveHeadsError
    from .evaluation import EvalConfig, EvalResult, evaluate
    from .loading import load_model
    from .pruning import HeadInactivity, head_inactivity, prune_heads, save_pruned, static_mask
    from .pruning.measure import PruneResult, prune_and_measure
    from .recording import record_scores
    from .report import compare_runs, write_report
    from .runs import calibrate, sweep
    from .runs.adaptive import Search, SearchDesign, search
    from .scores import SCORE_FUNCTIONS, HeadScores, LayerStats, register_score
    from .stats.thresholds import DEFAULT_TARGETS, thresholds_from_cdf
    from .studies import (
        EXECUTORS,
        Executor,
        RunStatus,
        Study,
        StudyResult,
        load_study,
        register_executor,
        study,
        study_status,
    )
    from .tasks import TASKS, register_task

# name -> module that defines it (a module itself where the name is a module).
_LAZY = {
    "analysis": "stats",
    **dict.fromkeys(["Policy", "RunningStats", "Watch", "watch", "zero_heads"], "engine"),
    "InactiveHeadsError": "errors",
    **dict.fromkeys(["EvalConfig", "EvalResult", "evaluate"], "evaluation"),
    "load_model": "loading",
    **dict.fromkeys(["HeadInactivity", "head_inactivity", "prune_heads", "save_pruned", "static_mask"], "pruning"),
    **dict.fromkeys(["PruneResult", "prune_and_measure"], "pruning.measure"),
    "record_scores": "recording",
    **dict.fromkeys(["compare_runs", "write_report"], "report"),
    **dict.fromkeys(["calibrate", "sweep"], "runs"),
    **dict.fromkeys(["Search", "SearchDesign", "search"], "runs.adaptive"),
    **dict.fromkeys(["SCORE_FUNCTIONS", "HeadScores", "LayerStats", "register_score"], "scores"),
    **dict.fromkeys(["DEFAULT_TARGETS", "thresholds_from_cdf"], "stats.thresholds"),
    **dict.fromkeys(
        [
            "EXECUTORS",
            "Executor",
            "RunStatus",
            "Study",
            "StudyResult",
            "load_study",
            "register_executor",
            "study",
            "study_status",
        ],
        "studies",
    ),
    **dict.fromkeys(["TASKS", "register_task"], "tasks"),
}

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
    "InactiveHeadsError",
    "LayerStats",
    "Policy",
    "PruneResult",
    "RunStatus",
    "RunningStats",
    "Search",
    "SearchDesign",
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
    "prune_and_measure",
    "prune_heads",
    "record_scores",
    "register_executor",
    "register_score",
    "register_task",
    "save_pruned",
    "search",
    "static_mask",
    "study",
    "study_status",
    "sweep",
    "thresholds_from_cdf",
    "watch",
    "write_report",
    "zero_heads",
]


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        # A submodule (``ih.pruning``) is imported on first use too, as an eager package would have made it visible.
        if importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return importlib.import_module(f".{name}", __name__)
    module = importlib.import_module(f".{where}", __name__)
    value = module if name == "analysis" else getattr(module, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
