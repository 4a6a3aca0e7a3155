"""Studies: the study file, the executors that place its jobs on workers (local or Ray), and the runner."""

from .executors import EXECUTORS, Executor, Resources, register_executor
from .file import Study, StudyFileError, load_study
from .runner import RunStatus, StudyResult, study, study_status

__all__ = [
    "EXECUTORS",
    "Executor",
    "Resources",
    "RunStatus",
    "Study",
    "StudyFileError",
    "StudyResult",
    "load_study",
    "register_executor",
    "study",
    "study_status",
]
