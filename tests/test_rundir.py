"""The run directory's records: the cell record's round trip and validation, the run record's match check, names."""

import json

import pytest

from inactive_heads.runs.directory import CELL_FIELDS, RUN_FIELDS, Cell, RunDir, load_run, run_record, slug


def _cell(**changes):
    record = {
        "score": "ahon",
        "target": 0.1,
        "threshold": 0.25,
        "inactive_when": "below",
        "accuracy": 0.5,
        "acc_norm": None,
        "mean_ll_correct": -1.25,
        "fraction_zeroed": 0.125,
        "per_layer": [0.0, 0.25],
        "per_head": [[0.0, 0.0], [0.5, 0.0]],
        "n_items": 4,
        "seconds": 1.5,
        "per_item": {"ids": ["a", "b"], "gold": [0, 1], "pred": [0, 0]},
    }
    record.update(changes)
    return record


def test_cell_round_trips_through_json():
    record = _cell()
    cell = Cell.from_json(json.loads(json.dumps(record)))
    assert cell.accuracy == 0.5 and cell.per_head == [[0.0, 0.0], [0.5, 0.0]]
    assert cell.to_json() == record and list(cell.to_json())[: len(CELL_FIELDS)] == list(CELL_FIELDS)
    baseline = _cell(score=None, target=None, threshold=None, inactive_when=None)
    del baseline["per_item"]
    assert Cell.from_json(baseline).to_json() == baseline  # per_item is optional and left out when absent


@pytest.mark.parametrize(
    "changes",
    [
        {"accuracy": None},
        {"accuracy": "0.5"},
        {"accuracy": True},
        {"fraction_zeroed": None},
        {"n_items": 4.0},
        {"per_head": [[0.0, "x"]]},
        {"per_layer": None},
        {"score": 3},
        {"per_item": []},
    ],
)
def test_cell_with_a_wrong_typed_field_is_rejected(changes):
    with pytest.raises(ValueError, match=rf"wrong type.*{next(iter(changes))}"):
        Cell.from_json(_cell(**changes))


def test_cell_missing_a_field_is_rejected():
    record = _cell()
    del record["seconds"]
    with pytest.raises(ValueError, match=r"missing.*seconds"):
        Cell.from_json(record)
    with pytest.raises(ValueError):
        Cell.from_json([record])


def test_malformed_cell_is_not_done_and_is_never_written(tmp_path):
    store = RunDir(tmp_path).cell_store()
    (tmp_path / "cells").mkdir()
    (tmp_path / "cells" / "bad.json").write_text(json.dumps(_cell(accuracy=None)))
    assert not store.has("bad") and store.keys() == []
    with pytest.raises(ValueError, match="accuracy"):
        store.put("bad", _cell(accuracy=None))
    store.put("bad", _cell())  # the next sweep replaces it
    assert store.get("bad") == _cell() and store.keys() == ["bad"]


def _run(**changes):
    fields = dict(
        name="m",
        identity={"class": "M"},
        task="piqa",
        task_items="abc",
        evaluation={"shots": 0, "limit": 8, "seed": 0},
        n_layers=2,
        n_heads=2,
    )
    return run_record(**{**fields, **changes})


def test_run_record_is_written_once_and_must_match(tmp_path):
    rd = RunDir(tmp_path)
    assert tuple(_run()) == RUN_FIELDS
    rd.write_run(_run())
    rd.write_run(_run())  # the same run again: run.json stays
    assert rd.read_run() == _run()
    with pytest.raises(ValueError, match=r"differs in \['evaluation'\]"):
        rd.write_run(_run(evaluation={"shots": 0, "limit": 9, "seed": 0}))
    with pytest.raises(ValueError, match="lacks"):
        RunDir(tmp_path / "other").write_run({"task": "piqa"})


def test_load_run_needs_run_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        load_run(tmp_path)


def test_slug_keeps_run_directory_names():
    # Default run directories are named by slug; existing ones are found again only if these never change.
    assert slug("SmolLM2-135M-Instruct.Q4_1-recall-s0") == "SmolLM2-135M-Instruct.Q4_1-recall-s0"
    assert slug("my model/v2 (final)-piqa-5shot-n100-s0") == "my-model-v2-final--piqa-5shot-n100-s0"
    assert slug("///") == "model"
