"""evaluate() on tiny random models: batching invariance, policy vs a naive loop, recorded rows, metrics."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from _tiny import tiny_model, tiny_tokenizer
from conftest import covering_grid
from hypothesis import given, settings
from hypothesis import strategies as st

from inactive_heads.engine import Policy, watch
from inactive_heads.evaluation import EvalResult, evaluate
from inactive_heads.evaluation.batching import _fill_rows
from inactive_heads.recording import record_scores
from inactive_heads.tasks import FEWSHOT_SEED, Item, Task
from inactive_heads.tasks.recall import recall_task


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=0)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _mc_task() -> Task:
    """A small multi-token task with a shared 2-shot prefix and choices of different character lengths."""
    words = ["red", "green", "blue", "yellowish", "black", "white"]
    items = [
        Item(f"t:{i}", (f"Colour {i} of the flag is",), tuple(words[(i + j) % 6] for j in range(3)), i % 3)
        for i in range(9)
    ]
    pool = [Item(f"d:{i}", (f"Example colour {i} is",), ("grey", "pink"), i % 2) for i in range(3)]
    return Task(
        "mc",
        items,
        metrics=("acc", "acc_norm"),
        fewshot={"": pool},
        fewshot_sampler="first_n",
        descriptions={"": "Answer with one colour word, as in the examples that follow below.\n\n"},
    )


def _shared_start_task() -> Task:
    """Choices with long common starts, one choice a prefix of another, and a duplicate choice (as PIQA's)."""
    sols = ("fill the cup with cold water", "fill the cup with dry sand", "fill the cup", "fill the cup")
    items = [Item(f"p:{i}", (f"Question: goal {i}\nAnswer:",), sols[i % 2 :] + sols[: i % 2], i % 4) for i in range(5)]
    return Task("shared", items, metrics=("acc", "acc_norm"))


def _mixed_length_task() -> Task:
    """Contexts from 1 to 12 words, so several short items share a packed row with a block mask between them."""
    items = [
        Item(f"m:{i}", (" ".join(["word"] * (1 + (7 * i) % 12)) + " is",), ("a cat", "a dog", "a bird"), i % 3)
        for i in range(11)
    ]
    return Task("mixed", items, metrics=("acc", "acc_norm"))


def _single_token_task() -> Task:
    """Every continuation is one byte after the same context, so each item is one shared row (as MMLU)."""
    items = [Item(f"s:{i}", (f"Question {i}: pick a letter.\nAnswer:",), ("A", "B", "C", "D"), i % 4) for i in range(7)]
    return Task("single", items, metrics=("acc",), target_delimiter="")


def _partial_task() -> Task:
    """WinoGrande-like partial scoring: the choices are two contexts (the sentence up to the blank, filled with each
    option) sharing the scored rest of the sentence; k-shot examples drawn at random from the evaluated items."""
    names = [("Anna", "Bert"), ("the cup", "the jug"), ("Carla", "Dmitri"), ("the red box", "the tin")]
    items = []
    for i in range(8):
        a, b = names[i % 4]
        sentence = f"Item {i}: {a} could not lift {b} because _ was too {'weak' if i % 2 else 'heavy'}."
        k = sentence.index("_")
        ctxs = (sentence[:k] + a, sentence[:k] + b)
        items.append(Item(f"w:{i}", ctxs, (sentence[k + 1 :].strip(),), i % 2))
    return Task("partial", items, fewshot={"": items}, fewshot_excludes_item=True)


def _naive_lls(model, tok, task: Task, result: EvalResult, shots: int, policy: Policy | None) -> list[list[float]]:
    """One (item, choice) sequence at a time, no batching, no padding: lm-eval's encoding, summed log-probs."""
    items = {it.id: it for it in task.items}
    rnd = random.Random(FEWSHOT_SEED)  # the few-shot draws of the evaluation, item by item in its order
    out = []
    with watch(model, policy=policy) as _w, torch.no_grad():
        for iid in result.item_ids:
            item = items[iid]
            examples = task.fewshot_examples(item, shots, rnd)
            row = []
            for ctx, cont in task.requests(item, examples):
                ctx_ids = tok(ctx)["input_ids"]
                whole = tok(ctx + cont)["input_ids"]
                cont_ids = whole[len(ctx_ids) :]
                inp = torch.tensor([whole[:-1]])
                logp = torch.log_softmax(model(input_ids=inp).logits[0].double(), -1)
                pos = range(len(whole) - 1 - len(cont_ids), len(whole) - 1)
                row.append(float(sum(logp[p, t] for p, t in zip(pos, cont_ids, strict=True))))
            out.append(row)
    return out


def _close(a: list[list[float]], b: list[list[float]], atol: float = 2e-4) -> bool:
    pairs = (xy for ra, rb in zip(a, b, strict=True) for xy in zip(ra, rb, strict=True))
    return all(math.isclose(x, y, abs_tol=atol) for x, y in pairs)


@pytest.mark.parametrize("task_fn", [_mc_task, _single_token_task])
def test_results_do_not_depend_on_batch_size(model, tok, task_fn):
    task = task_fn()
    shots = 2 if task.fewshot else 0
    runs = [evaluate(model, tok, task, shots=shots, batch_size=bs) for bs in (1, 3, 16)]
    for r in runs[1:]:
        assert _close(r.loglikelihoods, runs[0].loglikelihoods, 1e-4)
        assert r.pred == runs[0].pred and r.pred_norm == runs[0].pred_norm and r.metrics == runs[0].metrics
    # The shared few-shot KV prefix and whole-sequence forwards agree too.
    whole = evaluate(model, tok, task, shots=shots, batch_size=3, share_prefix=False)
    assert _close(whole.loglikelihoods, runs[0].loglikelihoods, 1e-4)


@pytest.mark.parametrize(
    ("arch", "impl", "task_fn"),
    covering_grid(
        ["llama", "qwen2", "olmo2", "phi3", "gpt2"],
        ["sdpa", "eager"],
        [_mc_task, _shared_start_task, _mixed_length_task],
    ),
)
def test_packed_item_contexts_match_whole_sequences(tok, arch, impl, task_fn):
    """0-shot: each item's context and the common start of its choices run once, the rest of every choice packed
    behind them under a tree mask (default on)."""
    model = tiny_model(arch, seed=1)
    model.set_attn_implementation(impl)
    task = task_fn()
    whole = evaluate(model, tok, task, shots=0, batch_size=4, share_prefix=False)
    naive = _naive_lls(model, tok, task, whole, 0, None)
    assert _close(whole.loglikelihoods, naive, 2e-4)
    for bs in (1, 4, 32):
        packed = evaluate(model, tok, task, shots=0, batch_size=bs)
        assert _close(packed.loglikelihoods, naive, 2e-4) and packed.pred == whole.pred
        assert packed.is_greedy == whole.is_greedy
        assert packed.timing["forward_tokens"] < whole.timing["forward_tokens"]
    assert model.config._attn_implementation == impl


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_partial_scoring_with_random_shots_runs_the_shared_prefix_once(tok, impl):
    """WinoGrande k-shot: an item's two sequences agree up to the blank's filler (its own few-shot block and the
    sentence before the blank), which runs once, each choice's filler and the shared continuation behind it."""
    model = tiny_model("llama", seed=2)
    model.set_attn_implementation(impl)
    task = _partial_task()
    whole = evaluate(model, tok, task, shots=2, batch_size=1, share_prefix=False)
    naive = _naive_lls(model, tok, task, whole, 2, None)
    assert _close(whole.loglikelihoods, naive, 2e-4)
    for bs in (1, 3, 16):
        packed = evaluate(model, tok, task, shots=2, batch_size=bs)
        assert _close(packed.loglikelihoods, naive, 2e-4) and packed.pred == whole.pred
        assert packed.is_greedy == whole.is_greedy
    # One block per row at batch size 1 (no padding): the shared prefix, then each choice's filler and
    # continuation. The prefix (two examples and the sentence's start) is most of a sequence.
    packed = evaluate(model, tok, task, shots=2, batch_size=1)
    assert packed.timing["forward_tokens"] < 0.6 * whole.timing["forward_tokens"]


def test_without_output_embeddings_full_logits_give_the_same_numbers(model, tok, monkeypatch):
    """The LM-head gather needs ``get_output_embeddings()``; without it every position's logits are computed."""
    task = _shared_start_task()
    gathered = evaluate(model, tok, task, shots=0, batch_size=4)
    monkeypatch.setattr(model, "get_output_embeddings", lambda: None)
    full = evaluate(model, tok, task, shots=0, batch_size=4)
    assert _close(full.loglikelihoods, gathered.loglikelihoods, 1e-5) and full.is_greedy == gathered.is_greedy


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=40), batch_size=st.integers(1, 9))
def test_fill_rows_packs_every_block_once_and_pads_less(lengths, batch_size):
    batches = _fill_rows(lengths, batch_size)
    assert sorted(i for rows in batches for row in rows for i in row) == list(range(len(lengths)))
    padded = 0
    for rows in batches:
        width = max(lengths[i] for row in rows for i in row)
        assert 1 <= len(rows) <= batch_size
        assert all(sum(lengths[i] for i in row) <= width for row in rows)
        padded += width * len(rows)
    # Never more token positions than one block per row, sorted longest first (the plain layout).
    plain = sorted(lengths, reverse=True)
    assert padded <= sum(plain[k] * len(plain[k : k + batch_size]) for k in range(0, len(plain), batch_size))


def test_single_token_items_share_one_row(model, tok):
    task = _single_token_task()
    r = evaluate(model, tok, task, record=True)
    assert r.rows == [(i, -1) for i in range(7)] and r.timing["sequences"] == 7
    assert r.scores.shape[0] == 7


@pytest.mark.parametrize("score", ["ahon_ln", "aeqd"])
def test_policy_equals_naive_per_sequence_loop(model, tok, score):
    task = _mc_task()
    plain = evaluate(model, tok, task, shots=2, batch_size=4, record=True)
    # Threshold at the median recorded score, so the dynamic policy zeroes a real share of the heads.
    policy = Policy(score=score, threshold=float(plain.scores[score].median()))
    r = evaluate(model, tok, task, shots=2, batch_size=4, policy=policy)
    assert 0.0 < r.zeroed_fraction < 1.0, "the policy must zero some heads, not all"
    assert not _close(r.loglikelihoods, plain.loglikelihoods, 1e-3), "zeroing must change the log-likelihoods"
    naive = _naive_lls(model, tok, task, r, 2, policy)
    assert _close(r.loglikelihoods, naive, 2e-4)
    assert _close(plain.loglikelihoods, _naive_lls(model, tok, task, plain, 2, None), 2e-4)
    assert r.zeroed.shape == (len(r.rows), 3, 4)
    assert math.isclose(sum(r.zeroed_per_layer) / 3, r.zeroed_fraction, rel_tol=1e-6)
    assert math.isclose(sum(map(sum, r.zeroed_per_head)) / 12, r.zeroed_fraction, rel_tol=1e-6)


def test_static_mask_zeroes_exactly_the_masked_heads(model, tok):
    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask[1] = True
    mask[2, 0] = True
    r = evaluate(model, tok, _mc_task(), shots=2, policy=Policy(mask=mask))
    assert all(torch.equal(z, mask) for z in r.zeroed)  # every recorded row zeroed exactly the mask
    assert r.zeroed_per_head == mask.float().tolist()
    assert r.zeroed_per_layer == mask.float().mean(1).tolist()
    assert math.isclose(r.zeroed_fraction, 5 / 12, rel_tol=1e-6)


def test_recorded_rows_are_stable_and_match_standalone_recording(model, tok):
    task = _mc_task()
    r = evaluate(model, tok, task, shots=2, batch_size=4, record=True)
    n = sum(it.n_choices for it in task.items)
    assert r.rows == [(i, c) for i in range(9) for c in range(3)] and r.scores.shape == (n, 3, 4)
    # Row r holds the scores of sequence (item, choice) alone: recompute three of them one by one.
    reqs = {i: task.requests(task.items[i], list(task.fewshot[""][:2])) for i in range(9)}
    for row in (0, 13, n - 1):
        i, c = r.rows[row]
        ctx, cont = reqs[i][c]
        whole = tok(ctx + cont)["input_ids"][:-1]
        alone = record_scores(model, tok, [tok.decode(whole)], batch_size=1)
        for name in ("ahon", "aeqd", "awft"):
            torch.testing.assert_close(r.scores[name][row], alone[name][0], atol=1e-4, rtol=1e-4)
    assert r.zeroed is None and r.zeroed_fraction is None


def test_metrics_preds_and_serialisation(model, tok):
    task = _mc_task()
    r = evaluate(model, tok, task, shots=2)
    assert r.n_items == 9 and r.gold == [it.gold for it in task.items]
    for lls, p, pn, it in zip(r.loglikelihoods, r.pred, r.pred_norm, task.items, strict=True):
        assert p == max(range(3), key=lambda c: (lls[c], -c))
        assert pn == max(range(3), key=lambda c: (lls[c] / len(it.continuations[c]), -c))
    assert r.metrics["acc"] == sum(p == g for p, g in zip(r.pred, r.gold, strict=True)) / 9
    assert r.metrics["acc_norm"] == sum(p == g for p, g in zip(r.pred_norm, r.gold, strict=True)) / 9
    assert math.isclose(r.gold_loglikelihood, sum(x[g] for x, g in zip(r.loglikelihoods, r.gold, strict=True)) / 9)
    d = json.loads(json.dumps(r.to_dict()))
    assert d["config"]["shots"] == 2 and d["item_ids"] == r.item_ids and "scores" not in d
    again = evaluate(model, tok, task, shots=2).to_dict()
    assert {k: v for k, v in again.items() if k != "timing"} == {k: v for k, v in d.items() if k != "timing"}


def test_single_token_shared_row_equals_per_choice_rows(model, tok):
    task = _single_token_task()
    shared = evaluate(model, tok, task)
    naive = _naive_lls(model, tok, task, shared, 0, None)
    assert _close(shared.loglikelihoods, naive, 2e-4)


def test_limit_and_real_task_files(model, tok, data_dir):
    r = evaluate(model, tok, "piqa", limit=6, data_dir=data_dir, batch_size=4)
    assert r.n_items == 6 and r.item_ids == evaluate(model, tok, "piqa", limit=6, data_dir=data_dir).item_ids
    assert set(r.metrics) == {"acc", "acc_norm"} and r.config["sources"][0].endswith("valid.jsonl")
    w = evaluate(model, tok, "winogrande", limit=4, data_dir=data_dir, policy=Policy(score="random", threshold=0.3))
    assert all(len(x) == 2 for x in w.loglikelihoods) and 0.1 < w.zeroed_fraction < 0.5


def test_recall_task_scores_every_item_and_choice(model, tok):
    task = recall_task(12, seed=1)
    r = evaluate(model, tok, task, batch_size=5)
    assert r.item_ids == [it.id for it in task.items]
    assert [len(x) for x in r.loglikelihoods] == [it.n_choices for it in task.items]
    assert all(math.isfinite(ll) and ll < 0 for x in r.loglikelihoods for ll in x)


def test_bad_arguments_are_refused(model, tok):
    with pytest.raises(ValueError, match="share_prefix"):
        evaluate(model, tok, recall_task(2), share_prefix=True, record=True)
    with pytest.raises(ValueError, match="batch_size"):
        evaluate(model, tok, recall_task(2), batch_size=0)
