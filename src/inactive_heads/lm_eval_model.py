"""lm-eval's HFLM with heads zeroed in every forward: any lm-eval task, log-likelihood or generative.

Importing this module registers :class:`InactiveHeadsLM` with lm-eval as ``inactive_heads`` (it needs the lm-eval
extra: ``pip install 'inactive-heads[lm-eval]'``). Its model arguments are HFLM's plus the zeroing policy::

    lm-eval --model inactive_heads --model_args pretrained=DIR,score=ahon_ln,target=0.1,calibration=RUN_DIR ...

Without ``score`` it is HFLM. With it, every forward HFLM makes runs inside :func:`inactive_heads.watch`, which
decides per input and per layer which heads to zero: log-likelihood batches (HFLM's right padding masked, so a
row's decisions see its own tokens only) and generation. ``generation_mode`` (one of
:data:`inactive_heads.generation.MODES`) says what a decision sees while decoding: ``step`` (the default) runs HF
``generate`` with a KV cache, the prompt's pass deciding on the prompt and every later step on the new token; the
other modes decode each of HFLM's batches with :func:`inactive_heads.generation.generate_until` (greedy only; the
same stop rule as HFLM's). The realised fraction
of zeroed heads, over every forward row but those of lm-eval's batch-size probe, is reported by
:meth:`InactiveHeadsLM.get_model_info`, which lm-eval copies into ``results["config"]["inactive_heads"]``;
:func:`simple_evaluate` also puts it at ``results["inactive_heads"]``.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lm_eval.evaluator
import lm_eval.models.huggingface as _hf
import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from . import _compat
from .engine import Policy, Watch, watch
from .errors import InactiveHeadsError, UnknownNameError, UnsupportedModelError
from .generation import MODES as GENERATION_MODES
from .generation import generate_until
from .pruning.mask import static_mask
from .runs.directory import RunDir, check_model
from .scores import SCORE_FUNCTIONS, HeadScores
from .stats.thresholds import thresholds_from_cdf

__all__ = ["MODES", "InactiveHeadsLM", "simple_evaluate"]

#: ``dynamic``: per input and layer, the heads whose score passes the threshold. ``static``: one fixed set for every
#: input, the ``target`` fraction of heads most often inactive on the calibration rows
#: (:func:`inactive_heads.static_mask`, the heads ``inactive-heads prune`` would remove).
MODES = ("dynamic", "static")


@register_model("inactive_heads")
class InactiveHeadsLM(HFLM):
    """HFLM whose forwards zero heads by ``score`` and ``threshold`` (or ``target`` with ``calibration``).

    ``target``: fraction of heads to zero; the threshold comes from the pooled scores of ``calibration``, a run
    directory written by ``inactive-heads calibrate``, as a sweep takes it. ``mode``: see :data:`MODES`.
    ``generation_mode``: see the module docstring. ``seed``: of the ``random`` score. Every other argument is
    HFLM's.
    """

    def __init__(
        self,
        pretrained: Any,
        score: str | None = None,
        threshold: float | None = None,
        target: float | None = None,
        calibration: str | Path | None = None,
        mode: str = "dynamic",
        generation_mode: str = "step",
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        options = _check_options(score, threshold, target, calibration, mode, generation_mode, seed)
        # Options fail before the model loads; the calibration's shape is checked against the model after.
        calibration_scores: HeadScores | None = None
        calibration_run: dict[str, Any] | None = None
        if calibration is not None:
            run_dir = RunDir(calibration)
            calibration_scores, calibration_run = run_dir.read_calibration(score), run_dir.read_run()
        super().__init__(pretrained=pretrained, **kwargs)
        self.zeroing: dict[str, Any] = options
        self._policy: Policy | None = None
        if calibration_run is not None:
            check_model(calibration_run, self.model)
        if score is not None:
            self._policy = self._make_policy(score, options["threshold"], options["target"], calibration_scores)
        n_layers, n_heads = _compat.model_shape(self.model)
        self._rows = 0
        self._prompts = 0  # prompts decoded by generate_until so far: the random score's row ids
        self._zeroed_sum = torch.zeros(n_layers, n_heads, dtype=torch.long)
        self._watch: Watch | None = None
        self._uncounted: list[tuple[int, int]] = []  # rows of the current watch that are not counted
        self._lengths: list[int] | None = None  # real lengths of the log-likelihood batch being padded
        self._probing = False

    def _make_policy(
        self, score: str, threshold: float | None, target: float | None, calibration: HeadScores | None
    ) -> Policy:
        if self.zeroing["mode"] == "static":
            assert calibration is not None and target is not None  # see _check_options
            return Policy(mask=static_mask(calibration, score=score, fraction=target), seed=self.zeroing["seed"])
        if target is not None:
            assert calibration is not None  # see _check_options
            threshold = thresholds_from_cdf(calibration[score], SCORE_FUNCTIONS[score].inactive_when, [target])[0]
            self.zeroing["threshold"] = threshold
        return Policy(score=score, threshold=threshold, seed=self.zeroing["seed"])

    @property
    def policy(self) -> Policy | None:
        """The zeroing policy of every forward (None: the baseline, plain HFLM)."""
        return self._policy

    def summary(self) -> dict[str, Any]:
        """The policy's settings and the realised fraction of heads zeroed so far: overall, per layer, per head."""
        rows = max(self._rows, 1)
        per_head = (self._zeroed_sum.double() / rows).tolist()
        per_layer = (self._zeroed_sum.double().mean(1) / rows).tolist()
        overall = float(self._zeroed_sum.double().mean() / rows)
        return {
            **self.zeroing,
            "rows": self._rows,
            "fraction_zeroed": overall,
            "fraction_zeroed_per_layer": per_layer,
            "fraction_zeroed_per_head": per_head,
        }

    def get_model_info(self) -> dict[str, Any]:
        """HFLM's model information plus ``inactive_heads``: :meth:`summary` (lm-eval copies it into results)."""
        return {**super().get_model_info(), "inactive_heads": self.summary()}

    @contextlib.contextmanager
    def _zeroing(self) -> Iterator[None]:
        """One watch around a whole lm-eval request method, so the ``random`` score draws anew for every row."""
        if self._policy is None or self._watch is not None:
            yield
            return
        self._uncounted = []
        with watch(self.model, self._policy) as w:
            self._watch = w
            try:
                yield
            finally:
                self._watch = None
        zeroed = w.zeroed
        assert zeroed is not None  # a policy is set
        keep = torch.ones(zeroed.shape[0], dtype=torch.bool)
        for start, stop in self._uncounted:
            keep[start:stop] = False
        self._rows += int(keep.sum())
        self._zeroed_sum += zeroed[keep].sum(0)

    def loglikelihood(self, requests: Any, disable_tqdm: bool = False) -> Any:
        with self._zeroing():
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)

    def loglikelihood_rolling(self, requests: Any, disable_tqdm: bool = False) -> Any:
        with self._zeroing():
            return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm)

    def generate_until(self, requests: Any, disable_tqdm: bool = False) -> Any:
        if self.zeroing["generation_mode"] != "step":  # generate_until opens its own watch per forward
            return super().generate_until(requests, disable_tqdm=disable_tqdm)
        with self._zeroing():
            return super().generate_until(requests, disable_tqdm=disable_tqdm)

    def _loglikelihood_tokens(self, requests: Any, disable_tqdm: bool = False, override_bs: int | None = None) -> Any:
        if self._policy is None:
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        # HFLM right-pads each batch with token 0 and calls the model without a mask; a padded position would count
        # as a real query in the zeroing statistics. The lengths are only known where HFLM pads them.
        pad = _hf.pad_and_concat

        def recording(max_length: int, tensors: list[torch.Tensor], padding_side: str = "right") -> torch.Tensor:
            self._lengths = [int(t.shape[-1]) for t in tensors]
            return pad(max_length, tensors, padding_side=padding_side)

        _hf.pad_and_concat = recording
        try:
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        finally:
            _hf.pad_and_concat = pad
            self._lengths = None

    def _detect_batch_size(self, requests: Any = None, pos: int = 0) -> int:
        # The probe's forwards run under the policy (its memory is what counts) but are not evaluated rows.
        self._probing = True
        try:
            return super()._detect_batch_size(requests, pos)
        finally:
            self._probing = False

    @contextlib.contextmanager
    def _counted(self) -> Iterator[None]:
        if self._watch is None or not self._probing:
            yield
            return
        start = self._watch.rows_seen
        try:
            yield
        finally:
            self._uncounted.append((start, self._watch.rows_seen))

    def _model_call(
        self, inps: torch.Tensor, attn_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self._policy is None:
            return super()._model_call(inps, attn_mask, labels)
        if self._watch is None:
            raise RuntimeError("a forward outside an lm-eval request method; call loglikelihood/generate_until")
        if attn_mask is not None or labels is not None:
            raise UnsupportedModelError("inactive_heads supports decoder-only (causal) models, not seq2seq")
        lengths, self._lengths = self._lengths, None
        if lengths is None and not self._probing:
            raise RuntimeError("cannot tell the padding of this log-likelihood batch (an lm-eval other than 0.4.13?)")
        mask = None
        if lengths is not None:
            if len(lengths) != inps.shape[0]:
                raise RuntimeError(f"padded {len(lengths)} sequences but the batch has {inps.shape[0]} rows")
            width = torch.arange(inps.shape[1], device=inps.device)
            mask = (width[None, :] < torch.tensor(lengths, device=inps.device)[:, None]).long()
        with torch.no_grad(), self._autocast(), self._counted():
            return self.model(input_ids=inps, attention_mask=mask).logits

    def _model_generate(self, context: torch.Tensor, max_length: int, stop: list[str], **kwargs: Any) -> torch.Tensor:
        mode = self.zeroing["generation_mode"]
        if self._policy is not None and mode != "step":
            return self._generate_in_mode(context, max_length, stop, mode, **kwargs)
        if self._policy is not None and self._watch is None:
            raise RuntimeError("a forward outside an lm-eval request method; call generate_until")
        with self._counted():
            return super()._model_generate(context, max_length, stop, **kwargs)

    def _generate_in_mode(
        self, context: torch.Tensor, max_length: int, stop: list[str], mode: str, **kwargs: Any
    ) -> torch.Tensor:
        """HFLM's left-padded batch decoded by :func:`generate_until` in ``mode``, returned as ``generate`` would:
        [rows, context width + new tokens], padded after each row's last token."""
        mask = kwargs.pop("attention_mask", None)
        greedy = not kwargs.pop("do_sample", False) and not kwargs.pop("temperature", 0.0)
        if not greedy or kwargs:  # lm-eval normalises greedy decoding to do_sample=False, temperature=0
            raise UnsupportedModelError(
                f"generation_mode={mode} decodes greedily with lm-eval's stop rule; this task asks for "
                f"{'sampling' if not greedy else sorted(kwargs)}. Use generation_mode=step (HF generate) for it"
            )
        width = context.shape[1]
        real = torch.ones_like(context, dtype=torch.bool) if mask is None else mask.bool()
        prompts = [row[keep].tolist() for row, keep in zip(context, real, strict=True)]
        with self._autocast():
            gen = generate_until(
                self.model, self.tokenizer, prompts, until=stop, max_gen_toks=max_length - width,
                batch_size=len(prompts), policy=self._policy, mode=mode,  # type: ignore[arg-type]
                first_row=self._prompts,
            )  # fmt: skip
        self._prompts += len(prompts)
        if gen.zeroed is not None:
            self._rows += gen.zeroed.shape[0]
            self._zeroed_sum += gen.zeroed.sum(0)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        out = torch.full((len(prompts), width + max(map(len, gen.tokens), default=0)), pad, dtype=context.dtype)
        out[:, :width] = context.cpu()
        for row, tokens in enumerate(gen.tokens):
            out[row, width : width + len(tokens)] = torch.tensor(tokens, dtype=context.dtype)
        return out

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        dtype = self.mixed_precision_dtype
        return torch.autocast(device_type=self.device.type, dtype=dtype, enabled=dtype is not None)


def _number(name: str, value: Any) -> float:
    # lm-eval's model_args arrive as int, float or str.
    if isinstance(value, bool):
        raise InactiveHeadsError(f"{name} must be a number, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise InactiveHeadsError(f"{name} must be a number, got {value!r}") from None
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise InactiveHeadsError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _check_options(
    score: str | None,
    threshold: Any,
    target: Any,
    calibration: str | Path | None,
    mode: str,
    generation_mode: str,
    seed: Any,
) -> dict[str, Any]:
    """The zeroing options as recorded in results; ValueError naming the fix for a bad combination."""
    if mode not in MODES:
        raise InactiveHeadsError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if generation_mode not in GENERATION_MODES:
        raise InactiveHeadsError(
            f"generation_mode must be one of {', '.join(GENERATION_MODES)}, got {generation_mode!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InactiveHeadsError(f"seed must be a whole number, got {seed!r}")
    if score is None:
        given = [
            n for n, v in (("threshold", threshold), ("target", target), ("calibration", calibration)) if v is not None
        ]
        if given or mode != "dynamic":
            raise InactiveHeadsError(f"{', '.join(given) or 'mode'}= needs score= (a name from inactive-heads list)")
    elif score not in SCORE_FUNCTIONS:
        raise UnknownNameError(f"unknown score {score!r}; give score= one of {', '.join(SCORE_FUNCTIONS)}")
    elif threshold is not None and target is not None:
        raise InactiveHeadsError("give threshold= or target=, not both (target= takes its threshold from calibration=)")
    elif threshold is None and target is None:
        raise InactiveHeadsError(f"score={score} needs threshold= or target= (a fraction of heads, with calibration=)")
    elif target is not None and calibration is None:
        raise InactiveHeadsError(
            "target= needs calibration=RUN_DIR, a run directory written by `inactive-heads calibrate`, whose "
            "scores turn the fraction into a threshold; or give threshold= instead"
        )
    elif mode == "static" and (target is None or calibration is None):
        raise InactiveHeadsError(
            "mode=static needs target= (a fraction of heads) and calibration=RUN_DIR (from `inactive-heads "
            "calibrate`): it zeroes the heads most often inactive on the calibration rows"
        )
    t = None if threshold is None else _number("threshold", threshold)
    p = None if target is None else _number("target", target)
    if p is not None and not 0.0 <= p <= 1.0:
        raise InactiveHeadsError(f"target is a fraction of heads in [0, 1], got {p}")
    return {
        "score": score,
        "threshold": t,
        "target": p,
        "calibration": None if calibration is None else str(calibration),
        "mode": mode if score is not None else None,
        "generation_mode": generation_mode,
        "seed": seed,
    }


def simple_evaluate(*args: Any, **kwargs: Any) -> dict[str, Any] | None:
    """``lm_eval.simple_evaluate``, with the zeroing summary also at ``results["inactive_heads"]``."""
    results = lm_eval.evaluator.simple_evaluate(*args, **kwargs)
    config = results.get("config") if results is not None else None
    if isinstance(config, dict) and "inactive_heads" in config:
        results["inactive_heads"] = config["inactive_heads"]
    return results
