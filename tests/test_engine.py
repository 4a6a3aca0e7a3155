"""The engine against an obvious float64 per-text reference, on a tiny model of every supported family."""

from __future__ import annotations

import copy

import pytest
import torch
from _reference import RAW, reference_run, threshold_between_values
from _tiny import ARCHS, tiny_model, tiny_tokenizer
from conftest import covering_grid

import inactive_heads as ih
from inactive_heads import attention as attention_module
from inactive_heads import kernels

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hi", "In 1905, Einstein wrote four papers.", "a b a b a b"]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module", params=ARCHS)
def model(request):
    return tiny_model(request.param)


def test_scores_match_reference(model, tokenizer):
    ours = ih.record_scores(model, tokenizer, TEXTS, batch_size=3)
    assert ours.shape == (len(TEXTS), 3, 4)
    for row, text in enumerate(TEXTS):
        ref, _, _ = reference_run(model, tokenizer, text)
        for name, expected in ref.items():
            torch.testing.assert_close(ours[name][row].double(), expected, rtol=2e-5, atol=2e-6, msg=name)


def test_token_id_inputs_equal_text_inputs(model, tokenizer):
    ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    from_ids = ih.record_scores(model, None, ids, batch_size=2)
    from_text = ih.record_scores(model, tokenizer, TEXTS, batch_size=4)
    for name in from_text.names:
        torch.testing.assert_close(from_ids[name], from_text[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    ("model", "score"), covering_grid(ARCHS, ["ahon_ln", "awft", "fhon", "lthon_hn"]), indirect=["model"]
)
def test_dynamic_zeroing_matches_reference(model, tokenizer, score):
    recorded = ih.record_scores(model, tokenizer, TEXTS)
    quantile = 0.7 if ih.SCORE_FUNCTIONS[score].inactive_when == "above" else 0.3
    threshold = threshold_between_values(recorded[score], quantile)
    for text in TEXTS:
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        with ih.zero_heads(model, score=score, threshold=threshold) as run, torch.no_grad():
            logits = model(input_ids=ids).logits[0]
        _, ref_logits, ref_zeroed = reference_run(model, tokenizer, text, policy=(score, threshold))
        assert torch.equal(run.zeroed[0], ref_zeroed)
        torch.testing.assert_close(logits.double(), ref_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_zeroing_changes_only_the_zeroed_layer_and_later_ones(tokenizer, layer):
    """Zeroing heads of layer L leaves the input of layer L bit-identical and changes layer L's output onwards."""
    model = tiny_model("llama")
    ids = torch.tensor([tokenizer(TEXTS[0])["input_ids"]])
    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask[layer, :2] = True
    with torch.no_grad():
        base = model(input_ids=ids, output_hidden_states=True).hidden_states
        with ih.zero_heads(model, mask=mask):
            zeroed = model(input_ids=ids, output_hidden_states=True).hidden_states
    # hidden_states[0] is the embedding output, hidden_states[i] the output of layer i - 1.
    assert len(base) == len(zeroed) == 4
    for i in range(layer + 1):
        assert torch.equal(zeroed[i], base[i]), f"the input of layer {i} changed"
    for i in range(layer + 1, 4):
        assert not torch.allclose(zeroed[i], base[i]), f"the output of layer {i - 1} did not change"


def test_static_mask_counts_every_forward_and_head(tokenizer):
    model = tiny_model("llama")
    ids = torch.tensor([tokenizer(TEXTS[0])["input_ids"]] * 2)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask[0, :2] = mask[2, 3] = True
    with torch.no_grad(), ih.zero_heads(model, mask=mask) as run:
        model(input_ids=ids)
        model(input_ids=ids[:1])
    assert run.zeroed.shape == (3, 3, 4)  # one decision per row of every forward
    assert all(torch.equal(z, mask) for z in run.zeroed)
    assert run.fraction_zeroed == pytest.approx(3 / 12)


def test_zeroing_every_head_leaves_only_the_residual_stream(tokenizer):
    """All heads zeroed equals a model whose attention output projections are zero."""
    model = tiny_model("llama")
    edited = copy.deepcopy(model)
    ids = torch.tensor([tokenizer(TEXTS[2])["input_ids"]])
    with torch.no_grad():
        for layer in edited.model.layers:
            layer.self_attn.o_proj.weight.zero_()
        expected = edited(input_ids=ids).logits
        with ih.watch(model, ih.Policy(mask=torch.ones(3, 4, dtype=torch.bool))) as run:
            got = model(input_ids=ids).logits
    assert run.fraction_zeroed == 1.0
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_static_mask_matches_reference_of_zero_weights(tokenizer):
    """Zeroing a head statically equals deleting its columns of the output projection (no bias in Llama)."""
    model = tiny_model("llama")
    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask[1, 3] = mask[2, 0] = True
    edited = copy.deepcopy(model)
    head_dim = 8
    with torch.no_grad():
        edited.model.layers[1].self_attn.o_proj.weight[:, 3 * head_dim : 4 * head_dim] = 0
        edited.model.layers[2].self_attn.o_proj.weight[:, 0:head_dim] = 0
        ids = torch.tensor([tokenizer(TEXTS[2])["input_ids"]])
        expected = edited(input_ids=ids).logits
        with ih.zero_heads(model, mask=mask):
            got = model(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_random_scores_are_uniform_and_batch_invariant(tokenizer):
    model = tiny_model("llama")
    a = ih.record_scores(model, tokenizer, TEXTS * 5, batch_size=4)["random"]
    b = ih.record_scores(model, tokenizer, TEXTS * 5, batch_size=7)["random"]
    assert torch.equal(a, b)
    assert float(a.min()) >= 0 and float(a.max()) < 1 and len(a.unique()) == a.numel()
    # Uniform on [0, 1): each quarter of the range holds about a quarter of the 240 values.
    counts = torch.histc(a, bins=4, min=0, max=1)
    assert ((counts / a.numel() - 0.25).abs() < 0.1).all(), counts


def test_random_zeroing_is_reproducible_by_seed(tokenizer):
    model = tiny_model("llama")
    ids = torch.tensor([tokenizer(TEXTS[0])["input_ids"]] * 8)
    runs = {}
    for name, seed in (("first", 1), ("again", 1), ("other", 2)):
        with torch.no_grad(), ih.zero_heads(model, score="random", threshold=0.5, seed=seed) as run:
            model(input_ids=ids)
        runs[name] = run
    assert torch.equal(runs["first"].zeroed, runs["again"].zeroed)
    assert not torch.equal(runs["first"].zeroed, runs["other"].zeroed)
    assert 0.3 < runs["first"].fraction_zeroed < 0.7  # threshold 0.5 on uniform scores zeroes about half


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_model_left_as_found_also_after_exception(tokenizer, arch):
    model = tiny_model(arch)
    before = model.config._attn_implementation
    ids = torch.tensor([tokenizer(TEXTS[0])["input_ids"]])
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with pytest.raises(RuntimeError, match="boom"), ih.zero_heads(model, score="ahon", threshold=1e9):
            model(input_ids=ids)
            raise RuntimeError("boom")
        assert model.config._attn_implementation == before
        torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=0, atol=0)
    ih.record_scores(model, tokenizer, TEXTS[:1])
    assert model.config._attn_implementation == before


@pytest.mark.parametrize("padding", ["none", "right", "left"])
def test_fused_and_chunked_kernels_agree(monkeypatch, padding):
    # Every fused variant (causal mode, float mask, or none) against chunks.
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 33, 8) * 2, torch.randn(2, 2, 33, 8) * 2, torch.randn(2, 2, 33, 8)
    real = torch.ones(2, 33, dtype=torch.bool)
    if padding == "right":
        real[1, 25:] = False
    elif padding == "left":
        real[1, :8] = False
    allowed = torch.tril(torch.ones(33, 33, dtype=torch.bool))[None, None] & real[:, None, None, :]
    mask = None if padding == "none" else torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
    needs = frozenset(RAW) - {"fhon"}
    out_f, stats_f, _ = attention_module.attention_with_stats(q, k, v, mask, scale=0.4, needs=needs)
    monkeypatch.delitem(kernels._KERNELS, "cpu")
    monkeypatch.setattr(attention_module, "_CHUNK_ELEMENTS", 2 * 4 * 33 * 5)  # 5 queries per chunk
    out_c, stats_c, _ = attention_module.attention_with_stats(q, k, v, mask, scale=0.4, needs=needs)
    for row in range(2):
        torch.testing.assert_close(out_f[row][:, real[row]], out_c[row][:, real[row]], rtol=1e-5, atol=1e-5)
    for name in needs:
        torch.testing.assert_close(getattr(stats_f, name), getattr(stats_c, name), rtol=1e-5, atol=1e-5, msg=name)


def test_non_finite_scores_raise_naming_the_layer(tokenizer):
    model = tiny_model("llama")
    with torch.no_grad():
        model.model.layers[1].self_attn.v_proj.weight[0, 0] = float("inf")
    with pytest.raises(FloatingPointError, match=r"layer 1.*float32"):
        ih.record_scores(model, tokenizer, TEXTS[:1])


def test_bad_inputs_give_clear_errors(tokenizer):
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="unknown score"):
        ih.zero_heads(model, score="nope", threshold=0.1).__enter__()
    with pytest.raises(ValueError, match="needs threshold"):
        ih.zero_heads(model, score="ahon")
    with pytest.raises(ValueError, match="either score"):
        ih.zero_heads(model)
    with pytest.raises(ValueError, match="3 layers x 4 heads"), ih.zero_heads(model, mask=torch.ones(2, 4, dtype=bool)):
        pass
    with pytest.raises(TypeError, match="sequence of strings"):
        ih.record_scores(model, tokenizer, "one string")
    model.train()
    with pytest.raises(ValueError, match="eval"):
        ih.record_scores(model, tokenizer, TEXTS)


def test_model_without_attention_interface_is_named():
    from transformers import PretrainedConfig, PreTrainedModel

    class LegacyModel(PreTrainedModel):
        config_class = PretrainedConfig

        def __init__(self, config):
            super().__init__(config)
            self.layer = torch.nn.Linear(2, 2)

    LegacyModel._can_set_attn_implementation_cached_value = False
    with pytest.raises(NotImplementedError, match="LegacyModel"), ih.watch(LegacyModel(PretrainedConfig())):
        pass


def test_bfloat16_statistics_in_float32(tokenizer):
    model = tiny_model("qwen2", dtype=torch.bfloat16)
    scores = ih.record_scores(model, tokenizer, TEXTS[:2])
    assert scores["ahon"].dtype == torch.float32 and torch.isfinite(scores["ahon"]).all()
    ref = ih.record_scores(tiny_model("qwen2"), tokenizer, TEXTS[:2])
    torch.testing.assert_close(scores["awft"], ref["awft"], rtol=0.1, atol=0.02)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_kv_cache_generation_equals_full_recompute(tokenizer, arch):
    """Cached decoding (one query per step, no mask) zeroes the same heads as recomputing the whole prefix."""
    model = tiny_model(arch)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask[0, 1] = mask[2, 3] = True
    ids = torch.tensor([tokenizer(TEXTS[3])["input_ids"]])
    with torch.no_grad(), ih.zero_heads(model, mask=mask) as run:
        cached = model.generate(ids, max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
        full = model.generate(ids, max_new_tokens=6, do_sample=False, use_cache=False, pad_token_id=0)
    assert torch.equal(cached, full)
    assert run.zeroed.all(0).equal(mask) and run.zeroed.any(0).equal(mask)


def test_registered_score_is_recorded_and_drives_zeroing(tokenizer, registrations):
    model = tiny_model("llama")

    @ih.register_score("ahon_sq_test", label="AHON squared", needs={"ahon"})
    def ahon_sq(stats):
        return stats.ahon**2

    scores = ih.record_scores(model, tokenizer, TEXTS)
    torch.testing.assert_close(scores["ahon_sq_test"], scores["ahon"] ** 2)
    threshold = threshold_between_values(scores["ahon_sq_test"][0, 0], 0.5)
    with torch.no_grad(), ih.zero_heads(model, score="ahon_sq_test", threshold=threshold) as run:
        model(input_ids=torch.tensor([tokenizer(TEXTS[0])["input_ids"]]))
    # layer 0 decides on the recorded scores; later layers see the intervention, so their scores move
    assert torch.equal(run.zeroed[0, 0], scores["ahon_sq_test"][0, 0] < threshold)
    assert run.zeroed[0, 0].any() and not run.zeroed[0, 0].all()
    with pytest.raises(ValueError, match="unknown raw statistics"):
        ih.register_score("bad", needs={"nope"})


def _naive_attention(q, k, v, scale, causal):
    k, v = (x.double().repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    logits = q.double() @ k.transpose(-1, -2) * scale
    if causal:
        logits = logits.masked_fill(~torch.ones(logits.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(logits, -1) @ v


@pytest.mark.parametrize("kernel", ["fused", "chunked"])
@pytest.mark.parametrize("via", ["kwarg", "module"])
def test_non_causal_call_matches_naive_eager_attention(monkeypatch, kernel, via):
    """Without a mask, is_causal=False (as a kwarg, or on the module) attends to every key, as SDPA does."""
    from inactive_heads.engine import _attention

    if kernel == "chunked":
        monkeypatch.delitem(kernels._KERNELS, "cpu")
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 7, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    module = torch.nn.Module()
    module.is_causal = via == "kwarg"  # a kwarg overrides the module's flag
    kwargs = {"is_causal": False} if via == "kwarg" else {}
    out, weights = _attention(module, q, k, v, None, scaling=0.3, **kwargs)
    assert weights is None and out.shape == (2, 7, 4, 8)
    expected = _naive_attention(q, k, v, 0.3, False).transpose(1, 2)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)
    causal, _ = _attention(torch.nn.Module(), q, k, v, None, scaling=0.3)  # neither says: causal, as SDPA
    expected = _naive_attention(q, k, v, 0.3, True).transpose(1, 2)
    torch.testing.assert_close(causal.double(), expected, rtol=1e-5, atol=1e-6)

    needs = frozenset(RAW) - {"fhon", "random"}
    _, stats, _ = attention_module.attention_with_stats(q, k, v, None, scale=0.3, needs=needs, is_causal=False)
    kk = k.double().repeat_interleave(2, dim=1)
    probs = torch.softmax(q.double() @ kk.transpose(-1, -2) * 0.3, -1)
    o_norm = _naive_attention(q, k, v, 0.3, False).norm(dim=-1)
    want_stats = {
        "awft": probs[..., 0].mean(-1),
        "aeqd": -(probs * probs.log()).sum(-1).mean(-1),
        "ftvvn": v.double().repeat_interleave(2, dim=1)[:, :, 0].norm(dim=-1),
        "avvn": v.double().repeat_interleave(2, dim=1).norm(dim=-1).mean(-1),
        "lthon": o_norm[..., -1],
        "ahon": o_norm.mean(-1),
    }
    for name, want in want_stats.items():
        torch.testing.assert_close(getattr(stats, name).double(), want, rtol=1e-5, atol=1e-6, msg=name)


def test_bidirectional_layers_match_sdpa(tokenizer):
    """A model whose attention modules say is_causal=False runs as under SDPA, also inside a watch."""
    model = tiny_model("llama")
    ids = torch.tensor([tokenizer(TEXTS[0])["input_ids"]])
    with torch.no_grad():
        causal = model(input_ids=ids).logits
        for layer in model.model.layers:
            layer.self_attn.is_causal = False
        expected = model(input_ids=ids).logits
        assert not torch.allclose(expected, causal, atol=1e-3)  # SDPA did attend to later tokens
        with ih.watch(model, record=True):
            got = model(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_position_bias_is_refused():
    from inactive_heads.engine import _attention

    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(NotImplementedError, match="position bias"):
        _attention(torch.nn.Module(), q, q, q, None, position_bias=torch.zeros(1, 2, 3, 3))


def test_watch_results_are_cached_until_the_next_forward(tokenizer, registrations):
    model = tiny_model("llama")
    ids = torch.tensor([tokenizer(TEXTS[0])["input_ids"]])
    with torch.no_grad(), ih.watch(model, ih.Policy(score="ahon_ln", threshold=1.0), record=True) as w:
        model(input_ids=ids)
        scores, zeroed = w.scores, w.zeroed
        assert w.scores is scores and w.zeroed is zeroed  # no new forward: the same objects
        model(input_ids=ids)
        assert w.scores is not scores and w.zeroed is not zeroed
        assert w.scores.shape[0] == w.zeroed.shape[0] == 2 and w.scores is w.scores and w.zeroed is w.zeroed
        torch.testing.assert_close(w.scores["ahon"][:1], scores["ahon"])
        assert torch.equal(w.zeroed[:1], zeroed) and scores.shape[0] == zeroed.shape[0] == 1
        last_scores, last_zeroed = w.scores, w.zeroed
    assert w.scores is last_scores and w.zeroed is last_zeroed  # readable after the block, still cached

    @ih.register_score("ahon_cube_test", needs={"ahon"})
    def ahon_cube(stats):
        return stats.ahon**3

    # a score registered after a read is derived on the next read
    torch.testing.assert_close(w.scores["ahon_cube_test"], last_scores["ahon"] ** 3)
