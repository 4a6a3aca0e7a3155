"""Obvious reference: full float64 softmax, one unpadded text and one head at a time, scores from the definitions."""

from __future__ import annotations

import copy

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

import inactive_heads as ih

RAW = ("awft", "aeqd", "ftvvn", "avvn", "lthon", "ahon", "fhon")

_REF: dict = {}


def _reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    assert query.shape[0] == 1, "the reference runs one unpadded text at a time"
    heads, _q_len, head_dim = query.shape[1:]
    groups = heads // key.shape[1]
    scale = head_dim**-0.5 if scaling is None else scaling
    softcap = kwargs.get("softcap")
    proj = module.o_proj.weight if hasattr(module, "o_proj") else module.c_proj.weight.T  # [d_model, H*D]
    mask = attention_mask[0, 0, :, : key.shape[2]].double()
    outs, raw = [], {name: [] for name in RAW}
    for h in range(heads):
        q, k, v = query[0, h].double(), key[0, h // groups].double(), value[0, h // groups].double()
        logits = q @ k.T * scale
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        probs = torch.softmax(logits + mask, dim=-1)  # [S, T]
        o = probs @ v
        raw["awft"].append(probs[:, 0].mean())
        raw["aeqd"].append((-(probs * torch.log(probs.clamp(min=1e-300))).sum(-1)).mean())
        raw["ftvvn"].append(v[0].norm())
        raw["avvn"].append(v.norm(dim=-1).mean())
        raw["lthon"].append(o[-1].norm())
        raw["ahon"].append(o.norm(dim=-1).mean())
        w_h = proj[:, h * head_dim : (h + 1) * head_dim].double()
        raw["fhon"].append((o @ w_h.T).norm(dim=-1).mean())
        outs.append(o)
    raw = {name: torch.stack(vals) for name, vals in raw.items()}
    scores = _reference_scores(raw)
    _REF["scores"].append({name: s.clone() for name, s in scores.items()})
    policy = _REF.get("policy")
    out = torch.stack(outs)  # [H, S, D]
    if policy is not None:
        score, threshold = policy
        above = ih.SCORE_FUNCTIONS[score].inactive_when == "above"
        zero = scores[score] > threshold if above else scores[score] < threshold
        out = out * (~zero)[:, None, None]
        _REF["zeroed"].append(zero)
    return out.transpose(0, 1)[None].to(query.dtype), None


def _reference_scores(raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    scores = dict(raw)
    for name in RAW:
        scores[f"{name}_ln"] = raw[name] / raw[name].mean()
    scores["lthon_ln"] = raw["lthon"] / raw["ahon"].mean()
    scores["lthon_hn"] = raw["lthon"] / raw["ahon"]
    return scores


AttentionInterface.register("ih_reference", _reference_attention)
AttentionMaskInterface.register("ih_reference", eager_mask)


@torch.no_grad()
def reference_run(model, tokenizer, text, policy=None):
    """Scores [L, H] per name and logits [S, V] of one text, float64, via the reference attention."""
    ref = copy.deepcopy(model).double()
    ref.set_attn_implementation("ih_reference")
    _REF.update(scores=[], zeroed=[], policy=policy)
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    logits = ref(input_ids=ids, use_cache=False).logits[0]
    scores = {name: torch.stack([layer[name] for layer in _REF["scores"]]) for name in _REF["scores"][0]}
    zeroed = torch.stack(_REF["zeroed"]) if policy else None
    return scores, logits, zeroed


def threshold_between_values(values: torch.Tensor, quantile: float) -> float:
    """A threshold near ``quantile`` of ``values``: the midpoint of the widest gap there, so that float32-vs-float64
    rounding cannot flip a decision."""
    v = values.flatten().double().sort().values
    centre = int(quantile * (len(v) - 1))
    window = range(max(0, centre - 3), min(len(v) - 1, centre + 3))
    i = max(window, key=lambda j: v[j + 1] - v[j])
    return float((v[i] + v[i + 1]) / 2)
