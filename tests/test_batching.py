"""Property: a row's scores and intervened logits do not depend on its batch, its padding or the padding side."""

from __future__ import annotations

import pytest
import torch
from _tiny import padded_batch, tiny_model, tiny_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import inactive_heads as ih

_MODELS = {arch: tiny_model(arch) for arch in ("llama", "gemma3", "gemma2", "gpt2")}
_TOKENIZER = tiny_tokenizer()
_texts = st.lists(st.text(alphabet="abcdefgh xyz.,", min_size=1, max_size=24), min_size=1, max_size=5)


def _real(logits: torch.Tensor, n: int, width: int, side: str) -> torch.Tensor:
    return logits[width - n :] if side == "left" else logits[:n]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=_texts, side=st.sampled_from(["left", "right"]), arch=st.sampled_from(sorted(_MODELS)))
@pytest.mark.parametrize("score", ["ahon_ln", "awft", "aeqd_ln"])
def test_row_alone_equals_row_in_padded_batch(texts, side, arch, score):
    model = _MODELS[arch]
    ids = [_TOKENIZER(t)["input_ids"] for t in texts]
    threshold = 1.0 if score.endswith("_ln") else 0.3
    with torch.no_grad(), ih.watch(model, ih.Policy(score=score, threshold=threshold), record=True) as batched:
        logits = model(**padded_batch(ids, side), use_cache=False).logits
    width = logits.shape[1]
    for row, seq in enumerate(ids):
        with torch.no_grad(), ih.watch(model, ih.Policy(score=score, threshold=threshold), record=True) as alone:
            expected = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0]
        for name in ("awft", "aeqd", "avvn", "ftvvn", "lthon", "ahon", "fhon", "ahon_ln"):
            torch.testing.assert_close(batched.scores[name][row], alone.scores[name][0], rtol=1e-4, atol=1e-5)
        # A score within float noise of the threshold could flip; such rows are vanishingly rare with random data.
        assert torch.equal(batched.zeroed[row], alone.zeroed[0])
        torch.testing.assert_close(_real(logits[row], len(seq), width, side), expected, rtol=1e-4, atol=1e-4)
