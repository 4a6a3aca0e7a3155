"""``--model inactive_heads``: lm-eval's HFLM with heads zeroed, on a tiny model and two local lm-eval tasks.

One task of each request kind lm-eval's HFLM serves: ``ih_mc`` (multiple choice: log-likelihoods of choices of
unequal length, so batches are right-padded) and ``ih_gen`` (generate_until, a few new tokens).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm_eval not installed (group parity)")

import lm_eval
from _lm_eval import _dump  # also keeps datasets and the hub offline
from _runs import make_run
from _tiny import tiny_model, tiny_tokenizer
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager

from inactive_heads import record_scores, static_mask, zero_heads
from inactive_heads.cli import main
from inactive_heads.generation import generate_until
from inactive_heads.lm_eval_model import InactiveHeadsLM, simple_evaluate
from inactive_heads.runs.directory import model_identity
from inactive_heads.stats.thresholds import thresholds_from_cdf

SCORE = "ahon_ln"  # inactive below its threshold
BATCH = 3
_MC = [
    ("The sky is", ["blue", "green and wide", "a", "made of cheese"], 0),
    ("Two plus two equals", ["four", "five hundred"], 0),
    ("A cat says", ["meow", "woof woof", "moo"], 0),
    ("Water boils at one hundred degrees", ["Celsius", "Fahrenheit"], 0),
    ("Paris is in", ["France", "Spain", "the moon"], 0),
]
_GEN = [("Q: 2+2?\nA:", "4"), ("Q: the colour of grass?\nA:", "green"), ("Q: hi\nA:", "hello"), ("Q: x\nA:", "y")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("tiny")
    tiny_model("llama").save_pretrained(d)
    tiny_tokenizer().save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tasks")
    mc = _dump(d / "mc.jsonl", [{"question": q, "choices": c, "answer": a} for q, c, a in _MC])
    gen = _dump(d / "gen.jsonl", [{"question": q, "answer": a} for q, a in _GEN])
    common = {"dataset_path": "json", "test_split": "test", "doc_to_text": "{{question}}"}
    tasks = {
        "ih_mc": {
            **common,
            "dataset_kwargs": {"data_files": {"test": mc}},
            "output_type": "multiple_choice",
            "doc_to_choice": "{{choices}}",
            "doc_to_target": "{{answer}}",
            "target_delimiter": " ",
            "metric_list": [{"metric": "acc"}],
        },
        "ih_gen": {
            **common,
            "dataset_kwargs": {"data_files": {"test": gen}},
            "output_type": "generate_until",
            "doc_to_target": "{{answer}}",
            "generation_kwargs": {"until": ["\n"], "max_gen_toks": 4, "do_sample": False},
            "metric_list": [{"metric": "exact_match"}],
        },
    }
    for name, cfg in tasks.items():  # JSON is YAML
        (d / f"{name}.yaml").write_text(json.dumps({"task": name, **cfg}), encoding="utf-8")
    return d


def _run(lm: Any, tasks_dir: Path, tasks: tuple[str, ...] = ("ih_mc", "ih_gen")) -> dict[str, Any]:
    results = simple_evaluate(
        model=lm,
        tasks=list(tasks),
        task_manager=TaskManager(include_path=str(tasks_dir), include_defaults=False),
        log_samples=True,
        bootstrap_iters=0,
    )
    assert results is not None
    return results


def _lm(model_dir: str, **options: Any) -> InactiveHeadsLM:
    return InactiveHeadsLM(pretrained=model_dir, device="cpu", batch_size=BATCH, **options)


def _lls(results: dict[str, Any]) -> list[float]:
    return [float(r[0]) for s in results["samples"]["ih_mc"] for r in s["filtered_resps"]]


def _texts(results: dict[str, Any]) -> list[str]:
    return [s["resps"][0][0] for s in results["samples"]["ih_gen"]]


def _requests(lm: Any, results: dict[str, Any]) -> list[tuple[list[int], int]]:
    """Each log-likelihood request as HFLM tokenises it: context + continuation ids, and the continuation's length
    (the model reads all but the last token)."""
    out = []
    for s in results["samples"]["ih_mc"]:
        for context, continuation in s["arguments"]:
            ctx, cont = lm._encode_pair(context, continuation)
            out.append((ctx + cont, len(cont)))
    return out


def _ll(model: Any, ids: list[int], n_cont: int) -> float:
    logits = model(torch.tensor([ids[:-1]])).logits[0, -n_cont:].log_softmax(-1)
    return float(logits.gather(1, torch.tensor(ids[-n_cont:])[:, None]).sum())


def test_without_a_score_it_is_hflm(model_dir, tasks_dir):
    ours = _lm(model_dir)
    plain = HFLM(pretrained=model_dir, device="cpu", batch_size=BATCH)
    a, b = _run(ours, tasks_dir), _run(plain, tasks_dir)
    assert ours.policy is None
    assert _lls(a) == _lls(b)
    assert _texts(a) == _texts(b)
    assert a["inactive_heads"]["fraction_zeroed"] == 0.0 and a["inactive_heads"]["score"] is None


@pytest.mark.parametrize(("threshold", "fraction"), [(1e9, 1.0), (-1e9, 0.0)])
def test_zeroing_all_or_none_matches_the_engine(model_dir, tasks_dir, threshold, fraction):
    lm = _lm(model_dir, score=SCORE, threshold=threshold)
    results = _run(lm, tasks_dir)
    summary = results["inactive_heads"]
    assert summary["fraction_zeroed"] == fraction
    assert summary["fraction_zeroed_per_layer"] == [fraction] * 3
    assert summary["rows"] > 0 and summary["generation_mode"] == "step"
    assert results["config"]["inactive_heads"] == summary
    theirs = _lls(results)
    with torch.no_grad(), zero_heads(lm.model, score=SCORE, threshold=threshold):
        ours = [_ll(lm.model, ids, n) for ids, n in _requests(lm, results)]
    assert ours == pytest.approx(theirs, abs=1e-4)
    if fraction == 0.0:  # nothing zeroed: the baseline's answers
        base = _run(HFLM(pretrained=model_dir, device="cpu", batch_size=BATCH), tasks_dir)
        assert _lls(base) == pytest.approx(theirs, abs=1e-4)
        assert _texts(base) == _texts(results)


def _middle_threshold(values: torch.Tensor) -> float:
    """A threshold between two well-separated middle values: no decision sits on float rounding."""
    s = values.flatten().sort().values
    n = s.numel()
    k = max(range(n // 4, 3 * n // 4), key=lambda i: float(s[i + 1] - s[i]))
    assert float(s[k + 1] - s[k]) > 1e-4
    return float((s[k] + s[k + 1]) / 2)


def test_fraction_zeroed_equals_a_per_example_loop(model_dir, tasks_dir):
    probe = _lm(model_dir)
    inputs = {tuple(ids[:-1]) for ids, _ in _requests(probe, _run(probe, tasks_dir, ("ih_mc",)))}
    # HFLM runs each distinct input once (its logits cache), in batches of BATCH right-padded rows.
    inputs_list = sorted(inputs)
    scores = record_scores(probe.model, None, [list(x) for x in inputs_list])
    threshold = _middle_threshold(scores[SCORE])

    lm = _lm(model_dir, score=SCORE, threshold=threshold)
    summary = _run(lm, tasks_dir, ("ih_mc",))["inactive_heads"]
    rows = []
    with torch.no_grad():
        for ids in inputs_list:
            with zero_heads(lm.model, score=SCORE, threshold=threshold) as w:
                lm.model(torch.tensor([ids]))
            rows.append(w.zeroed)
    zeroed = torch.cat(rows).double()
    assert 0.0 < float(zeroed.mean()) < 1.0
    assert summary["rows"] == len(inputs_list)
    assert summary["fraction_zeroed"] == pytest.approx(float(zeroed.mean()), abs=1e-12)
    assert summary["fraction_zeroed_per_layer"] == pytest.approx(zeroed.mean((0, 2)).tolist(), abs=1e-12)
    assert torch.allclose(torch.tensor(summary["fraction_zeroed_per_head"], dtype=torch.float64), zeroed.mean(0))


@pytest.mark.parametrize("mode", ["recompute", "running", "prompt"])
def test_generation_modes_decode_as_generate_until(model_dir, tasks_dir, mode):
    """In a generation mode other than step, each of HFLM's batches is decoded by generate_until in that mode: the
    same texts as generate_until on HFLM's prompts, and the fraction zeroed over its forwards."""
    tok = tiny_tokenizer()
    contexts = [q for q, _ in _GEN]
    prompts = [tok(c, add_special_tokens=False)["input_ids"] for c in contexts]
    threshold = _middle_threshold(record_scores(tiny_model("llama"), None, prompts)[SCORE])
    lm = _lm(model_dir, score=SCORE, threshold=threshold, generation_mode=mode)
    results = _run(lm, tasks_dir, ("ih_gen",))
    texts = dict(zip([s["arguments"][0][0] for s in results["samples"]["ih_gen"]], _texts(results), strict=True))
    # HFLM's batches of BATCH rows hold the contexts longest first, as generate_until orders them.
    ours = generate_until(lm.model, tok, prompts, until=["\n"], max_gen_toks=4, batch_size=BATCH, policy=lm.policy,
                          mode=mode)  # fmt: skip
    assert [texts[c] for c in contexts] == ours.texts
    summary = results["inactive_heads"]
    assert ours.zeroed is not None and summary["generation_mode"] == mode
    assert summary["rows"] == ours.zeroed.shape[0]
    assert summary["fraction_zeroed"] == pytest.approx(float(ours.zeroed.double().mean()), abs=1e-12)
    assert 0.0 < summary["fraction_zeroed"] < 1.0
    if mode != "prompt":  # decisions past the prompt differ from HF generate's single-query steps
        step = _run(_lm(model_dir, score=SCORE, threshold=threshold), tasks_dir, ("ih_gen",))
        assert step["inactive_heads"]["fraction_zeroed"] != summary["fraction_zeroed"]


def test_generation_modes_refuse_sampling(model_dir):
    lm = _lm(model_dir, score=SCORE, threshold=0.5, generation_mode="running")
    context = torch.tensor([[5, 6, 7]])
    with pytest.raises(NotImplementedError, match=r"decodes greedily.*asks for sampling.*generation_mode=step"):
        lm._model_generate(context, 6, ["\n"], do_sample=True, temperature=0.7)


@pytest.fixture(scope="module")
def calibration(model_dir, tmp_path_factory) -> tuple[Path, Any]:
    """A run directory whose calibration holds the scores of a few texts on the tiny model."""
    model, tok = tiny_model("llama"), tiny_tokenizer()
    scores = record_scores(model, tok, ["The sky is blue.", "Two plus two equals four.", "A cat says meow."])
    identity = model_identity(model)
    run_dir = make_run(tmp_path_factory.mktemp("run"), [], name="tiny", shape=(3, 4), identity=identity, scores=scores)
    return run_dir, scores


def test_target_takes_its_threshold_from_the_calibration(model_dir, calibration):
    run_dir, scores = calibration
    lm = _lm(model_dir, score=SCORE, target="0.25", calibration=str(run_dir))
    assert lm.policy is not None
    assert lm.policy.threshold == thresholds_from_cdf(scores[SCORE], "below", [0.25])[0]
    assert lm.summary()["target"] == 0.25 and lm.summary()["threshold"] == lm.policy.threshold


def test_static_mode_zeroes_the_target_fraction_of_heads_on_every_row(model_dir, tasks_dir, calibration):
    run_dir, scores = calibration
    lm = _lm(model_dir, score=SCORE, target=0.25, calibration=str(run_dir), mode="static")
    assert lm.policy is not None and lm.policy.mask is not None
    assert torch.equal(lm.policy.mask, static_mask(scores, score=SCORE, fraction=0.25))
    assert int(lm.policy.mask.sum()) == 3  # a quarter of 3 x 4 heads
    summary = _run(lm, tasks_dir)["inactive_heads"]
    assert summary["fraction_zeroed"] == 0.25 and summary["mode"] == "static"
    assert summary["fraction_zeroed_per_head"] == lm.policy.mask.double().tolist()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"score": "nope", "threshold": 0.1}, "unknown score 'nope'"),
        ({"score": SCORE, "threshold": 0.1, "target": 0.1}, "threshold= or target=, not both"),
        ({"score": SCORE, "target": 0.1}, "target= needs calibration="),
        ({"score": SCORE}, "needs threshold= or target="),
        ({"threshold": 0.1}, "needs score="),
        ({"score": SCORE, "threshold": "x"}, "threshold must be a number"),
        ({"score": SCORE, "target": 1.5, "calibration": "."}, r"target is a fraction of heads in \[0, 1\]"),
        ({"score": SCORE, "threshold": 0.1, "mode": "static"}, "mode=static needs target="),
        ({"score": SCORE, "threshold": 0.1, "mode": "nope"}, "mode must be one of dynamic, static"),
        ({"score": SCORE, "threshold": 0.1, "generation_mode": "x"}, "generation_mode must be one of recompute, step"),
    ],
)
def test_bad_options_name_the_fix(options, message):
    with pytest.raises(ValueError, match=message):
        InactiveHeadsLM(pretrained="never-loaded", **options)


def test_a_directory_without_calibration_is_refused(tmp_path):
    with pytest.raises(ValueError, match="holds no finished calibration; run `inactive-heads calibrate"):
        InactiveHeadsLM(pretrained="never-loaded", score=SCORE, target=0.1, calibration=str(tmp_path))


def test_cli_runs_lm_eval_with_zeroing_end_to_end(model_dir, tasks_dir, tmp_path, capsys):
    out = tmp_path / "out"
    argv = sys.argv
    status = main(
        [
            "lm-eval",
            "--model",
            "inactive_heads",
            "--model_args",
            f"pretrained={model_dir},score={SCORE},threshold=1.0",
            "--tasks",
            "ih_mc,ih_gen",
            "--include_path",
            str(tasks_dir),
            "--output_path",
            str(out),
            "--device",
            "cpu",
            "--batch_size",
            str(BATCH),
        ]
    )
    assert status == 0 and sys.argv is argv
    assert "simple_evaluate" not in vars(lm_eval)  # lm-eval's own, lazily imported, again
    (written,) = out.rglob("results_*.json")
    results = json.loads(written.read_text())
    summary = results["inactive_heads"]
    assert 0.0 < summary["fraction_zeroed"] < 1.0
    assert summary["score"] == SCORE and summary["threshold"] == 1.0 and summary["mode"] == "dynamic"
    assert len(summary["fraction_zeroed_per_layer"]) == 3
    assert set(results["results"]) == {"ih_mc", "ih_gen"}
    printed = capsys.readouterr().out
    assert f"{100 * summary['fraction_zeroed']:.2f}% of heads zeroed" in printed
    assert "ih_mc" in printed  # lm-eval's own table


def test_cli_without_lm_eval_names_the_install(monkeypatch, capsys):
    import inactive_heads as package

    monkeypatch.setitem(sys.modules, "lm_eval", None)
    monkeypatch.delitem(sys.modules, "inactive_heads.lm_eval_model")
    monkeypatch.delattr(package, "lm_eval_model")
    assert main(["lm-eval", "--model", "inactive_heads", "--tasks", "x"]) == 2
    assert "pip install 'inactive-heads[lm-eval]'" in capsys.readouterr().err


def test_cli_hands_lm_eval_every_argument_after_its_own_plugins():
    from inactive_heads.cli import _lm_eval_args

    args = _lm_eval_args(["--plugin", "a.py", "--plugin=b", "--model", "hf", "--plugin", "c.py", "-h"])
    assert args.plugin == ["a.py", "b"]
    assert args.lm_eval_args == ["--model", "hf", "--plugin", "c.py", "-h"]
