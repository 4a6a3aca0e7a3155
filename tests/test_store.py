import json
import math
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from inactive_heads import __version__
from inactive_heads.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text
from inactive_heads.runs.store import ResultStore, cell_key

_FIELDS = {"model": "m@abc", "task": "piqa", "shots": 0, "limit": 100, "seed": 0, "score": "ahon", "threshold": 0.25}


def test_atomic_writes_roundtrip(tmp_path):
    atomic_write_bytes(tmp_path / "a" / "b.bin", b"\x00\x01")
    atomic_write_text(tmp_path / "t.txt", "héllo")
    atomic_write_json(tmp_path / "j.json", {"x": torch.tensor([1.5, 2.0]), "y": np.float32(0.5), "z": [np.int64(3)]})
    assert (tmp_path / "a" / "b.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == "héllo"
    assert json.loads((tmp_path / "j.json").read_text()) == {"x": [1.5, 2.0], "y": 0.5, "z": [3]}
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_failed_write_keeps_old_file_and_cleans_tmp(tmp_path, monkeypatch):
    path = tmp_path / "f.json"
    atomic_write_text(path, "old")

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_text(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_cell_key_is_canonical_and_sensitive():
    k = cell_key(**_FIELDS)
    assert k == cell_key(**dict(reversed(list(_FIELDS.items()))))  # order does not matter
    assert k == cell_key(**_FIELDS, package_version=__version__)  # version is part of the key by default
    assert len(k) == 32 and all(c in "0123456789abcdef" for c in k)
    for name, other in [("threshold", 0.25000001), ("seed", 1), ("shots", 5), ("score", None), ("limit", None)]:
        assert cell_key(**{**_FIELDS, name: other}) != k, name
    assert cell_key(**_FIELDS, package_version="9.9") != k
    with pytest.raises(ValueError):
        cell_key(**{**_FIELDS, "threshold": math.nan})


def test_store_put_get_has_keys(tmp_path):
    store = ResultStore(tmp_path / "cells", required=("accuracy",))
    assert store.keys() == [] and not store.has("k1")
    store.put("k1", {"accuracy": 0.5, "per_head": torch.zeros(2, 2)})
    store.put("k0", {"accuracy": 0.25})
    assert store.has("k1") and "k1" in store and len(store) == 2
    assert store.keys() == ["k0", "k1"]
    assert store.get("k1")["per_head"] == [[0.0, 0.0], [0.0, 0.0]]
    with pytest.raises(KeyError):
        store.get("nope")
    with pytest.raises(ValueError):
        store.put("k2", {"acc": 1})
    with pytest.raises(ValueError):
        store.path("../evil")


def test_held_tells_whether_another_holder_has_the_claim_without_creating_anything(tmp_path):
    store = ResultStore(tmp_path / "cells")
    assert not store.held("k") and not store.root.exists()  # never claimed: nothing written to say so
    with store.claim("k") as mine:
        assert mine and store.held("k")  # another open file: what another process's claim is to flock
    assert not store.held("k")  # let go
    with pytest.raises(ValueError):
        store.held("../evil")


@pytest.mark.parametrize("content", [b"", b'{"accuracy": 0.5', b"[1, 2]", b'{"other": 1}', b"\xff\xfe"])
def test_corrupt_cell_reported_missing_then_recomputed(tmp_path, content):
    store = ResultStore(tmp_path, required=("accuracy",))
    (tmp_path / "bad.json").write_bytes(content)
    assert not store.has("bad") and store.keys() == []
    with pytest.raises(KeyError):
        store.get("bad")
    store.put("bad", {"accuracy": 1.0})
    assert store.get("bad") == {"accuracy": 1.0}


_KILLED_WRITER = textwrap.dedent(
    """
    import os, sys, time

    # The store writes every cell through this module, which (unlike the runs package) imports no torch.
    from inactive_heads.atomic import atomic_write_json

    real_fsync = os.fsync
    def stall(fd):
        # The temp file is written but not yet renamed: tell the parent, then hang until killed.
        real_fsync(fd)
        print("ready", flush=True)
        time.sleep(60)
    os.fsync = stall
    atomic_write_json(os.path.join(sys.argv[1], sys.argv[2] + ".json"), {"accuracy": 0.9, "pad": "x" * 100000})
    """
)


@pytest.mark.parametrize("preexisting", [False, True])
def test_sigkill_mid_put_leaves_no_corrupt_cell(tmp_path, preexisting):
    store = ResultStore(tmp_path, required=("accuracy",))
    if preexisting:
        store.put("cell", {"accuracy": 0.1})
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(tmp_path), "cell"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # the crash really happened mid-write
    if preexisting:
        assert store.get("cell") == {"accuracy": 0.1}  # old answer intact, never a mix
    else:
        assert not store.has("cell") and store.keys() == []
    assert store.remove_stale_tmp() == 1
    store.put("cell", {"accuracy": 0.9})
    assert store.get("cell") == {"accuracy": 0.9} and store.keys() == ["cell"]
