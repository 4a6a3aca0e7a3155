"""Tiny random-weight causal LMs of every supported family and an offline byte-level tokenizer, for fast tests."""

from __future__ import annotations

from typing import Any

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

VOCAB = 260
ARCHS = ("llama", "qwen2", "olmo2", "gemma3", "gemma2", "mistral", "phi3", "gpt2")

# Any values: the config classes take each keyword with its own type.
_COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.15,  # large enough that attention patterns are far from uniform
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)


def tiny_config(arch: str) -> transformers.PretrainedConfig:
    """A 3-layer, 4-head config of ``arch`` (one of :data:`ARCHS`), exercising that family's attention quirks."""
    if arch == "llama":
        return transformers.LlamaConfig(**_COMMON)
    if arch == "qwen2":  # q/k/v biases
        return transformers.Qwen2Config(**_COMMON)
    if arch == "olmo2":  # q/k norms, post-attention norms
        return transformers.Olmo2Config(**_COMMON)
    if arch == "mistral":
        return transformers.MistralConfig(**_COMMON, sliding_window=6)
    if arch == "phi3":  # fused qkv projection
        return transformers.Phi3Config(**{**_COMMON, "pad_token_id": 0})
    if arch == "gemma3":  # sliding-window layers, query_pre_attn_scalar, head_dim != hidden/heads
        return transformers.Gemma3TextConfig(
            **_COMMON,
            head_dim=16,
            query_pre_attn_scalar=10,
            sliding_window=5,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        )
    if arch == "gemma2":  # attention logit softcap
        return transformers.Gemma2Config(**_COMMON, head_dim=8, attn_logit_softcapping=1.5, sliding_window=64)
    if arch == "gpt2":  # Conv1D c_attn/c_proj, MHA
        return transformers.GPT2Config(
            vocab_size=VOCAB,
            n_embd=32,
            n_layer=3,
            n_head=4,
            n_positions=256,
            initializer_range=0.15,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
    raise ValueError(f"unknown arch {arch!r}; choose from {ARCHS}")


def tiny_model(arch: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float32) -> transformers.PreTrainedModel:
    """Random-weight causal LM in eval mode (default attention implementation)."""
    torch.manual_seed(seed)
    config = tiny_config(arch)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def tiny_tokenizer(padding_side: str = "right") -> PreTrainedTokenizerFast:
    """Byte-level tokenizer (one token per UTF-8 byte, ids 4..259; 0 pad, 1 bos, 2 eos, 3 unk); adds no BOS."""
    byte_chars = list(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}
    vocab.update({c: 4 + i for i, c in enumerate(sorted(byte_chars))})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side=padding_side,
    )


def padded_batch(ids: list[list[int]], side: str) -> dict[str, torch.Tensor]:
    """Token id lists as one batch padded on ``side`` ("left" or "right") with id 0: input_ids, attention_mask and
    position_ids counting real tokens only, so a left-padded row sees the positions it has alone."""
    width = max(map(len, ids))
    input_ids = torch.zeros(len(ids), width, dtype=torch.long)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for row, seq in enumerate(ids):
        span = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
        input_ids[row, span] = torch.tensor(seq)
        mask[row, span] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)}
