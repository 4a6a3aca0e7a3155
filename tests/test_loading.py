"""load_model: GGUF de-quantised once and cached; clear errors for bad specs; the real model against the reference."""

from __future__ import annotations

import time

import pytest
import torch
import transformers
from _reference import reference_run
from _tiny import tiny_model, tiny_tokenizer

import inactive_heads as ih
from inactive_heads.loading import load_model

_TEXTS = ["The capital of France is Paris.", "def add(a, b):\n    return a + b"]


def test_missing_path_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        load_model(tmp_path / "nope.gguf")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(str(tmp_path / "a" / "b" / "c"))
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_model(tmp_path)


def test_a_path_from_the_home_folder_loads(tmp_path, monkeypatch):
    """``~/...`` is the home folder, as in a shell and a study file; the identity records the expanded path."""
    tiny_model("llama").save_pretrained(tmp_path / "tiny")
    tiny_tokenizer().save_pretrained(tmp_path / "tiny")
    monkeypatch.setenv("HOME", str(tmp_path))
    model, _ = load_model("~/tiny")
    assert model.inactive_heads_source["spec"] == str(tmp_path / "tiny")
    with pytest.raises(FileNotFoundError, match=f"no GGUF file at {tmp_path}"):
        load_model("~/nope.gguf")


def test_corrupt_gguf_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("INACTIVE_HEADS_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ValueError, match=r"cannot read GGUF file .*broken\.gguf"):
        load_model(bad)
    assert not any((tmp_path / "cache").glob("gguf-*"))


def test_not_a_causal_lm_is_named(tmp_path):
    transformers.T5Config(num_layers=1, d_model=8, d_ff=8, num_heads=1, d_kv=8).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"T5Config.*causal LM"):
        load_model(tmp_path)


@pytest.mark.slow
def test_smollm2_gguf_second_load_reads_the_cache(smollm2, smollm2_gguf):
    """Once de-quantised (by the ``smollm2`` fixture), the GGUF loads from its safetensors cache in seconds."""
    start = time.perf_counter()
    model, _ = load_model(smollm2_gguf)
    assert time.perf_counter() - start < 20
    source = model.inactive_heads_source
    assert source["format"] == "gguf" and len(source["sha256"]) == 64
    assert source == smollm2[0].inactive_heads_source


@pytest.mark.slow
def test_smollm2_scores_match_reference(smollm2):
    model, tokenizer = smollm2
    ours = ih.record_scores(model, tokenizer, _TEXTS, batch_size=2)
    assert ours.shape == (2, 30, 9)
    for row, text in enumerate(_TEXTS):
        ref, _, _ = reference_run(model, tokenizer, text)
        for name, expected in ref.items():
            torch.testing.assert_close(ours[name][row].double(), expected, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.slow
def test_smollm2_dynamic_zeroing_decides_per_row_as_the_reference(smollm2):
    """Real heads differ: some are far below their layer's mean output norm, and per-row decisions differ by input."""
    model, tokenizer = smollm2
    threshold = float(ih.record_scores(model, tokenizer, _TEXTS, batch_size=2)["ahon_ln"].quantile(0.1))
    batch = tokenizer(_TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad(), ih.zero_heads(model, score="ahon_ln", threshold=threshold) as run:
        model(**batch)
    assert 0.02 < run.fraction_zeroed < 0.25
    assert not torch.equal(run.zeroed[0], run.zeroed[1])
    ids = torch.tensor([tokenizer(_TEXTS[0])["input_ids"]])
    with torch.no_grad(), ih.zero_heads(model, score="ahon_ln", threshold=threshold) as alone:
        logits = model(input_ids=ids).logits[0]
    _, ref_logits, ref_zeroed = reference_run(model, tokenizer, _TEXTS[0], policy=("ahon_ln", threshold))
    assert torch.equal(alone.zeroed[0], ref_zeroed)
    torch.testing.assert_close(logits.double(), ref_logits, rtol=1e-3, atol=1e-3)


@pytest.mark.slow
def test_smollm2_generation_zeroes_heads_at_every_step(smollm2):
    model, tokenizer = smollm2
    threshold = float(ih.record_scores(model, tokenizer, _TEXTS, batch_size=2)["ahon_ln"].quantile(0.1))
    prompt = tokenizer(["The capital of France is"], return_tensors="pt")
    with ih.zero_heads(model, score="ahon_ln", threshold=threshold) as run:
        out = model.generate(**prompt, min_new_tokens=3, max_new_tokens=3, do_sample=False)
    assert out.shape[1] == prompt["input_ids"].shape[1] + 3
    # One decision per forward (the prompt, then each generated token but the last), each zeroing some heads.
    assert run.zeroed.shape == (3, 30, 9)
    assert all(step.any() for step in run.zeroed)
