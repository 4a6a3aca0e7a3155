"""Reports over stored runs: the document model, figures, tables, the report writer and run comparisons."""

from .compare import compare_runs
from .writer import write_report, write_study_report

__all__ = ["compare_runs", "write_report", "write_study_report"]
