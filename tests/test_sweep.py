import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import inactive_heads.evaluation as evaluation
from inactive_heads import sweep
from inactive_heads.runs.directory import load_run
from inactive_heads.tasks import Item, Task

_SCORES = ["ahon", "awft", "random"]
_TARGETS = [0.0, 0.2, 0.4]
_TESTS = Path(__file__).parent

_SETUP = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from _tiny import tiny_model, tiny_tokenizer
    from inactive_heads.tasks import Item, Task

    def toy():
        items = [Item(str(i), (f"Question {{i}}: pick one",), (" alpha", " beta"), i % 2) for i in range(8)]
        return tiny_model("llama", seed=3), tiny_tokenizer(), Task("toy", items)
    """
)

_CHILD = _SETUP + textwrap.dedent(
    """
    from inactive_heads import sweep

    model, tok, task = toy()

    def report(key, cell):
        print(key, flush=True)

    sweep(model, tok, task, sys.argv[1], scores={scores!r}, targets={targets!r}, limit=6, batch_size=4,
          progress=False, on_cell=report)
    print("finished", flush=True)
    """
)


def _toy():
    namespace: dict = {}
    exec(_SETUP.format(tests=str(_TESTS)), namespace)
    return namespace["toy"]()


def _snapshot(cells_dir: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in cells_dir.glob("*.json")}


def test_killed_sweep_resumes_without_recomputing(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    script = _CHILD.format(tests=str(_TESTS), scores=_SCORES, targets=_TARGETS)
    proc = subprocess.Popen([sys.executable, "-c", script, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline().strip() for _ in range(3)]
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL and "finished" not in lines
    assert (run_dir / "calibration" / "meta.json").is_file()
    before = _snapshot(run_dir / "cells")
    assert {f"{k}.json" for k in lines} <= set(before)

    calls = []
    real = evaluation.evaluate

    def counting(*args, **kwargs):
        calls.append((kwargs.get("policy"), kwargs.get("record", False)))
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluation, "evaluate", counting)
    model, tok, task = _toy()
    cells = sweep(model, tok, task, run_dir, scores=_SCORES, targets=_TARGETS, limit=6, batch_size=4, progress=False)

    grid = len(cells)
    assert 1 < grid <= 1 + len(_SCORES) * len(_TARGETS)
    assert not any(record for _, record in calls)  # calibration reused
    assert len(calls) == grid - len(before)  # only the unfinished cells ran
    after = _snapshot(run_dir / "cells")
    assert all(after[name] == before[name] for name in before)  # finished cells untouched
    assert len(after) == grid

    calls.clear()
    again = sweep(model, tok, task, run_dir, scores=_SCORES, targets=_TARGETS, limit=6, batch_size=4, progress=False)
    assert calls == [] and again == cells

    run = load_run(run_dir)
    assert run.run["task"] == "toy" and run.run["n_layers"] == 3 and run.run["n_heads"] == 4
    assert cells[0]["score"] is None and run.baseline == cells[0]["accuracy"]
    assert {c["score"] for c in cells[1:]} == set(_SCORES)
    for c in cells:
        if c["score"] is not None and c["target"] == 0.0:
            assert c["fraction_zeroed"] == 0.0  # p = 0 zeroes nothing
    assert json.loads((run_dir / "calibration" / "meta.json").read_text())["limit"] == 6


def test_sweep_refuses_a_different_run_in_the_same_directory(tmp_path):
    model, tok, task = _toy()
    sweep(model, tok, task, tmp_path, scores=["ahon"], targets=[0.0], limit=2, batch_size=4, progress=False)
    with pytest.raises(ValueError, match="different run"):
        sweep(model, tok, task, tmp_path, scores=["ahon"], targets=[0.0], limit=3, batch_size=4, progress=False)
    with pytest.raises(ValueError, match="not registered"):
        sweep(model, tok, task, tmp_path, scores=["nope"], limit=2, progress=False)


def test_same_task_name_with_other_items_is_refused(tmp_path):
    model, tok, task = _toy()
    sweep(model, tok, task, tmp_path, scores=["ahon"], targets=[0.0], limit=2, progress=False)
    other = Task("toy", [Item(f"x{i}", (f"Other question {i}",), (" a", " b"), 1) for i in range(4)])
    with pytest.raises(ValueError, match=r"different run \(differs in \['task_items'\]\)"):
        sweep(model, tok, other, tmp_path, scores=["ahon"], targets=[0.0], limit=2, progress=False)


def test_heldout_calibration_records_only_items_that_are_not_evaluated(tmp_path, monkeypatch):
    from inactive_heads import calibrate
    from inactive_heads.tasks import heldout, subset

    model, tok, task = _toy()
    seen: list[list[str]] = []
    real = evaluation.evaluate

    def spying(model, tok, task_obj, config, **kwargs):
        seen.append([it.id for it in subset(task_obj.items, config.limit, config.seed)])
        return real(model, tok, task_obj, config, **kwargs)

    monkeypatch.setattr(evaluation, "evaluate", spying)
    same = calibrate(model, tok, task, tmp_path / "same", limit=5, batch_size=4, progress=False)
    held = calibrate(
        model, tok, task, tmp_path / "held", limit=5, batch_size=4, progress=False, calibration_items="heldout"
    )
    evaluated = {it.id for it in subset(task.items, 5, 0)}
    assert set(seen[0]) == evaluated and not set(seen[1]) & evaluated
    assert set(seen[1]) == {it.id for it in task.items} - evaluated == {it.id for it in heldout(task, 5).items}
    assert same.shape[0] == 2 * 5 and held.shape[0] == 2 * 3 and held.meta["items"] == "heldout"
    # Each row's item, for bootstraps that resample items: the toy task's two choices per item run as two rows.
    assert same.meta["row_items"] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4] and held.meta["row_items"] == [0, 0, 1, 1, 2, 2]
    assert load_run(tmp_path / "same").row_items.tolist() == same.meta["row_items"]
    # The calibration's identity follows its items: the same run directory refuses to switch protocols.
    with pytest.raises(ValueError, match="other calibration items"):
        calibrate(
            model, tok, task, tmp_path / "same", limit=5, batch_size=4, progress=False, calibration_items="heldout"
        )


def test_heldout_calibration_needs_items_left_over_and_its_own_task():
    from inactive_heads import calibrate

    model, tok, task = _toy()
    with pytest.raises(ValueError, match="leaves none for a held-out calibration"):
        calibrate(model, tok, task, "unused", progress=False, calibration_items="heldout")
    with pytest.raises(ValueError, match="drop calibration_task"):
        calibrate(model, tok, task, "unused", limit=4, calibration_task=task, calibration_items="heldout")
    with pytest.raises(ValueError, match="'same' or 'heldout'"):
        calibrate(model, tok, task, "unused", limit=4, calibration_items="disjoint")  # type: ignore[arg-type]
