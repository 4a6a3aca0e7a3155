"""Every ``bench/bench_*.py`` has a ``--quick`` run that finishes and writes table rows, so no bench script can rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.slow
@pytest.mark.parametrize("script", [p.name for p in sorted(BENCH.glob("bench_*.py"))])
def test_quick_run_writes_rows_into_a_temporary_results_file(script, tmp_path, data_dir):
    env = {
        **os.environ,
        "TMPDIR": str(tmp_path),  # where --quick puts its results file and scratch folders
        "INACTIVE_HEADS_DATA": str(data_dir),
        "PYTHONPATH": str(BENCH.parent / "src"),
    }
    before = (BENCH / "RESULTS.md").read_text(encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick"], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (results,) = tmp_path.glob("bench-quick-*/RESULTS.md")
    assert any(line.startswith("|") for line in results.read_text(encoding="utf-8").splitlines())
    assert (BENCH / "RESULTS.md").read_text(encoding="utf-8") == before
