"""Run directories: the crash-safe store, the run and cell records, and calibrate/sweep, which fill them."""

from .directory import Cell, RunData, RunDir, load_run
from .jobs import PlannedCell, calibrate, compute_cell, plan_cells, sweep

__all__ = ["Cell", "PlannedCell", "RunData", "RunDir", "calibrate", "compute_cell", "load_run", "plan_cells", "sweep"]
