"""Greedy generation under zeroing on tiny random models: the modes against naive loops, batching invariance,
GSM8K's answer extraction and exact match as lm-eval computes them, and evaluate() on a generative task; cached
``recompute`` against re-running every pass, also on SmolLM2 (slow)."""

from __future__ import annotations

import functools

import pytest
import torch
from _tiny import ARCHS, padded_batch, tiny_model, tiny_tokenizer
from conftest import covering_grid

from inactive_heads import SCORE_FUNCTIONS, Policy, RunningStats, record_scores, thresholds_from_cdf, watch
from inactive_heads._compat import cache_kwarg, output_cache
from inactive_heads.evaluation import EvalConfig, evaluate
from inactive_heads.evaluation.generative import _encode, _exact_match, _extract, _prompts
from inactive_heads.generation import NAIVE_RECOMPUTE, cascade, generate_until
from inactive_heads.runs.directory import score_label
from inactive_heads.tasks import Item, Task, get_task, subset
from inactive_heads.tasks.gsm8k import GSM8K_GENERATION

STRICT, FLEXIBLE = GSM8K_GENERATION.extractions
PROMPTS = ["Question: 12 + 30?\nAnswer:", "Q: a b c", "Tell me a long story about a cat and a dog."]
POLICY = Policy(score="ahon_ln", threshold=0.9)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=3)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _ids(tok, texts=PROMPTS):
    return [tok(t)["input_ids"] for t in texts]


def _naive(model, prompt: list[int], n: int, policy: Policy | None) -> list[int]:
    """The paper's generation: the growing sequence re-run whole, unbatched, inside zero_heads, argmax each step."""
    seq, out = list(prompt), []
    ctx = watch(model, policy) if policy else None
    with torch.no_grad():
        if ctx is not None:
            ctx.__enter__()
        try:
            for _ in range(n):
                t = int(model(torch.tensor([seq])).logits[0, -1].argmax())
                out.append(t)
                seq.append(t)
                if t == 2:
                    break
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
    return out


# Prompts of five lengths (left padding in batches of 3) and stop strings that stop some rows early.
FIVE = [*PROMPTS, "Hi", "x = 1; y = 2; print(x + y)"]
VOWELS = list("aeiou")


@functools.cache
def _arch(arch: str) -> tuple[torch.nn.Module, dict[str, float]]:
    """A tiny model of ``arch`` and, per score, a threshold zeroing about a third of the heads on ``FIVE``."""
    model = tiny_model(arch, seed=3)
    ids = [tiny_tokenizer()(t)["input_ids"] for t in FIVE]
    recorded = record_scores(model, None, ids)
    thresholds = {}
    for name, spec in SCORE_FUNCTIONS.items():
        ranked = recorded[name].flatten().sort(descending=spec.inactive_when == "above").values
        thresholds[name] = 0.3 if name == "random" else float(ranked[len(ranked) // 3])
    return model, thresholds


@pytest.mark.parametrize("score", list(SCORE_FUNCTIONS))
@pytest.mark.parametrize("arch", ARCHS)
def test_cached_recompute_equals_re_running_every_pass(arch, score, tok):
    """Token for token, decision for decision and flip for flip, with left padding and rows stopping early; on
    sliding-window models (Gemma-3, Mistral) the key statistics' scores take the re-running path."""
    model, thresholds = _arch(arch)
    policy = Policy(score=score, threshold=thresholds[score], seed=2)
    kw = dict(until=VOWELS, max_gen_toks=10, batch_size=3, policy=policy)
    naive = generate_until(model, tok, _ids(tok, FIVE), mode=NAIVE_RECOMPUTE, **kw)
    cached = generate_until(model, tok, _ids(tok, FIVE), mode="recompute", **kw)
    assert cached.tokens == naive.tokens and cached.texts == naive.texts
    assert cached.zeroed is not None and naive.zeroed is not None and torch.equal(cached.zeroed, naive.zeroed)
    assert cached.flips == naive.flips
    if score == "random":  # fixed draws per prompt and layer: nothing ever flips
        assert cached.flips == [0] * len(FIVE)


def test_a_flip_re_runs_only_the_rows_that_flipped(tok):
    """Each step runs the new tokens of the rows still decoding; a step at which rows flip re-runs those rows
    whole, in the batch's layout, and no other. Rows that stop leave the batch."""
    model, thresholds = _arch("llama")
    policy = Policy(score="ahon_ln", threshold=thresholds["ahon_ln"])
    shapes: list[tuple[int, int]] = []
    hook = model.register_forward_pre_hook(lambda _, args, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                           with_kwargs=True)  # fmt: skip
    try:
        got = generate_until(model, tok, _ids(tok, FIVE), until=VOWELS, max_gen_toks=10, batch_size=5,
                             policy=policy, mode="recompute")  # fmt: skip
    finally:
        hook.remove()
    width = max(map(len, _ids(tok, FIVE)))
    assert shapes[0] == (5, width)  # the prompts' pass
    steps = [(k, rows) for k, (rows, length) in enumerate(shapes) if length == 1]
    reruns = [(k, rows, length) for k, (rows, length) in enumerate(shapes[1:], 1) if length > 1]
    assert len(steps) == max(map(len, got.tokens)) - 1 and got.forwards == len(shapes)
    assert sum(rows for _, rows, _ in reruns) == sum(got.flips) > 0
    for k, rows, length in reruns:  # right after a step, over the sequence so far, fewer rows than it ran
        assert shapes[k - 1][1] == 1 and length == width + sum(1 for j, _ in steps if j < k)
        assert rows < shapes[k - 1][0]
    sizes = [rows for _, rows in steps]
    assert min(map(len, got.tokens)) < 10 and sizes == sorted(sizes, reverse=True) and sizes[-1] < 5


@pytest.mark.parametrize(("score", "cached"), [("awft", False), ("avvn_ln", False), ("ahon", True)])
def test_key_statistics_over_a_sliding_window_re_run_every_pass(tok, score, cached):
    """Over Gemma-3's 5-token window a one-token step sees only the window's keys, where a whole pass has queries
    that read every key (the first key of AWFT and FTVVN, all of AVVN): such a policy re-runs the sequence at every
    step. Statistics of the queries (AHON) keep the cache."""
    model, thresholds = _arch("gemma3")
    lengths: list[int] = []
    hook = model.register_forward_pre_hook(lambda _, args, kw: lengths.append(kw["input_ids"].shape[1]),
                                           with_kwargs=True)  # fmt: skip
    try:
        generate_until(model, tok, _ids(tok, FIVE), until=["\x00never"], max_gen_toks=6, batch_size=5,
                       policy=Policy(score=score, threshold=thresholds[score]), mode="recompute")  # fmt: skip
    finally:
        hook.remove()
    assert len(lengths) >= 6 and (1 in lengths) == cached


@pytest.mark.slow
def test_cached_recompute_equals_re_running_every_pass_on_smollm2(data_dir, smollm2):
    """8 GSM8K questions without the few-shot block, where decisions flip at many steps, under AHON (LN) zeroing
    10% of the heads on the prompts: the same tokens, decisions, flips and per-item scores."""
    model, tok = smollm2
    task = get_task("gsm8k", data_dir)
    items = subset(task.items, 8, 0)
    prompts = _encode(tok, _prompts(task, items, 0, EvalConfig(), tok))
    threshold = thresholds_from_cdf(record_scores(model, None, prompts)["ahon_ln"], "below", [0.1])[0]
    kw = dict(
        until=GSM8K_GENERATION.until, max_gen_toks=16, batch_size=8, policy=Policy(score="ahon_ln", threshold=threshold)
    )
    naive = generate_until(model, tok, prompts, mode=NAIVE_RECOMPUTE, **kw)
    cached = generate_until(model, tok, prompts, mode="recompute", **kw)
    assert cached.tokens == naive.tokens and cached.flips == naive.flips and sum(cached.flips) > 0
    assert torch.equal(cached.zeroed, naive.zeroed)
    for ex in GSM8K_GENERATION.extractions:
        for item, ours, ref in zip(items, cached.texts, naive.texts, strict=True):
            gold = item.continuations[0]
            assert _exact_match(_extract(ours, ex), gold, GSM8K_GENERATION) == _exact_match(
                _extract(ref, ex), gold, GSM8K_GENERATION
            )


@pytest.mark.parametrize("policy", [None, POLICY], ids=["plain", "ahon_ln"])
def test_recompute_equals_the_naive_loop(model, tok, policy):
    got = generate_until(
        model, tok, _ids(tok), until=["\x00never"], max_gen_toks=8, batch_size=3, policy=policy, mode="recompute"
    )
    for prompt, tokens in zip(_ids(tok), got.tokens, strict=True):
        assert tokens == _naive(model, prompt, 8, policy)
    if policy is not None:
        assert got.zeroed is not None and got.zeroed.any()


def test_step_without_policy_equals_recompute_and_hf_generate(model, tok):
    ids = _ids(tok)
    step = generate_until(model, tok, ids, until=["\x00never"], max_gen_toks=8, batch_size=3, mode="step")
    again = generate_until(model, tok, ids, until=["\x00never"], max_gen_toks=8, batch_size=3, mode="recompute")
    assert step.tokens == again.tokens
    for prompt, tokens in zip(ids, step.tokens, strict=True):
        out = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0)
        assert out[0, len(prompt) :].tolist()[: len(tokens)] == tokens


def test_prompt_mode_equals_a_naive_loop_with_the_prompts_decision_fixed(model, tok):
    # A threshold that zeroes about half the heads on these prompts, so that the decision matters.
    policy = Policy(score="ahon_ln", threshold=float(record_scores(model, tok, PROMPTS)["ahon_ln"].median()))
    kw = dict(until=["\x00never"], batch_size=3, policy=policy)
    got = generate_until(model, tok, _ids(tok), max_gen_toks=8, mode="prompt", **kw)
    step = generate_until(model, tok, _ids(tok), max_gen_toks=1, mode="step", **kw)
    decisions = []
    for r, prompt in enumerate(_ids(tok)):
        with watch(model, policy) as w, torch.no_grad():
            model(torch.tensor([prompt]))
        fixed = w.zeroed[0]
        decisions.append(fixed)
        assert got.tokens[r] == _naive(model, prompt, 8, Policy(mask=fixed))
        assert got.tokens[r][0] == step.tokens[r][0]  # the first token comes from the same decision
    assert torch.stack(decisions).any() and not torch.stack(decisions).all()
    assert 0 < got.kv_bytes_droppable < got.kv_bytes


def _dropping_mask(rows: int) -> torch.Tensor:
    """Per-row masks [rows, 3 layers, 4 heads] under which rows leave different KV heads (pairs of query heads)
    unread: layer 0's first KV head in every row, layer 2's second in row 0 only, layer 1's nowhere."""
    mask = torch.zeros(rows, 3, 4, dtype=torch.bool)
    mask[:, 0, :2] = True
    mask[0, 2, 2:] = True
    mask[1:, 2, 3] = True
    return mask


@pytest.mark.parametrize("arch", ["llama", "gemma3", "phi3", "gpt2"])
def test_prompt_mode_drops_unread_kv_heads_and_generates_the_same(arch, tok):
    model = tiny_model(arch, seed=5)
    ids = _ids(tok)
    policy = Policy(mask=_dropping_mask(len(ids)))
    kw = dict(until=["\x00never"], max_gen_toks=6, batch_size=3, policy=policy, mode="prompt")
    dropped = generate_until(model, tok, ids, **kw)
    kept = generate_until(model, tok, ids, drop_kv=False, **kw)
    assert dropped.tokens == kept.tokens
    for r, prompt in enumerate(ids):  # and both are the prompt's decision fixed, row by row
        assert dropped.tokens[r] == _naive(model, prompt, 6, Policy(mask=policy.mask[r]))
    n_kv = 4 if arch == "gpt2" else 2
    per_head = dropped.kv_bytes // (3 * n_kv)  # every layer keeps n_kv heads over the same real positions
    assert dropped.kv_bytes == kept.kv_bytes and dropped.kv_bytes_droppable == kept.kv_bytes_droppable
    # Every row leaves layer 0's first KV head unread (under GPT-2's one KV head per query head, layer 2's last
    # too); row 0 leaves more. The cache cuts each row's own.
    assert dropped.kv_bytes_dropped == dropped.kv_bytes_droppable
    assert (3 if arch == "gpt2" else 1) * per_head < dropped.kv_bytes_dropped < dropped.kv_bytes
    alone = generate_until(model, tok, ids, **{**kw, "batch_size": 1})
    assert alone.tokens == dropped.tokens
    assert alone.kv_bytes_dropped == alone.kv_bytes_droppable == dropped.kv_bytes_droppable
    assert kept.kv_bytes_dropped == 0


def test_prompt_mode_drops_kv_heads_of_a_pruned_model(tok):
    """Layer 1 loses query head 0 to pruning, so its first KV head serves head 1 alone: zeroing head 1 leaves it
    unread, an uneven layout the cache cut and the attention's KV index must agree on."""
    from inactive_heads import prune_heads

    model = tiny_model("qwen2", seed=6)
    removed = torch.zeros(3, 4, dtype=torch.bool)
    removed[1, 0] = True
    prune_heads(model, removed)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask[1, 1] = True
    ids = _ids(tok)
    kw = dict(until=["\x00never"], max_gen_toks=5, batch_size=3, policy=Policy(mask=mask), mode="prompt")
    dropped = generate_until(model, tok, ids, **kw)
    assert dropped.tokens == generate_until(model, tok, ids, drop_kv=False, **kw).tokens
    assert dropped.tokens == [_naive(model, p, 5, Policy(mask=mask)) for p in ids]
    assert dropped.kv_bytes_dropped == dropped.kv_bytes_droppable == dropped.kv_bytes // 6  # 1 of 6 KV heads


def test_a_cut_cache_holds_only_what_each_row_reads(model, tok):
    """After the prompt's pass the cache holds, per layer, the (row, KV head) pairs still read, as single-head rows,
    and stays so while decoding."""
    from inactive_heads import _compat
    from inactive_heads.generation import _Batch

    ids = _ids(tok)
    batch = _Batch(model, ids, [0, 1, 2], 0, Policy(mask=_dropping_mask(len(ids))), "prompt", drop_kv=True)
    caches = []
    real_forward = batch._forward

    def spy(policy, **kwargs):
        out = real_forward(policy, **kwargs)
        caches.append([k.shape for k, _ in _compat.cache_states(output_cache(out))])
        return out

    batch._forward = spy
    batch.run(tok, ["\x00never"], 3, {2}, 4)
    width = batch.ids.shape[1]
    assert caches[0] == [(3, 2, width, 8)] * 3  # the prompt's pass, before the cut
    for step, shapes in enumerate(caches[1:], start=1):
        # Layer 0: each row's second KV head; layer 1: uncut; layer 2: both KV heads of rows 1 and 2, one of row 0.
        assert shapes == [(3, 1, width + step, 8), (3, 2, width + step, 8), (5, 1, width + step, 8)]


@pytest.mark.parametrize("layer", [0, 1])
def test_a_layer_no_row_reads_keeps_one_pair(model, tok, layer):
    """transformers reads the cache's length from a layer's size (layer 0's for positions), so one pair stays."""
    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask[layer] = True
    kw = dict(until=["\x00never"], max_gen_toks=5, batch_size=3, policy=Policy(mask=mask), mode="prompt")
    dropped = generate_until(model, tok, _ids(tok), **kw)
    assert dropped.tokens == generate_until(model, tok, _ids(tok), drop_kv=False, **kw).tokens
    assert dropped.tokens == [_naive(model, p, 5, Policy(mask=mask)) for p in _ids(tok)]
    assert dropped.kv_bytes_droppable == dropped.kv_bytes // 3  # the layer's two KV heads of six, in every row
    assert dropped.kv_bytes_droppable // 2 < dropped.kv_bytes_dropped < dropped.kv_bytes_droppable  # 5 pairs of 6


def test_a_dropped_cache_refuses_another_mask(model, tok):
    from inactive_heads import _compat

    ids = _ids(tok)[:1]
    with torch.no_grad():
        out = model(torch.tensor(ids), use_cache=True)
    cache = output_cache(out)
    _compat.keep_cache_pairs(cache, 0, torch.tensor([0]), torch.tensor([1]))
    step = dict(input_ids=torch.tensor([[5]]), use_cache=True, **{cache_kwarg(model): cache})
    cut = r"holds \(1, 1\) \(rows, KV heads\) for a batch of 1 rows and 2 KV heads"
    with pytest.raises(ValueError, match=cut), watch(model, record=True):
        model(**step)
    unmasked = Policy(mask=torch.zeros(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="holds 1 pairs, but this mask reads 2"), watch(model, unmasked):
        model(**step)
    with pytest.raises(ValueError, match="already holds a subset"):
        _compat.keep_cache_pairs(cache, 0, torch.tensor([0]), torch.tensor([0]))


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2"])
def test_running_scores_equal_one_uncached_forward_over_the_whole_sequence(arch, tok):
    """Without zeroing, every score a cached step sees in running mode is the score of the sequence so far."""
    model = tiny_model(arch, seed=4)
    rows = [tok(t)["input_ids"] for t in PROMPTS]
    extra = [[40, 41, 42], [50, 51, 52], [60, 61, 62]]  # three decoded tokens per row
    batch = padded_batch(rows, "left")  # as generation pads
    mask = batch["attention_mask"]
    running = RunningStats()
    with torch.no_grad():
        with watch(model, record=True, running=running):
            out = model(**batch)
        past = output_cache(out)
        for k in range(3):
            mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=torch.long)], 1)
            new = torch.tensor([[e[k]] for e in extra])
            with watch(model, record=True, running=running) as w:
                out = model(input_ids=new, attention_mask=mask, position_ids=mask.sum(-1, keepdim=True) - 1,
                            use_cache=True, **{cache_kwarg(model): past})  # fmt: skip
            past = output_cache(out)
            whole = record_scores(model, None, [r + e[: k + 1] for r, e in zip(rows, extra, strict=True)], 1)
            for name in SCORE_FUNCTIONS:
                if name != "random":
                    torch.testing.assert_close(w.scores[name], whole[name], rtol=1e-4, atol=1e-5, msg=name)


def test_running_mode_decides_on_the_running_scores(model, tok):
    """Each step's zeroing under running mode is the policy applied to the scores recorded with the same means."""
    policy = Policy(score="ahon_ln", threshold=float(record_scores(model, tok, PROMPTS)["ahon_ln"].median()))
    got = generate_until(model, tok, _ids(tok), until=["\x00never"], max_gen_toks=4, batch_size=3, policy=policy,
                         mode="running")  # fmt: skip
    step = generate_until(model, tok, _ids(tok), until=["\x00never"], max_gen_toks=4, batch_size=3, policy=policy,
                          mode="step")  # fmt: skip
    assert got.mode == "running" and got.zeroed is not None and got.zeroed.any()
    assert got.forwards == step.forwards and got.zeroed.shape == step.zeroed.shape
    prompt_rows = len(PROMPTS)  # the prompt's pass is the same in both modes; later steps see different statistics
    assert torch.equal(got.zeroed[:prompt_rows], step.zeroed[:prompt_rows])
    assert not torch.equal(got.zeroed[prompt_rows:], step.zeroed[prompt_rows:])


@pytest.mark.parametrize(
    ("policy", "mode"),
    covering_grid([POLICY, Policy(score="random", threshold=0.5, seed=1)], ["step", "recompute", "running", "prompt"]),
    ids=lambda v: v.score if isinstance(v, Policy) else None,
)
def test_rows_are_independent_of_batching(model, tok, mode, policy):
    ids = _ids(tok)
    kw = dict(until=["\x00"], max_gen_toks=6, policy=policy, mode=mode)
    alone = [generate_until(model, tok, [p], first_row=i, **kw) for i, p in enumerate(ids)]
    together = generate_until(model, tok, ids, batch_size=3, **kw)
    assert together.tokens == [a.tokens[0] for a in alone]
    assert together.texts == [a.texts[0] for a in alone]
    if policy.score == "random":  # each prompt draws its own heads: not those of whichever row it shared a batch with
        first = [a.zeroed[0] for a in alone]
        assert not torch.equal(first[0], first[1])


def test_stop_strings_cut_the_text_and_stop_the_row(model, tok):
    free = generate_until(model, tok, _ids(tok)[:1], until=["\x00never"], max_gen_toks=10)
    text = free.texts[0]
    assert len(text) > 3
    stop = text[2:4]
    cut = generate_until(model, tok, _ids(tok)[:1], until=[stop], max_gen_toks=10)
    assert cut.texts[0] == text.split(stop)[0]
    assert len(cut.tokens[0]) <= len(free.tokens[0])


def test_gsm8k_extraction_and_exact_match_as_lm_eval():
    ref = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"
    assert _extract("so 70 + 2 = 72\n#### 72\n\n", STRICT) == "72"
    assert _extract("The answer is 72.", STRICT) == "[invalid]"
    assert _extract("It costs $1,000 then 72.", FLEXIBLE) == "72."  # the last match; "." is ignored when scored
    assert _extract("no number", FLEXIBLE) == "[invalid]"
    assert _exact_match("72.", ref, GSM8K_GENERATION) == 1.0
    assert _exact_match("$1,072", "#### 1072", GSM8K_GENERATION) == 1.0
    assert _exact_match("71", ref, GSM8K_GENERATION) == 0.0


def _task() -> Task:
    items = [Item(str(i), (f"Question: {i} + {i}?\nAnswer:",), (f"#### {2 * i}",), 0) for i in range(4)]
    return Task(name="toy_gen", items=items, default_shots=1, fewshot={"": items[:2]}, generation=GSM8K_GENERATION)


@pytest.mark.parametrize("mode", ["step", "recompute", "running", "prompt"])
def test_evaluate_on_a_generative_task(model, tok, mode):
    res = evaluate(model, tok, _task(), max_gen_toks=5, batch_size=2, generation_mode=mode, policy=POLICY)
    assert res.n_items == 4 and len(res.generations) == 4
    assert set(res.metrics) == {"exact_match,strict-match", "exact_match,flexible-extract", "acc"}
    assert res.generation["mode"] == mode and res.config["generation_mode"] == mode
    assert (res.generation["flips"] is not None) == (mode == "recompute")
    assert res.zeroed_fraction is not None and res.gold_loglikelihood is None
    rec = evaluate(model, tok, _task(), max_gen_toks=3, record=True)
    assert rec.scores is not None and rec.scores["ahon_ln"].shape[0] == 4  # one row per prompt


def test_generation_options_leave_existing_identities_alone():
    assert EvalConfig().identity() == EvalConfig(generation_mode="step").identity()
    assert "generation_mode" not in EvalConfig().identity()
    assert EvalConfig(generation_mode="recompute").identity()["generation_mode"] == "recompute"
    assert EvalConfig(max_gen_toks=16).identity()["max_gen_toks"] == 16
    with pytest.raises(ValueError, match="generation_mode"):
        EvalConfig(generation_mode="cached")


@pytest.mark.parametrize("mode", ["step", "recompute", "prompt"])
def test_sweep_runs_a_generative_task_and_resumes(model, tok, tmp_path, mode):
    from inactive_heads import sweep
    from inactive_heads.runs.directory import load_run

    kw = dict(scores=["ahon_ln", "random"], targets=[0.0, 0.3], max_gen_toks=3, batch_size=2, progress=False)
    cells = sweep(model, tok, _task(), tmp_path, generation_mode=mode, **kw)
    assert len(cells) == 5  # the baseline and two cells per score
    run = load_run(tmp_path)
    # The mode is part of the run's identity (absent at its default, so older runs keep theirs).
    assert run.run["evaluation"].get("generation_mode", "step") == mode
    again = sweep(model, tok, _task(), tmp_path, generation_mode=mode, **kw)
    assert [c["accuracy"] for c in again] == [c["accuracy"] for c in cells]
    # The cells keep each item's generated tokens: the report's cascade compares them with the baseline's.
    from inactive_heads import write_report
    from inactive_heads.report.tables import cascade_table

    header, rows = cascade_table([run])
    base = next(c for c in run.cells if c.score is None).generation["generated_tokens"]
    for row in rows[1:]:
        cell = next(c for c in run.cells if score_label(c.score or "") == row[1] and f"{c.target:g}" == row[2])
        found = cascade(base, cell.generation["generated_tokens"])
        identical = row[header.index("% identical to baseline [95%]")]
        assert row[0] == mode and identical.startswith(f"{100 * found['identical']:.0f} [")
        gen, kv = cell.generation, row[header.index("% KV cache unread / dropped")]
        if mode == "prompt":  # only prompt mode leaves KV heads unread and cuts them
            unread, dropped = (100 * gen[k] / gen["kv_bytes"] for k in ("kv_bytes_droppable", "kv_bytes_dropped"))
            assert kv == f"{unread:.1f} / {dropped:.1f}" and dropped <= unread
        else:
            assert kv == "–"
        flipped = row[header.index("% steps flipped")]
        if mode == "recompute":  # per row, the steps after its prompt's pass at which some decision changed
            steps = [len(t) - 1 for t in gen["generated_tokens"]]
            assert all(0 <= f <= n for f, n in zip(gen["flips"], steps, strict=True))
            assert flipped == f"{100 * sum(gen['flips']) / max(sum(steps), 1):.1f}"
        else:
            assert flipped == "–"
    assert [r[1] for r in rows] == ["baseline", "AHON (LN)", "AHON (LN)", "Random", "Random"]
    for row in rows:
        if row[header.index("% zeroed")] == "0.0":  # a cell that zeroed nothing generated the baseline's tokens
            assert row[header.index("% identical to baseline [95%]")] in ("100", "100 [100, 100]")  # baseline: exact
    md, _ = write_report([tmp_path], tmp_path / "report")
    assert "the cascade of zeroing while decoding" in md.read_text()


def test_mode_agreement_counts_items_generated_as_recompute_generates_them(model, tok, tmp_path):
    from inactive_heads import sweep
    from inactive_heads.report.tables import mode_agreement_table
    from inactive_heads.runs.directory import load_run

    kw = dict(scores=["ahon_ln", "random"], targets=[0.3], max_gen_toks=4, batch_size=2, progress=False)
    runs = {}
    for mode in ("running", "recompute", "prompt"):
        sweep(model, tok, _task(), tmp_path / mode, generation_mode=mode, **kw)
        runs[mode] = load_run(tmp_path / mode)
    assert mode_agreement_table([runs["running"], runs["prompt"]]) is None  # nothing to compare against
    header, rows = mode_agreement_table(list(runs.values()))
    assert [(r[0], r[1]) for r in rows] == [(m, s) for m in ("running", "prompt") for s in ("AHON (LN)", "Random")]
    for row in rows:
        mode, score = row[0], "ahon_ln" if row[1] == "AHON (LN)" else "random"
        cell, ref = (next(c for c in runs[m].cells if c.score == score) for m in (mode, "recompute"))
        mine, theirs = (c.generation["generated_tokens"] for c in (cell, ref))
        same = sum(a == b for a, b in zip(mine, theirs, strict=True)) / len(mine)
        delta = (sum(cell.correct()) - sum(ref.correct())) / len(mine)
        assert row[header.index("% identical to recompute [95%]")].startswith(f"{100 * same:.0f} [")
        assert row[header.index("Δ exact match vs recompute [95%]")].startswith(f"{100 * delta:+.1f} [")
        if score == "random":  # its draws do not depend on the statistics: every mode zeroes the same heads
            assert same == 1.0


class _Killed(Exception):
    pass


@pytest.mark.parametrize("mode", ["recompute", "running"])
def test_a_generative_cell_cut_off_resumes_from_its_finished_batches(model, tok, tmp_path, mode, monkeypatch):
    import inactive_heads.generation as generation
    from inactive_heads import sweep
    from inactive_heads.runs.directory import RunDir, load_run

    kw = dict(scores=["ahon_ln"], targets=[0.3], max_gen_toks=4, batch_size=1, progress=False, generation_mode=mode)
    real, calls = generation._run_batch, []

    def cut_after(n: int):
        def run_batch(*args, **kwargs):
            if len(calls) == n:
                raise _Killed
            calls.append(args[3])  # the rows
            return real(*args, **kwargs)

        return run_batch

    with monkeypatch.context() as m:
        m.setattr(generation, "_run_batch", cut_after(99))
        sweep(model, tok, _task(), tmp_path / "whole", **kw)
    assert len(calls) == 8  # four batches of the baseline and four of the cell: the calibration decodes nothing
    calls.clear()
    with pytest.raises(_Killed), monkeypatch.context() as m:
        m.setattr(generation, "_run_batch", cut_after(4 + 3))  # the baseline's four batches, three of the cell's
        sweep(model, tok, _task(), tmp_path / "cut", **kw)
    rd = RunDir(tmp_path / "cut")
    [partial] = (rd.root / "partial").iterdir()
    assert len(list(partial.glob("batch-*.pt"))) == 3 and not list(partial.glob(".*"))  # no torn file
    calls.clear()
    with monkeypatch.context() as m:
        m.setattr(generation, "_run_batch", cut_after(99))
        sweep(model, tok, _task(), tmp_path / "cut", **kw)
    assert len(calls) == 1  # only the unfinished batch of the four ran again
    assert not partial.exists()
    whole, resumed = load_run(tmp_path / "whole"), load_run(tmp_path / "cut")
    for a, b in zip(whole.cells, resumed.cells, strict=True):
        assert (a.score, a.accuracy, a.fraction_zeroed, a.per_head) == (
            b.score,
            b.accuracy,
            b.fraction_zeroed,
            b.per_head,
        )
        assert a.generation["generated_tokens"] == b.generation["generated_tokens"]
        assert a.generation["flips"] == b.generation["flips"]


def test_cascade_counts_identical_outputs_and_first_divergences():
    base = [[1, 2, 3], [4, 5, 6], [7, 8], [9]]
    other = [[1, 2, 3], [4, 0, 6], [7, 8, 2], [3]]
    got = cascade(base, other)
    assert got["identical"] == 0.25
    assert got["first_divergence"] == [None, 1, 2, 0]  # a longer output diverges where the shorter one ends
    assert got["divergence_quartiles"][1] == 1.0
    assert cascade([[1]], [[1]])["divergence_quartiles"] == [None, None, None]
