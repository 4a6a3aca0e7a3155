"""load_model: GGUF de-quantised once and cached; clear errors for bad specs; the real model against the reference."""

from __future__ import annotations

import time

import pytest
import torch
import transformers
from _real import smollm2_gguf
from _reference import reference_run

import inactive_heads as ih
from inactive_heads.loading import load_model


def test_missing_path_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        load_model(tmp_path / "nope.gguf")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(str(tmp_path / "a" / "b" / "c"))
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_model(tmp_path)


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
def test_smollm2_gguf_cached_and_scores_match_reference():
    """The real SmolLM2-135M: second load is fast, scores equal the float64 reference, zeroing is dynamic."""
    path = smollm2_gguf()
    model, tokenizer = load_model(path)  # may de-quantise (30-100 s) on a fresh cache
    start = time.perf_counter()
    model, tokenizer = load_model(path)
    assert time.perf_counter() - start < 20
    assert model.inactive_heads_source["format"] == "gguf" and len(model.inactive_heads_source["sha256"]) == 64

    texts = ["The capital of France is Paris.", "def add(a, b):\n    return a + b"]
    ours = ih.record_scores(model, tokenizer, texts, batch_size=2)
    assert ours.shape == (2, 30, 9)
    for row, text in enumerate(texts):
        ref, _, _ = reference_run(model, tokenizer, text)
        for name, expected in ref.items():
            torch.testing.assert_close(ours[name][row].double(), expected, rtol=1e-4, atol=1e-5, msg=name)

    # Real heads differ: some are far below their layer's mean output norm, and per-row decisions differ by input.
    threshold = float(ours["ahon_ln"].quantile(0.1))
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad(), ih.zero_heads(model, score="ahon_ln", threshold=threshold) as run:
        model(**batch)
    assert 0.02 < run.fraction_zeroed < 0.25
    assert not torch.equal(run.zeroed[0], run.zeroed[1])
    ids = torch.tensor([tokenizer(texts[0])["input_ids"]])
    with torch.no_grad(), ih.zero_heads(model, score="ahon_ln", threshold=threshold) as alone:
        logits = model(input_ids=ids).logits[0]
    _, ref_logits, ref_zeroed = reference_run(model, tokenizer, texts[0], policy=("ahon_ln", threshold))
    assert torch.equal(alone.zeroed[0], ref_zeroed)
    torch.testing.assert_close(logits.double(), ref_logits, rtol=1e-3, atol=1e-3)
    with ih.zero_heads(model, score="ahon_ln", threshold=threshold) as run:
        out = model.generate(**tokenizer(["The capital of France is"], return_tensors="pt"), max_new_tokens=3)
    assert out.shape[1] > 3 and run.zeroed.shape[1:] == (30, 9)
