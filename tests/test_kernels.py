"""Every log-sum-exp kernel, and chunked eager attention, against float64 definitions; the CUDA kernel path on CPU.

The CUDA kernel (PyTorch's memory-efficient attention) has no CPU implementation; ``_efficient_standin`` gives it one
with the CUDA kernel's contract, so ``inactive_heads.kernels``'s CUDA adapter runs unchanged here, on every mask
layout the engine meets (padding on either side, GQA, tree and sliding-window masks, KV-cache decoding), and on tiny
models against the float64 reference. Tolerances are those of the CPU path's tests: 1e-5 for single calls on logits
of up to ~20 (test_engine's kernel agreement), 2e-5 / 2e-6 for model scores (test_engine's reference test). The
tests at the end need a GPU.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from _efficient_standin import efficient_kernel_on_cpu
from _reference import RAW, reference_run
from _tiny import tiny_model, tiny_tokenizer

import inactive_heads as ih
from inactive_heads import kernels
from inactive_heads.attention import attention_with_stats
from inactive_heads.evaluation import evaluate
from inactive_heads.tasks.recall import recall_task

KERNELS = ("cpu_flash", "cuda_efficient", "chunked_eager")
STATS = frozenset(RAW)
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hi", "In 1905, Einstein wrote four papers.", "a b a b a b"]
CUDA = torch.cuda.is_available()


@contextlib.contextmanager
def _kernel_on_cpu(name: str):
    """CPU tensors take kernel ``name`` (``chunked_eager``: no log-sum-exp kernel at all)."""
    with contextlib.ExitStack() as stack:
        mp = stack.enter_context(pytest.MonkeyPatch.context())
        calls = None
        if name == "chunked_eager":
            mp.delitem(kernels._KERNELS, "cpu")
        elif name == "cuda_efficient":
            calls = stack.enter_context(efficient_kernel_on_cpu())
            mp.setitem(kernels._KERNELS, "cpu", kernels._KERNELS["cuda"])
        else:
            assert name == "cpu_flash"
        yield
        assert calls is None or calls, "the CUDA kernel path was never taken"


@pytest.fixture(params=KERNELS)
def kernel(request):
    with _kernel_on_cpu(request.param):
        yield request.param


# --------------------------------------------------------------------------------------- one call, float64 definitions
def _naive(q, k, v, allowed, scale, gram, is_causal=True):
    """Output and statistics from the full float64 softmax and the module's row rules (see attention.py)."""
    batch, heads, q_len, _ = q.shape
    kv_len = k.shape[2]
    groups = heads // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)
    if allowed is None:
        causal = is_causal and q_len > 1
        allowed = torch.ones(q_len, kv_len, dtype=torch.bool)
        allowed = (allowed.tril() if causal else allowed).expand(batch, 1, q_len, kv_len)
        real_q = torch.ones(batch, q_len, dtype=torch.bool)
    else:
        real_q = allowed[:, 0, torch.arange(q_len), torch.arange(q_len) + kv_len - q_len]
    real_k = (allowed[:, 0] & real_q[:, :, None]).any(1)
    probs = torch.softmax((q @ k.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf")), -1)
    out = probs @ v
    stats = {name: torch.zeros(batch, heads, dtype=torch.float64) for name in STATS}
    for b in range(batch):
        rq, rk = real_q[b], real_k[b]
        first, last = int(rk.nonzero()[0]), int(rq.nonzero()[-1])
        p, o = probs[b][:, rq], out[b]
        stats["awft"][b] = p[..., first].mean(-1)
        stats["aeqd"][b] = (-(p * p.clamp(min=1e-300).log()).sum(-1)).mean(-1)
        stats["ftvvn"][b] = v[b, :, first].norm(dim=-1)
        stats["avvn"][b] = v[b][:, rk].norm(dim=-1).mean(-1)
        stats["lthon"][b] = o[:, last].norm(dim=-1)
        stats["ahon"][b] = o[:, rq].norm(dim=-1).mean(-1)
        quad = torch.einsum("hsd,hde,hse->hs", o, gram.double(), o)
        stats["fhon"][b] = quad[:, rq].sqrt().mean(-1)
    return out, stats, real_q


def _layout(name: str, batch: int, q_len: int, kv_len: int) -> torch.Tensor | None:
    """bool [B,1,S,T] permitted pairs of a mask layout the engine meets; None for the implicit causal mask."""
    causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
    real = torch.ones(batch, kv_len, dtype=torch.bool)
    if name == "causal":
        return None
    if name == "right":
        real[1, kv_len - 9 :] = False
    elif name == "left":
        real[1, :7] = False
    elif name == "window":  # sliding window of 5 keys, left padding
        real[1, :4] = False
        causal &= ~torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len - 5)
    elif name == "tree":  # a shared prefix of 10 positions, then two branches that see the prefix and themselves
        causal[10:21, 21:] = False
        causal[21:, 10:21] = False
    elif name == "decode":  # one query per row over a cache with left padding
        real[0, :3] = False
    allowed = causal[None, None] & real[:, None, None, :]
    if name == "right":  # pad queries attend to nothing (transformers' SDPA mask)
        allowed = allowed & real[:, None, :q_len, None]
    return allowed


@pytest.mark.parametrize(
    ("layout", "q_len", "kv_len"),
    [("causal", 33, 33), ("right", 33, 33), ("left", 33, 33), ("window", 33, 33), ("tree", 33, 33),
     ("chunk", 6, 19)],
)  # fmt: skip
@pytest.mark.parametrize("head_dim", [8, 6])
@pytest.mark.parametrize("form", ["bool", "float"])
def test_kernel_matches_float64_definitions(kernel, layout, q_len, kv_len, head_dim, form):
    """GQA (4 query heads, 2 KV heads); head_dim 6 is not a multiple of the CUDA kernel's row alignment."""
    _check_against_float64(layout, q_len, kv_len, head_dim, form)


@pytest.mark.parametrize(("layout", "kv_len"), [("decode", 19), ("causal", 19)])
@pytest.mark.parametrize("head_dim", [8, 6])
@pytest.mark.parametrize("form", ["bool", "float"])
def test_one_query_per_row_matches_float64_definitions(layout, kv_len, head_dim, form):
    """A decoding step (one query per row, over a left-padded cache or every key) takes no kernel: its
    probabilities are computed directly, the query heads grouped over their KV head."""
    _check_against_float64(layout, 1, kv_len, head_dim, form)


def _check_against_float64(layout: str, q_len: int, kv_len: int, head_dim: int, form: str) -> None:
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(2, 4, q_len, head_dim) * 2,
        torch.randn(2, 2, kv_len, head_dim),
        torch.randn(2, 2, kv_len, head_dim),
    )
    w = torch.randn(4, head_dim, 16)
    gram = torch.einsum("hdm,hem->hde", w, w)
    allowed = _layout(layout, 2, q_len, kv_len)
    if layout == "chunk":  # the last queries of a left-padded causal pass
        whole = _layout("left", 2, kv_len, kv_len)
        assert whole is not None
        allowed = whole[:, :, -q_len:]
    mask = allowed
    if allowed is not None and form == "float":
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    out, stats, rows = attention_with_stats(q, k, v, mask, scale=0.4, needs=STATS, gram=gram)
    want_out, want, real_q = _naive(q, k, v, allowed, 0.4, gram)
    assert torch.equal(rows.real_q, real_q)
    for b in range(2):
        torch.testing.assert_close(out[b][:, real_q[b]].double(), want_out[b][:, real_q[b]], rtol=1e-5, atol=1e-5)
    for name in STATS:
        torch.testing.assert_close(getattr(stats, name).double(), want[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("is_causal", [True, False])
def test_kernel_without_a_mask_follows_is_causal(kernel, is_causal):
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 9, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    gram = torch.eye(8).expand(4, 8, 8)
    out, stats, _ = attention_with_stats(q, k, v, None, scale=0.3, needs=STATS, gram=gram, is_causal=is_causal)
    want_out, want, _ = _naive(q, k, v, None, 0.3, gram, is_causal=is_causal)
    torch.testing.assert_close(out.double(), want_out, rtol=1e-5, atol=1e-5)
    for name in STATS:
        torch.testing.assert_close(getattr(stats, name).double(), want[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("needs", [frozenset(), frozenset({"ahon"}), frozenset({"awft"})])
def test_kernel_output_does_not_depend_on_what_is_recorded(kernel, needs):
    torch.manual_seed(2)
    q, k, v = torch.randn(2, 4, 12, 8), torch.randn(2, 2, 12, 8), torch.randn(2, 2, 12, 8)
    allowed = _layout("left", 2, 12, 12)
    out, _, _ = attention_with_stats(q, k, v, allowed, scale=0.5, needs=needs)
    full, _, _ = attention_with_stats(q, k, v, allowed, scale=0.5, needs=STATS - {"fhon"})
    real = _naive(q, k, v, allowed, 0.5, torch.eye(8).expand(4, 8, 8))[2]
    for b in range(2):
        torch.testing.assert_close(out[b][:, real[b]], full[b][:, real[b]], rtol=1e-6, atol=1e-6)


def test_kernel_takes_query_rows_at_any_address(kernel):
    """A contiguous view that starts 4 bytes into its storage (the CUDA kernel needs 16-byte aligned rows)."""
    torch.manual_seed(3)
    q = torch.randn(1 + 2 * 4 * 9 * 8)[1:].view(2, 4, 9, 8)
    k, v = torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    gram = torch.eye(8).expand(4, 8, 8)
    out, stats, _ = attention_with_stats(q, k, v, _layout("left", 2, 9, 9), scale=0.3, needs=STATS, gram=gram)
    want_out, want, real_q = _naive(q, k, v, _layout("left", 2, 9, 9), 0.3, gram)
    for b in range(2):
        torch.testing.assert_close(out[b][:, real_q[b]].double(), want_out[b][:, real_q[b]], rtol=1e-5, atol=1e-5)
    for name in STATS:
        torch.testing.assert_close(getattr(stats, name).double(), want[name], rtol=1e-5, atol=1e-5, msg=name)


def test_mask_changed_in_place_is_read_again(kernel):
    """Whether a mask is causal on its real rows is remembered per mask tensor, and forgotten when it changes."""
    torch.manual_seed(4)
    q, k, v = torch.randn(2, 4, 12, 8), torch.randn(2, 2, 12, 8), torch.randn(2, 2, 12, 8)
    gram = torch.eye(8).expand(4, 8, 8)
    mask = _layout("right", 2, 12, 12).clone()
    for layout in ("right", "left", "right"):
        mask.copy_(_layout(layout, 2, 12, 12))
        for _ in range(2):  # the second call with the same mask takes the remembered answer
            _, stats, _ = attention_with_stats(q, k, v, mask, scale=0.3, needs=STATS, gram=gram)
            want = _naive(q, k, v, mask, 0.3, gram)[1]
            for name in STATS:
                torch.testing.assert_close(getattr(stats, name).double(), want[name], rtol=1e-5, atol=1e-5, msg=name)


def test_kernel_dispatch_by_device():
    assert kernels.lse_kernel(torch.device("cpu"), None).name == "cpu_flash"
    assert kernels.lse_kernel(torch.device("cuda", 1), None).name == "cuda_efficient"
    assert kernels.lse_kernel(torch.device("cuda"), 50.0) is None  # softcapped logits: chunked eager
    assert kernels.lse_kernel(torch.device("mps"), None) is None


def test_standin_enforces_the_cuda_contract():
    """The stand-in refuses what the CUDA kernel refuses, so the adapter's padding and bias layout are checked."""
    q = torch.randn(1, 2, 5, 6)
    with efficient_kernel_on_cpu(), pytest.raises(RuntimeError, match="aligned"):
        torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, None, True, 0.0, False, scale=0.5)
    q = torch.randn(1, 2, 5, 8)
    bias = torch.zeros(1, 1, 5, 5)
    with efficient_kernel_on_cpu(), pytest.raises(RuntimeError, match="shape"):
        torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, bias, True, 0.0, False, scale=0.5)
    with efficient_kernel_on_cpu(), pytest.raises(RuntimeError, match="aligned"):
        torch.ops.aten._scaled_dot_product_efficient_attention(
            q, q, q, bias.expand(1, 2, 5, 5), True, 0.0, False, scale=0.5
        )
    with pytest.raises(NotImplementedError):  # and it is gone after the block
        torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, None, True, 0.0, False, scale=0.5)


# ------------------------------------------------------------------------------------- tiny models, float64 reference
@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_cuda_kernel_scores_match_reference(tokenizer, arch):
    """Right-padded batches (record_scores) on the CUDA kernel path, against the per-text float64 reference."""
    model = tiny_model(arch)
    with _kernel_on_cpu("cuda_efficient"):
        ours = ih.record_scores(model, tokenizer, TEXTS, batch_size=3)
    for row, text in enumerate(TEXTS):
        ref, _, _ = reference_run(model, tokenizer, text)
        for name, expected in ref.items():
            torch.testing.assert_close(ours[name][row].double(), expected, rtol=2e-5, atol=2e-6, msg=name)


def _left_padded(tokenizer, texts):
    ids = [tokenizer(t)["input_ids"] for t in texts]
    width = max(map(len, ids))
    input_ids = torch.zeros(len(ids), width, dtype=torch.long)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for row, seq in enumerate(ids):
        input_ids[row, width - len(seq) :] = torch.tensor(seq)
        mask[row, width - len(seq) :] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)}


@pytest.mark.parametrize("score", ["awft", "ahon_ln"])
@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_cuda_kernel_left_padding_and_zeroing_match_reference(tokenizer, arch, score):
    """A left-padded batch under dynamic zeroing: scores, decisions and intervened logits of every row."""
    model = tiny_model(arch)
    threshold = 0.35 if score == "awft" else 1.0
    batch = _left_padded(tokenizer, TEXTS)
    policy = ih.Policy(score=score, threshold=threshold)
    with _kernel_on_cpu("cuda_efficient"), torch.no_grad(), ih.watch(model, policy, record=True) as run:
        logits = model(**batch, use_cache=False).logits
    width = logits.shape[1]
    for row, text in enumerate(TEXTS):
        scores, ref_logits, ref_zeroed = reference_run(model, tokenizer, text, policy=(score, threshold))
        n = len(tokenizer(text)["input_ids"])
        assert torch.equal(run.zeroed[row], ref_zeroed)
        torch.testing.assert_close(logits[row, width - n :].double(), ref_logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(run.scores[score][row].double(), scores[score], rtol=2e-5, atol=2e-6)


def test_cuda_kernel_evaluation_with_tree_masks_equals_cpu_kernel(tokenizer):
    """Packed items (tree masks), a shared few-shot KV cache and recording under a policy: the same numbers."""
    model = tiny_model("qwen2")
    task = recall_task(n_items=12, seed=3)
    policy = ih.Policy(score="aeqd_ln", threshold=1.0)
    cpu = evaluate(model, tokenizer, task, shots=2, batch_size=4, policy=policy, record=True)
    with _kernel_on_cpu("cuda_efficient"):
        ours = evaluate(model, tokenizer, task, shots=2, batch_size=4, policy=policy, record=True)
    for a, b in zip(ours.loglikelihoods, cpu.loglikelihoods, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-5)
    assert torch.equal(ours.zeroed, cpu.zeroed) and 0 < ours.zeroed_fraction < 1
    for name in RAW:
        torch.testing.assert_close(ours.scores[name], cpu.scores[name], rtol=1e-5, atol=1e-6, msg=name)


def test_cuda_kernel_keeps_bfloat16_statistics_in_float32(tokenizer):
    model = tiny_model("qwen2", dtype=torch.bfloat16)
    cpu = ih.record_scores(model, tokenizer, TEXTS)
    with _kernel_on_cpu("cuda_efficient"):
        ours = ih.record_scores(model, tokenizer, TEXTS)
    assert ours["aeqd"].dtype == torch.float32
    for name in ours.names:  # both kernels see the same float32 q, k, v
        torch.testing.assert_close(ours[name], cpu[name], rtol=1e-5, atol=1e-6, msg=name)


# --------------------------------------------------------------------------------------------------- on a GPU only
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("layout", ["causal", "left", "tree", "window"])
def test_cuda_kernel_on_gpu_matches_float64_definitions(layout):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 33, 8) * 2, torch.randn(2, 2, 33, 8) * 2, torch.randn(2, 2, 33, 8)
    gram = torch.eye(8).expand(4, 8, 8).contiguous()
    allowed = _layout(layout, 2, 33, 33)
    dev = torch.device("cuda")
    out, stats, _ = attention_with_stats(
        q.to(dev), k.to(dev), v.to(dev), None if allowed is None else allowed.to(dev), scale=0.4, needs=STATS,
        gram=gram.to(dev),
    )  # fmt: skip
    want_out, want, real_q = _naive(q, k, v, allowed, 0.4, gram)
    for b in range(2):
        torch.testing.assert_close(out[b][:, real_q[b]].cpu().double(), want_out[b][:, real_q[b]], rtol=1e-5, atol=1e-5)
    for name in STATS:
        assert getattr(stats, name).device.type == "cuda"
        torch.testing.assert_close(getattr(stats, name).cpu().double(), want[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_model_split_over_gpu_and_cpu_records_and_zeroes_per_layer(tokenizer):
    """Layers on different devices: each computes its statistics and zeroing where it runs."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    model = tiny_model("llama")
    ids = torch.tensor([tokenizer(TEXTS[0])["input_ids"]])
    policy = ih.Policy(score="aeqd_ln", threshold=1.0)
    runs = []
    for split in (False, True):
        if split:  # layers 0 and 2 on the GPU, layer 1 on the CPU; each layer hands its output back to the CPU
            for i, layer in enumerate(model.model.layers):
                device = "cuda" if i % 2 == 0 else "cpu"
                add_hook_to_module(layer.to(device), AlignDevicesHook(execution_device=device, io_same_device=True))
        with torch.no_grad(), ih.watch(model, policy, record=True) as run:
            logits = model(input_ids=ids).logits
        runs.append((run.scores, run.zeroed, logits))
    (scores, zeroed, logits), (split_scores, split_zeroed, split_logits) = runs
    assert torch.equal(split_zeroed, zeroed) and 0 < zeroed.float().mean() < 1
    torch.testing.assert_close(split_logits, logits, rtol=1e-4, atol=1e-4)
    for name in scores.names:
        torch.testing.assert_close(split_scores[name], scores[name], rtol=2e-5, atol=2e-6, msg=name)
