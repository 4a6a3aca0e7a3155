"""The promises of a run directory (README, "Guarantees"): what is reused, what is refused, what concurrent runs do."""

from __future__ import annotations

import multiprocessing
import time

from inactive_heads.scores import ScoreSpec
from inactive_heads.store import ResultStore


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
