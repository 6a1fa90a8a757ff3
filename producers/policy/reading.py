"""Reading comprehension for the CPU policy's pretraining: questions answered from the pages
in front of the model, over synthetic worlds other than any run's.

A real search agent starts from a base model that already reads: asked a question next to a
page, it finds the sentence that answers it. Copying heads alone (`pretrain.py`) let the 1M
policy copy a name, not choose the right one, so behaviour cloning on a few hundred questions
teaches it the train answers rather than reading, and held-out questions stay near zero. Each
reading item is a question of a synthetic world followed by its supporting pages and the
answer; the loss is on the answer only. The worlds are seeded from `FIRST_WORLD_SEED` on, far
from the seeds runs use, so no fact of a run's world (its held-out split included) is seen:
what carries over is the skill, not the answers.

Items that open their sequence teach reading at the start only: a policy read 45 % of an unseen
world's questions with nothing before them, 7.5 % with 300 random tokens first and 0 % with 600
(docs/learning.md), while an agent's pages stand 300-900 tokens into its context. With a `lead`,
each batch's items follow that many tokens of world text (one length per batch, up to the lead),
other pages the answer is not on, as an agent's earlier results are.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from asearcher.producers.policy.pretrain import IGNORE, Progress, fit

if TYPE_CHECKING:
    from transformers import PreTrainedModel

FIRST_WORLD_SEED = 1_000_000  # reading worlds are seeded from here; runs use small seeds
WORLDS = 30  # ~12,000 items: more than the steps ever sample, so answers are not memorised
WORLD_ENTITIES = 60
WORLD_QUESTIONS = 400
WORLD_MAX_HOPS = 2
BATCH = 16
PROBE_ITEMS = 40  # of a world the training never sees

Encode = Callable[[str], list[int]]


class ReadingItem(NamedTuple):
    """A question with its pages (the prompt) and the answer's tokens, end of text included."""

    prompt: list[int]
    answer: list[int]


def reading_prompt(question: str, pages: Sequence[tuple[str, str]]) -> str:
    """The question first, as the agent sees it, then each (title, contents) page."""
    shown = "\n\n".join(f"{title}\n{contents}" for title, contents in pages)
    return f"Question: {question}\n\n{shown}\nAnswer:"


def world_items(seed: int, encode: Encode, eos: int) -> list[ReadingItem]:
    """Every question of the short-page world `seed` as a reading item."""
    from asearcher.consumers.world.world import generate_world

    world = generate_world(
        seed, WORLD_ENTITIES, WORLD_QUESTIONS, max_hops=WORLD_MAX_HOPS, filler=False
    )
    pages = {page.url: (page.title, page.contents) for page in world.pages}
    return [
        ReadingItem(
            encode(reading_prompt(q.question, [pages[url] for url in q.supporting_urls])),
            encode(" " + q.answers[0]) + [eos],
        )
        for q in world.questions
    ]


def training_items(encode: Encode, eos: int, worlds: int = WORLDS) -> list[ReadingItem]:
    """The items of `worlds` reading worlds (the probe's world is the next one, unseen)."""
    return [
        item for seed in range(FIRST_WORLD_SEED, FIRST_WORLD_SEED + worlds)
        for item in world_items(seed, encode, eos)
    ]  # fmt: skip


def probe_items(encode: Encode, eos: int, worlds: int = WORLDS) -> list[ReadingItem]:
    """`PROBE_ITEMS` items of the world after the training worlds."""
    return world_items(FIRST_WORLD_SEED + worlds, encode, eos)[:PROBE_ITEMS]


def reading_batch(
    items: Sequence[ReadingItem], rng: random.Random, count: int, pad: int,
    lead: int = 0, lead_text: Sequence[int] = (),
) -> tuple[list[list[int]], list[list[int]]]:  # fmt: skip
    """`count` random items as `prompt + answer`, labelled on the answer only, padded with
    `pad` to one length; with a `lead`, each after 0 to `lead` tokens of `lead_text` (one
    length for the batch, each row its own passage)."""
    rows = [items[rng.randrange(len(items))] for _ in range(count)]
    before = rng.randint(0, min(lead, len(lead_text) - 1)) if lead and lead_text else 0
    leads = []
    for _ in rows:
        start = rng.randrange(0, len(lead_text) - before) if before else 0
        leads.append(list(lead_text[start : start + before]))
    length = before + max(len(prompt) + len(answer) for prompt, answer in rows)
    tokens, labels = [], []
    for first, (prompt, answer) in zip(leads, rows, strict=True):
        padding = length - before - len(prompt) - len(answer)
        tokens.append(first + prompt + answer + [pad] * padding)
        labels.append([IGNORE] * (before + len(prompt)) + answer + [IGNORE] * padding)
    return tokens, labels


def pretrain_reading(
    model: PreTrainedModel,
    items: Sequence[ReadingItem],
    steps: int,
    seed: int,
    pad_id: int,
    progress: Progress | None = None,
    lead: int = 0,
    lead_text: Sequence[int] = (),
) -> float:
    """Train `model` in place for `steps` steps on reading items (after leads of up to `lead`
    tokens of `lead_text`); the last loss."""
    if not items:
        raise ValueError("no reading items to pretrain on")
    rng = random.Random(f"{seed}:reading")
    return fit(
        model, lambda: reading_batch(items, rng, BATCH, pad_id, lead, lead_text), steps, seed,
        progress,
    )  # fmt: skip


def reading_accuracy(
    model: PreTrainedModel, items: Sequence[ReadingItem], lead: int = 0, vocab_size: int = 0
) -> float:
    """The share of `items` whose answer the model's greedy continuation gives token for
    token, end of text included; with a `lead`, each item after that many random tokens of the
    learned vocabulary (ids 257 to `vocab_size`), where a policy that reads only what its
    sequence begins with scores 0."""
    import torch

    rng = random.Random("reading-probe")
    right = 0
    model.eval()
    for prompt, answer in items:
        tokens = [rng.randrange(257, vocab_size) for _ in range(lead)] + list(prompt)
        with torch.no_grad():
            for _ in answer:
                tokens.append(int(model(torch.tensor([tokens])).logits[0, -1].argmax()))
        right += tokens[lead + len(prompt) :] == answer
    return right / len(items) if items else 0.0
