"""Static pruning: a pruned model computes what the unpruned one computes under a static zeroing mask, on every
family, for left- and right-padded batches; generate, scores, zeroing, saving and loading keep working."""

from __future__ import annotations

import copy
import functools
import math

import pytest
import torch
import transformers
from _tiny import ARCHS, padded_batch, tiny_model, tiny_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import inactive_heads as ih
from inactive_heads import pruning
from inactive_heads.runs.directory import RunDir, model_identity

N_LAYERS, N_HEADS = 3, 4
_TOKENIZER = tiny_tokenizer()
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hi", "In 1905, Einstein wrote four papers."]


@functools.cache
def _model(arch: str) -> transformers.PreTrainedModel:
    return tiny_model(arch)


def _pruned(arch: str, mask: torch.Tensor) -> transformers.PreTrainedModel:
    return ih.prune_heads(copy.deepcopy(_model(arch)), mask)


def _mask(*removed: tuple[int, list[int]]) -> torch.Tensor:
    mask = torch.zeros(N_LAYERS, N_HEADS, dtype=torch.bool)
    for layer, heads in removed:
        mask[layer, heads] = True
    return mask


# Head 0 of layer 0 alone leaves KV head 0 one query head and KV head 1 two: uneven groups. Layer 2 loses KV head 1.
UNEVEN = _mask((0, [0]), (1, [1, 3]), (2, [2, 3]))


def _logits(model: transformers.PreTrainedModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch, use_cache=False).logits


@st.composite
def _masks(draw: st.DrawFn) -> torch.Tensor:
    """A mask that keeps at least one head per layer (some layers untouched, some down to one head)."""
    rows = [draw(st.lists(st.booleans(), min_size=N_HEADS, max_size=N_HEADS)) for _ in range(N_LAYERS)]
    mask = torch.tensor(rows)
    for layer in range(N_LAYERS):
        if mask[layer].all():
            mask[layer, draw(st.integers(0, N_HEADS - 1))] = False
    return mask


_texts = st.lists(st.text(alphabet="abcdefgh xyz.,", min_size=1, max_size=20), min_size=1, max_size=4)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mask=_masks(), texts=_texts, side=st.sampled_from(["left", "right"]))
@pytest.mark.parametrize("arch", ARCHS)
def test_pruned_equals_statically_zeroed(arch, mask, texts, side):
    model = _model(arch)
    batch = padded_batch([_TOKENIZER(t)["input_ids"] for t in texts], side)
    with ih.zero_heads(model, mask=mask):
        expected = _logits(model, batch)
    got = _logits(_pruned(arch, mask), batch)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_pruned_model_has_fewer_weights_and_keeps_its_record(arch):
    model = _pruned(arch, UNEVEN)
    assert torch.equal(pruning.pruned_mask(model), UNEVEN)
    assert ih.pruning.pruned_mask(_model(arch)).sum() == 0
    assert sum(p.numel() for p in model.parameters()) < sum(p.numel() for p in _model(arch).parameters())
    assert model.config.inactive_heads_pruned_heads == [[0], [1, 3], [2, 3]]
    # Each pruned module runs the registered function whatever the model is set to; the model's own setting stays.
    assert model.config._attn_implementation == _model(arch).config._attn_implementation
    assert all(m.config._attn_implementation == "inactive_heads" for m in ih._model.attention_modules(model))


def test_uneven_groups_map_query_heads_by_index():
    model = _pruned("llama", UNEVEN)
    first = ih._model.attention_modules(model)[0]
    assert first.inactive_heads_query_heads.tolist() == [1, 2, 3]
    assert first.inactive_heads_kv_index.tolist() == [0, 1, 1]  # original KV heads 0, 1, 1
    assert first.num_key_value_groups is None  # no equal groups to describe
    assert first.q_proj.out_features == 3 * 8 and first.o_proj.in_features == 3 * 8 and first.k_proj.out_features == 16
    last = ih._model.attention_modules(model)[2]
    assert last.inactive_heads_kv_index.tolist() == [0, 0]
    assert last.k_proj.out_features == last.v_proj.out_features == 8  # KV head 1 lost both its query heads


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_with_a_smaller_cache_equals_zeroed_generate(arch):
    model = _model(arch)
    tokenizer = tiny_tokenizer(padding_side="left")
    batch = tokenizer(TEXTS[:2], return_tensors="pt", padding=True)
    options = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad(), ih.zero_heads(model, mask=UNEVEN):
        expected = model.generate(**batch, **options, return_dict_in_generate=True)
    pruned = _pruned(arch, UNEVEN)
    with torch.no_grad():
        out = pruned.generate(**batch, **options, return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected.sequences)
    kv_heads = [layer.keys.shape[1] for layer in out.past_key_values.layers]
    full_heads = [layer.keys.shape[1] for layer in expected.past_key_values.layers]
    if arch == "gpt2":  # one KV head per query head
        assert kv_heads == [3, 2, 2] and full_heads == [4, 4, 4]
    else:
        assert kv_heads == [2, 2, 1] and full_heads == [2, 2, 2]


@pytest.mark.parametrize("arch", ["llama", "olmo2", "gpt2"])
def test_scores_of_a_pruned_model_use_the_original_head_indices(arch):
    model = _model(arch)
    pruned = _pruned(arch, UNEVEN)
    scores = ih.record_scores(pruned, _TOKENIZER, TEXTS)
    assert scores.shape == (len(TEXTS), N_LAYERS, N_HEADS)
    for name in scores:
        assert torch.equal(scores[name].isnan().all(0), UNEVEN), name
        assert not scores[name].isnan().any(0)[~UNEVEN].any(), name
    # Raw statistics of the remaining heads are those of the unpruned model under the same static zeroing ...
    with torch.no_grad(), ih.watch(model, ih.Policy(mask=UNEVEN), record=True) as run:
        for text in TEXTS:
            model(**_TOKENIZER([text], return_tensors="pt"), use_cache=False)
    kept = ~UNEVEN
    for name in ("awft", "aeqd", "avvn", "ftvvn", "lthon", "ahon", "fhon"):
        torch.testing.assert_close(scores[name][:, kept], run.scores[name][:, kept], rtol=1e-4, atol=1e-5, msg=name)
    # ... and a layer-normalised score averages over the heads the layer still has.
    for layer in range(N_LAYERS):
        ahon = scores["ahon"][:, layer, kept[layer]]
        torch.testing.assert_close(scores["ahon_ln"][:, layer, kept[layer]], ahon / ahon.mean(-1, keepdim=True))


@pytest.mark.parametrize("arch", ["llama", "phi3", "gpt2"])
def test_zeroing_a_pruned_model_equals_zeroing_both_sets(arch):
    model = _model(arch)
    pruned = _pruned(arch, UNEVEN)
    more = _mask((0, [1]), (2, [0]))
    batch = padded_batch([_TOKENIZER(t)["input_ids"] for t in TEXTS], "right")
    with ih.zero_heads(model, mask=UNEVEN | more):
        expected = _logits(model, batch)
    with ih.zero_heads(pruned, mask=more | UNEVEN) as run:  # entries of removed heads are ignored
        got = _logits(pruned, batch)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-4, atol=1e-4)
    assert all(torch.equal(z, more) for z in run.zeroed)  # removed heads are never zeroed
    assert run.fraction_zeroed == pytest.approx(2 / 12)  # over every original head: removed + zeroed add up


def test_dynamic_zeroing_on_a_pruned_model_zeroes_only_remaining_heads():
    pruned = _pruned("llama", UNEVEN)
    batch = padded_batch([_TOKENIZER(t)["input_ids"] for t in TEXTS], "right")
    with ih.zero_heads(pruned, score="ahon_ln", threshold=1.0) as run:
        _logits(pruned, batch)
    assert run.zeroed.any() and not run.zeroed[:, UNEVEN].any()
    with ih.zero_heads(pruned, score="random", threshold=0.5, seed=3) as rand:
        _logits(pruned, batch)
    with ih.zero_heads(_model("llama"), score="random", threshold=0.5, seed=3) as full:
        _logits(_model("llama"), batch)
    # A head's random draw does not depend on which other heads were removed.
    assert torch.equal(rand.zeroed[:, ~UNEVEN], full.zeroed[:, ~UNEVEN])


def test_pruning_again_removes_more_heads():
    first = _mask((0, [0]), (1, [3]))
    second = _mask((0, [0, 2]), (2, [1]))  # head 0 of layer 0 is already gone
    twice = ih.prune_heads(_pruned("qwen2", first), second)
    once = _pruned("qwen2", first | second)
    assert torch.equal(pruning.pruned_mask(twice), first | second)
    batch = padded_batch([_TOKENIZER(t)["input_ids"] for t in TEXTS], "left")
    torch.testing.assert_close(_logits(twice, batch), _logits(once, batch), rtol=0, atol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_save_and_load_restore_the_pruned_model(arch, tmp_path):
    pruned = _pruned(arch, UNEVEN)
    ih.save_pruned(pruned, tmp_path, _TOKENIZER)
    loaded, tokenizer = ih.load_model(tmp_path)
    assert torch.equal(pruning.pruned_mask(loaded), UNEVEN)
    batch = padded_batch([tokenizer(t)["input_ids"] for t in TEXTS], "right")
    torch.testing.assert_close(_logits(loaded, batch), _logits(pruned, batch), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):  # plain transformers cannot express uneven heads
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path)


def test_a_pruned_model_has_another_run_identity():
    model = _model("llama")
    assert model_identity(model) != model_identity(_pruned("llama", UNEVEN))
    assert "pruned_heads" not in model_identity(model)  # identities of unpruned models are as before


def test_refusals(tmp_path):
    model = copy.deepcopy(_model("llama"))
    with pytest.raises(ValueError, match="every head of layer 1"):
        ih.prune_heads(model, _mask((1, [0, 1, 2, 3])))
    with pytest.raises(ValueError, match=r"bool tensor \[3, 4\]"):
        ih.prune_heads(model, torch.zeros(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool tensor"):
        ih.prune_heads(model, torch.zeros(3, 4))
    with ih.zero_heads(model, mask=UNEVEN), pytest.raises(RuntimeError, match="inside a watch"):
        ih.prune_heads(model, UNEVEN)
    with pytest.raises(ValueError, match="no removed heads"):
        ih.save_pruned(model, tmp_path)
    (tmp_path / "kept.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):  # never overwrites, never leaves a partial save
        ih.save_pruned(_pruned("llama", UNEVEN), tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["kept.txt"]
    assert pruning.pruned_mask(model).sum() == 0  # a refused call changes nothing


# --- choosing the mask -------------------------------------------------------------------------------------------


def _scores(values: list[list[list[float]]], name: str = "ahon") -> ih.HeadScores:
    return ih.HeadScores({name: torch.tensor(values)})


def test_head_inactivity_counts_rows_below_the_threshold():
    # 4 rows, 1 layer, 3 heads; AHON is inactive below the threshold.
    scores = _scores([[[0.1, 0.5, 0.9]], [[0.1, 0.2, 0.9]], [[0.6, 0.2, 0.9]], [[0.1, 0.6, 0.9]]])
    found = ih.head_inactivity(scores, "ahon", threshold=0.3)
    torch.testing.assert_close(found.frequency, torch.tensor([[0.75, 0.5, 0.0]]))
    torch.testing.assert_close(found.mean, torch.tensor([[0.225, 0.375, 0.9]]))
    assert found.rows == 4 and found.threshold == 0.3
    # target=: the calibration threshold the sweep uses for that fraction of (row, layer, head) values.
    by_target = ih.head_inactivity(scores, "ahon", target=0.25)
    assert by_target.threshold == ih.thresholds_from_cdf(scores["ahon"], "below", [0.25])[0]


def test_static_mask_picks_the_most_often_inactive_heads_ties_by_mean():
    rows = [[[0.1, 0.2, 0.15, 0.9], [0.5, 0.6, 0.7, 0.8]]] * 3  # 2 layers x 4 heads, same on every row
    mask = ih.static_mask(_scores(rows), score="ahon", fraction=0.25, threshold=0.3)
    # Three heads pass on every row (frequency 1); the two with the lowest mean AHON go.
    assert mask.tolist() == [[True, False, True, False], [False] * 4]
    # AWFT is inactive above its threshold: the highest mean goes first among equally frequent heads.
    awft = ih.static_mask(_scores(rows, "awft"), score="awft", fraction=0.125, threshold=0.4)
    assert awft.tolist() == [[False, False, False, True], [False] * 4]


def test_static_mask_keeps_one_head_per_layer():
    rows = [[[0.1, 0.1, 0.1], [0.9, 0.8, 0.7]]] * 2
    mask = ih.static_mask(_scores(rows), score="ahon", fraction=0.5, threshold=0.5)
    assert mask.sum() == 3 and mask[0].sum() == 2 and mask[1].sum() == 1  # layer 0 keeps one; layer 1 gives its lowest
    assert mask[1].tolist() == [False, False, True]
    with pytest.raises(ValueError, match="keep one per layer"):
        ih.static_mask(_scores(rows), score="ahon", fraction=0.9)
    with pytest.raises(ValueError, match="fraction"):
        ih.static_mask(_scores(rows), score="ahon", fraction=1.5)


def test_static_mask_of_a_pruned_model_includes_the_removed_heads():
    pruned = _pruned("llama", UNEVEN)
    scores = ih.record_scores(pruned, _TOKENIZER, TEXTS * 2)
    mask = ih.static_mask(scores, score="ahon_ln", fraction=0.5)
    assert (mask & UNEVEN).equal(UNEVEN) and mask.sum() == 6 and (~mask).sum(1).min() >= 1
    found = ih.head_inactivity(scores, "ahon_ln", target=0.5)
    assert found.frequency[UNEVEN].isnan().all() and not found.frequency[~UNEVEN].isnan().any()


def test_static_mask_from_a_run_directory(tmp_path):
    model = _model("llama")
    scores = ih.record_scores(model, _TOKENIZER, TEXTS * 3)
    scores.save(RunDir(tmp_path).scores_path)
    RunDir(tmp_path).write_meta({"rows": scores.shape[0]})  # marks the calibration complete
    from_dir = ih.static_mask(tmp_path, score="ahon_ln", fraction=0.25)
    assert torch.equal(from_dir, ih.static_mask(scores, score="ahon_ln", fraction=0.25))
    assert from_dir.sum() == 3
    # The derived score of a registered function needs no new forward.
    assert ih.static_mask(ih.HeadScores({"ahon": scores["ahon"]}), score="ahon_ln", fraction=0.25).equal(from_dir)
    with pytest.raises(ih.InactiveHeadsError, match="no finished calibration; run `inactive-heads calibrate"):
        ih.static_mask(tmp_path / "missing", score="ahon_ln", fraction=0.25)


def test_random_static_mask_is_a_baseline_of_the_same_size():
    scores = ih.record_scores(_model("llama"), _TOKENIZER, TEXTS * 4)
    mask = ih.static_mask(scores, score="random", fraction=1 / 3)
    assert mask.sum() == 4 and not math.isnan(ih.head_inactivity(scores, "random", target=0.3).mean.sum())
