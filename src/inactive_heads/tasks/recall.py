"""``recall``: a self-generated in-context recall task (no files), solved by induction heads.

Each item lists words, then starts the list again; the answer is the next word of the list::

    Words: apple, river, stone, cloud, horse, ...
    Again: apple, river,  ->  " stone" | " cloud" | " horse" | " apple"

All four choices are words from the same list, so only copying the right successor (induction: find the previous
occurrence of the current word, copy what followed it) beats chance (25%). SmolLM2-135M-Instruct scores ~95%,
which makes the task a sensitive probe of zeroing offline, where the standard benchmarks leave small models near
chance. Generated deterministically from ``seed``; the registered ``recall`` is ``recall_task()`` (200 items).
"""

from __future__ import annotations

import random
from pathlib import Path

from ..errors import InactiveHeadsError
from . import Item, Task, register_task

__all__ = ["WORDS", "recall_task"]

WORDS = (
    "apple",
    "river",
    "stone",
    "cloud",
    "horse",
    "table",
    "green",
    "music",
    "paper",
    "light",
    "water",
    "bread",
    "chair",
    "dream",
    "flower",
    "garden",
    "island",
    "jacket",
    "kitten",
    "ladder",
    "mirror",
    "needle",
    "orange",
    "pencil",
    "rabbit",
    "silver",
    "tiger",
    "violin",
    "window",
    "yellow",
    "anchor",
    "basket",
    "candle",
    "dragon",
    "forest",
    "guitar",
    "hammer",
    "lemon",
    "market",
    "ocean",
    "planet",
    "rocket",
    "shadow",
    "tomato",
    "valley",
    "wallet",
    "bottle",
    "castle",
    "desert",
    "engine",
    "finger",
    "monkey",
    "pepper",
    "school",
    "summer",
    "ticket",
)


def _generate(rng: random.Random, n_items: int, n_words: int, prefix: str) -> list[Item]:
    items = []
    for i in range(n_items):
        words = rng.sample(WORDS, n_words)
        k = rng.randrange(1, n_words - 1)  # at least two words repeated before the answer
        answer = words[k + 1]
        distractors = rng.sample([w for w in words if w not in (answer, words[k])], 3)
        choices = [answer, *distractors]
        rng.shuffle(choices)
        text = f"Words: {', '.join(words)}.\nAgain: {', '.join(words[: k + 1])},"
        items.append(Item(f"{prefix}:{i}", (text,), tuple(choices), choices.index(answer)))
    return items


def recall_task(n_items: int = 200, seed: int = 0, n_words: int = 10) -> Task:
    """``n_items`` recall questions over lists of ``n_words`` words, from ``seed`` (few-shot pool: 50 more)."""
    if not 5 <= n_words <= len(WORDS):
        raise InactiveHeadsError(f"n_words must be in 5..{len(WORDS)}, got {n_words}")
    rng = random.Random(seed)
    items = _generate(rng, n_items, n_words, f"recall/{seed}")
    pool = _generate(rng, 50, n_words, f"recall/{seed}/fewshot")
    return Task(
        name="recall",
        items=items,
        metrics=("acc", "acc_norm"),
        default_shots=0,
        fewshot={"": pool},
        split=f"generated(seed={seed}, n_items={n_items}, n_words={n_words})",
        fewshot_split="generated",
        sources=[f"generated:recall(seed={seed}, n_items={n_items}, n_words={n_words})"],
    )


@register_task("recall", summary="generated in-context word recall, 200 items, 4 choices", sources=("files", "hub"))
def recall(data_dir: Path | None, source: str) -> Task:
    """The default recall task; needs no data directory."""
    return recall_task()
