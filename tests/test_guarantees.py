"""The promises of a run directory (README, "Guarantees"): what is reused, what is refused, what concurrent runs do."""

from __future__ import annotations

import multiprocessing
import time

from inactive_heads.runs.store import ResultStore
from inactive_heads.scores import ScoreSpec


def _hold(root: str, key: str, ready, release) -> None:
    with ResultStore(root).claim(key) as got:
        assert got
        ready.set()
        release.wait(30)


def test_guarantee_a_claimed_cell_is_not_claimed_twice(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(tmp_path), "k1", ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        store = ResultStore(tmp_path)
        with store.claim("k1") as got:
            assert not got
        with store.claim("k2") as got:  # other cells stay free
            assert got
    finally:
        release.set()
        holder.join(30)
    with ResultStore(tmp_path).claim("k1") as got:
        assert got


def test_guarantee_a_killed_holder_releases_its_claim(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(tmp_path), "k", ready, release))
    holder.start()
    assert ready.wait(30)
    holder.kill()  # SIGKILL: no cleanup code runs
    holder.join(30)
    deadline = time.monotonic() + 10
    with ResultStore(tmp_path).claim("k", wait=True) as got:
        assert got and time.monotonic() < deadline
    assert not list(tmp_path.glob("k*.json"))  # a claim writes no cell


def _score_a(s):
    return s.ahon


def _score_b(s):
    return s.ahon * 2


def test_guarantee_a_score_is_identified_by_its_definition_not_its_name():
    a = ScoreSpec("x", "X", "below", _score_a, frozenset({"ahon"}))
    assert a.fingerprint == ScoreSpec("x", "X", "below", _score_a, frozenset({"ahon"})).fingerprint
    assert a.fingerprint != ScoreSpec("x", "X", "below", _score_b, frozenset({"ahon"})).fingerprint
    assert a.fingerprint != ScoreSpec("x", "X", "above", _score_a, frozenset({"ahon"})).fingerprint

    def closure(k):
        return lambda s: s.ahon * k

    assert ScoreSpec("x", "X", "below", closure(1)).fingerprint != ScoreSpec("x", "X", "below", closure(2)).fingerprint


# --- run directories -----------------------------------------------------------------------------------------------

import pytest  # noqa: E402
import torch  # noqa: E402
from _tiny import tiny_model, tiny_tokenizer  # noqa: E402

import inactive_heads as ih  # noqa: E402
from inactive_heads.runs.directory import load_run  # noqa: E402
from inactive_heads.tasks import Item, Task  # noqa: E402


def _task() -> Task:
    return Task("two", [Item(str(i), (f"Item {i} says",), (" yes", " no"), i % 2) for i in range(6)])


def _sweep(run_dir, model=None, tok=None, **kw):
    new = []
    ih.sweep(
        model or tiny_model("llama"),
        tok or tiny_tokenizer(),
        _task(),
        run_dir,
        scores=kw.pop("scores", ["ahon_ln"]),
        targets=[0.2],
        progress=False,
        on_cell=lambda key, cell: new.append(key),
        **kw,
    )
    return new


def test_guarantee_rerun_with_another_answer_changing_option_is_refused(tmp_path):
    tok = tiny_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    assert len(_sweep(tmp_path, tok=tok)) == 2
    with pytest.raises(ValueError, match=r"different run \(differs in \[.evaluation.\]\)"):
        _sweep(tmp_path, tok=tok, apply_chat_template=True)
    assert _sweep(tmp_path, tok=tok, batch_size=3) == []  # batch size does not change an answer: all reused


@pytest.fixture
def plugin_score(registrations):
    return "guarantee_score"


def test_guarantee_a_redefined_score_is_recomputed_not_reused(tmp_path, plugin_score):
    ih.register_score(plugin_score, needs={"ahon"})(lambda s: s.ahon)
    assert len(_sweep(tmp_path, scores=[plugin_score])) == 2
    assert _sweep(tmp_path, scores=[plugin_score]) == []
    ih.register_score(plugin_score, needs={"ahon"}, override=True)(lambda s: -s.ahon)
    assert len(_sweep(tmp_path, scores=[plugin_score])) == 1  # its cell again; the baseline is reused


def test_guarantee_another_model_never_mixes_with_a_run_whose_record_was_deleted(tmp_path):
    first = tmp_path / "first"
    _sweep(first)
    record = (first / "run.json").read_bytes()
    (first / "run.json").unlink()
    with pytest.raises(ValueError, match="calibration made for another run"):
        _sweep(first, model=tiny_model("llama", seed=1))
    assert not (first / "run.json").exists()  # the refused run did not claim the directory
    # Cells of another run copied in are never read as this run's.
    _sweep(tmp_path / "other", model=tiny_model("llama", seed=1))
    for cell in (tmp_path / "other" / "cells").glob("*.json"):
        (first / "cells" / f"foreign-{cell.name}").write_bytes(cell.read_bytes())
    (first / "run.json").write_bytes(record)
    with pytest.warns(UserWarning, match="ignored 2 cell"):
        run = load_run(first)
    assert len(run.cells) == 2


def _concurrent_sweep(run_dir: str, out) -> None:
    torch.set_num_threads(1)
    out.put(len(_sweep(run_dir, scores=["ahon_ln", "awft", "avvn_ln", "random"])))


def test_guarantee_concurrent_sweeps_compute_each_cell_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_concurrent_sweep, args=(str(tmp_path), out)) for _ in range(2)]
    for p in procs:
        p.start()
    counts = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    assert sum(counts) == 5  # baseline + 4 scores at one target, each computed by exactly one process
    assert len(list((tmp_path / "cells").glob("*.json"))) == 5


def test_guarantee_an_unwritable_run_directory_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    import errno
    from pathlib import Path

    from inactive_heads.cli import main

    model_dir = tmp_path / "model"
    tiny_model("llama").save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    real_write = Path.write_bytes

    def read_only(self, data):
        if "runs" in self.parts:
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_write(self, data)

    monkeypatch.setattr(Path, "write_bytes", read_only)
    run_dir = tmp_path / "runs" / "r"
    assert (
        main(["sweep", "--model", str(model_dir), "--task", "recall", "--limit", "4", "--run-dir", str(run_dir)]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("inactive-heads: error: cannot write into run directory") and "Traceback" not in err[-1]
    assert not (run_dir / "run.json").exists()
