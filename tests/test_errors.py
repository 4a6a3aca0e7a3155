"""Bad input, faulty models and broken plugins: a clear error naming the cause, never a plausible wrong number."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import transformers
from _tiny import tiny_model, tiny_tokenizer

import inactive_heads as ih
from inactive_heads.cli import main
from inactive_heads.evaluation import evaluate
from inactive_heads.loading import load_model
from inactive_heads.scores import HeadScores
from inactive_heads.tasks import DataError, Item, Task, get_task


def _piqa_dir(tmp_path: Path, rows: str, labels: str) -> Path:
    (tmp_path / "piqa").mkdir()
    (tmp_path / "piqa" / "valid.jsonl").write_text(rows, encoding="utf-8")
    (tmp_path / "piqa" / "valid-labels.lst").write_text(labels, encoding="utf-8")
    return tmp_path


_PIQA_ROW = '{"goal": "Open a jar.", "sol1": "Twist the lid.", "sol2": "Eat the lid."}\n'


# --- benchmark files -------------------------------------------------------------------------------------------


def test_empty_benchmark_file_is_an_error_naming_it(tmp_path):
    data = _piqa_dir(tmp_path, "", "")
    with pytest.raises(DataError, match=r"valid\.jsonl holds no rows"):
        get_task("piqa", data)


def test_empty_mmlu_subject_file_is_an_error_not_a_dropped_subject(tmp_path, data_dir):
    mmlu = tmp_path / "mmlu"
    for split in ("dev", "val", "test"):
        (mmlu / split).mkdir(parents=True)
        for f in (data_dir / "mmlu" / split).iterdir():
            (mmlu / split / f.name).symlink_to(f)
    empty = mmlu / "test" / "anatomy_test.csv"
    empty.unlink()
    empty.write_text("")
    with pytest.raises(DataError, match=r"anatomy_test\.csv holds no rows"):
        get_task("mmlu", tmp_path)


def test_non_utf8_data_names_file_and_line(tmp_path):
    data = _piqa_dir(tmp_path, _PIQA_ROW * 2, "0\n1\n")
    path = data / "piqa" / "valid.jsonl"
    path.write_bytes(_PIQA_ROW.encode() + b'{"goal": "caf\xe9", "sol1": "a", "sol2": "b"}\n')
    with pytest.raises(DataError, match=r"valid\.jsonl, line 2: not UTF-8"):
        get_task("piqa", data)


# --- models that compute NaN -----------------------------------------------------------------------------------


def _two_choice_task() -> Task:
    items = [Item(str(i), (f"Item {i} says",), (" yes", " no"), i % 2) for i in range(4)]
    return Task("two", items)


@pytest.mark.parametrize("where", ["lm_head", "q_proj"])
def test_nan_in_the_model_raises_naming_the_item_not_a_plausible_accuracy(where):
    model, tok = tiny_model("llama"), tiny_tokenizer()
    with torch.no_grad():
        weight = model.lm_head.weight if where == "lm_head" else model.model.layers[1].self_attn.q_proj.weight
        weight[0, 0] = math.nan
    with pytest.raises(FloatingPointError, match=r"item 0 of task 'two'") as e:
        evaluate(model, tok, _two_choice_task())
    # A float32 model cannot be fixed by loading it in float32: the hint must point at the weights.
    assert "check the checkpoint" in str(e.value) and "load it with dtype" not in str(e.value)


def test_nan_in_a_half_precision_model_suggests_float32():
    model, tok = tiny_model("llama").to(torch.bfloat16), tiny_tokenizer()
    with torch.no_grad():
        model.lm_head.weight[0, 0] = math.nan
    with pytest.raises(FloatingPointError, match=r"load it with dtype=torch\.float32"):
        evaluate(model, tok, _two_choice_task())


# --- policies ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("threshold", "error"), [(math.nan, ValueError), (math.inf, ValueError), ("0.5", TypeError), (True, TypeError)]
)
def test_bad_threshold_is_refused_at_construction(threshold, error):
    model = tiny_model("llama")
    with pytest.raises(error, match="threshold"):
        ih.zero_heads(model, score="ahon_ln", threshold=threshold)
    with pytest.raises(error, match="threshold"):
        ih.Policy(score="ahon_ln", threshold=threshold)


# --- models ------------------------------------------------------------------------------------------------------


def test_truncated_gguf_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("INACTIVE_HEADS_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x01" * 9)  # a header cut off inside its tensor count
    with pytest.raises(ValueError, match="may be truncated"):
        load_model(path)


def test_missing_model_offline_fails_fast_naming_what_was_looked_for(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE is set") as e:
        load_model("no-such-org/no-such-model")
    assert "no-such-org/no-such-model" in str(e.value)


def test_unreachable_hub_fails_fast(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: connection refused at once
    with pytest.raises(FileNotFoundError, match="unreachable"):
        load_model("mistyped-model-name")


def test_encoder_model_is_refused_from_its_config_before_loading_weights(tmp_path, monkeypatch):
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    transformers.BertForMaskedLM(config).save_pretrained(tmp_path)

    def no_load(*args, **kwargs):
        raise AssertionError("weights were loaded before the model was refused")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    with pytest.raises(ValueError, match="encoder checkpoint"):
        load_model(tmp_path)


# --- plugins -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def broken(:\n", "SyntaxError at"),
        ("import no_such_module_xyz\n", "ModuleNotFoundError"),
        ("raise RuntimeError('boom')\n", "RuntimeError: boom"),
    ],
)
def test_broken_plugin_is_one_line_naming_the_file(tmp_path, capsys, source, message):
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text(source)
    assert main(["list", "--plugin", str(plugin)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("inactive-heads: error: plugin ") and str(plugin) in err[0]
    assert message in err[0]


@pytest.fixture
def bad_score(registrations):
    return "bad_score"


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda s: s.ahon[:, :1], r"returned \(\d+, 1\); it must return a tensor \[batch, n_heads\]"),
        (lambda s: s.ahon * math.nan, "returned only NaN"),
        (lambda s: s.no_such_field, "failed: AttributeError"),
    ],
)
def test_bad_plugin_score_is_named(bad_score, fn, message):
    ih.register_score(bad_score, needs={"ahon"})(fn)
    scores = HeadScores({"ahon": torch.rand(2, 3, 4)})
    with pytest.raises(ValueError, match=message) as e:
        scores.derive([bad_score])
    assert f"score {bad_score!r}" in str(e.value) and "test_errors.py" in str(e.value)
    model, tok = tiny_model("llama"), tiny_tokenizer()
    batch = tok(["Some text here", "More"], return_tensors="pt", padding=True)
    with pytest.raises(ValueError, match=message), ih.zero_heads(model, score=bad_score, threshold=0.5):
        model(**batch)


@pytest.mark.parametrize("name", ["scores.safetensors", "scores.float16.safetensors.xz"])
def test_a_file_that_is_not_a_scores_file_is_named_with_the_fix(tmp_path, name):
    path = tmp_path / name
    HeadScores({"ahon": torch.rand(2, 3, 4)}).save(path)
    path.write_bytes(path.read_bytes()[:40])  # cut short, as by a failed copy
    with pytest.raises(ih.InactiveHeadsError, match=r"is not a scores file written by HeadScores\.save .*record the"):
        HeadScores.load(path)


# --- command line ------------------------------------------------------------------------------------------------


def test_empty_score_list_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["sweep", "--model", "m", "--task", "recall", "--scores", ""])
    assert e.value.code == 2 and "got nothing" in capsys.readouterr().err


@pytest.mark.parametrize(
    "bad",
    [{"limit": -5}, {"shots": 999}, {"targets": [0.1, 2.0]}, {"calibration_limit": 0}],
)
def test_rejected_sweep_writes_nothing_so_the_corrected_one_runs(tmp_path, bad):
    model, tok = tiny_model("llama"), tiny_tokenizer()
    task = Task("two", [Item(str(i), (f"Item {i} says",), (" yes", " no"), i % 2) for i in range(4)], fewshot={"": []})
    kwargs = {"scores": ["ahon_ln"], "targets": [0.1], "limit": 4, "progress": False, **bad}
    with pytest.raises((ValueError, DataError)):
        ih.sweep(model, tok, task, tmp_path / "run", **kwargs)
    assert not (tmp_path / "run").exists()
    ih.sweep(model, tok, task, tmp_path / "run", scores=["ahon_ln"], targets=[0.1], limit=4, progress=False)
    assert (tmp_path / "run" / "run.json").is_file()


def test_bad_counts_are_refused_by_the_parser(capsys):
    for option, value in (("--limit", "-5"), ("--shots", "-1"), ("--batch-size", "0")):
        with pytest.raises(SystemExit) as e:
            main(["sweep", "--model", "m", "--task", "recall", option, value])
        assert e.value.code == 2 and f"argument {option}: must be >=" in capsys.readouterr().err
