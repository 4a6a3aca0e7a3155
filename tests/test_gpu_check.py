"""``bench/gpu_check.py --quick`` runs every part of the GPU check on whatever device there is, so it cannot rot."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.slow
def test_gpu_check_quick_runs_every_part_and_writes_its_table(tmp_path, data_dir):
    results = tmp_path / "RESULTS.md"
    shutil.copy(BENCH / "RESULTS.md", results)
    before = results.read_text(encoding="utf-8")
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHONPATH": str(BENCH.parent / "src")}
    cmd = [sys.executable, str(BENCH / "gpu_check.py"), "--quick", "--results", str(results), "--data-dir", data_dir]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (tmp_path / "out" / "gpu_check.md").read_text(encoding="utf-8")
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    checks = {row.split(" | ")[1] for row in rows}
    assert {"scores vs float64", "zeroed logits vs float64", "split over devices vs one device"} <= checks
    assert {"time record/SDPA", "peak memory record/SDPA", "time published/record+logits"} <= checks
    assert any(c.startswith("evaluator items/s") for c in checks)
    assert "FAIL" not in table and "error" not in table and "skipped" not in table
    # Its rows went into the gpu_check section of the results file; the rest of the file is as it was.
    after = results.read_text(encoding="utf-8")
    assert all(row in after for row in rows)
    head, tail = before.split("<!-- gpu_check:begin -->")[0], before.split("<!-- gpu_check:end -->")[1]
    assert after.startswith(head) and after.endswith(tail)
