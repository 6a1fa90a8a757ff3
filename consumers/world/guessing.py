"""How much of a synthetic world's questions can be answered without reading a page.

A question's *kind* is what it asks whatever entity it starts from: the kind of its start entity,
the relations it follows and what it reads last ("which university did the founder of X
attend?"). Over every chain the world holds (each start entity, each path that never revisits an
entity, as `make_questions` walks them), a kind's *prior* is the share of its chains whose answer
is the kind's commonest one: what a policy that answers every question of that kind alike scores.

Small worlds have kinds with high priors (one country: every "in which country ..." question has
one answer; two universities: half the "which university ..." ones share theirs), and RL rewarded
on such questions learns to guess instead of to read. `make_questions(max_answer_share=p)` leaves
out the questions of kinds whose prior exceeds p.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from asearcher.consumers.scoring.reward import exact_match, f1_score
from asearcher.consumers.world.world import (
    ATTRIBUTES,
    Chain,
    Entity,
    WorldGraph,
    WorldQuestion,
    read_world_questions,
)

# (kind of the start entity, relations followed, relation or attribute read last)
QuestionKind = tuple[str, tuple[str, ...], str]


def _finals(graph: WorldGraph, entity: Entity, seen: set[int]) -> Iterator[tuple[str, str]]:
    """What a chain ending at `entity` can ask, with the answer: as `_walk` picks its final."""
    for rel, target in entity.rels.items():
        if target not in seen:
            yield rel, graph.entities[target].name
    for kind, attr in ATTRIBUTES:
        if kind == entity.kind and attr in entity.attrs:
            yield attr, str(entity.attrs[attr])


def chain_answers(graph: WorldGraph, max_hops: int) -> Iterator[tuple[QuestionKind, str]]:
    """Every chain of at most `max_hops` reads in `graph`: its question kind and answer."""
    for start in graph.entities:
        paths: list[tuple[Entity, set[int], tuple[str, ...]]] = [(start, {start.id}, ())]
        while paths:
            entity, seen, steps = paths.pop()
            for final, answer in _finals(graph, entity, seen):
                yield (start.kind, steps, final), answer
            if len(steps) + 1 < max_hops:
                for rel, target in entity.rels.items():
                    if target not in seen:
                        paths.append((graph.entities[target], seen | {target}, (*steps, rel)))


def answer_priors(graph: WorldGraph, max_hops: int) -> dict[QuestionKind, float]:
    """Each question kind's prior: the share of its chains that have its commonest answer."""
    answers: dict[QuestionKind, Counter[str]] = {}
    for kind, answer in chain_answers(graph, max_hops):
        answers.setdefault(kind, Counter())[answer] += 1
    return {kind: counts.most_common(1)[0][1] / counts.total() for kind, counts in answers.items()}


def question_kind(graph: WorldGraph, chain: Chain) -> QuestionKind:
    """The kind of the question `chain` asks in `graph`."""
    start = next(e for e in graph.entities if e.name == chain.start)
    return start.kind, chain.steps, chain.final


class GuessScore(NamedTuple):
    """What answering without reading scores on a world's held-out questions."""

    f1: float
    em: float
    questions: int


def _template(question: WorldQuestion) -> str:
    """The question with its start entity's name (the first supporting page's title) taken out."""
    start = question.supporting_urls[0].rsplit("/", 1)[-1].replace("_", " ")
    return question.question.replace(start, "{x}")


def template_guess(questions: list[WorldQuestion], held_out: set[str] | None = None) -> GuessScore:
    """Each held-out question (of `held_out` ids, if given) answered with the commonest train
    answer of its template (no answer where no train question shares it): what a policy that
    reads nothing can score."""
    answers: dict[str, Counter[str]] = {}
    for question in questions:
        if question.split == "train":
            answers.setdefault(_template(question), Counter())[question.answers[0]] += 1
    test = [q for q in questions if q.split == "test" and (held_out is None or q.id in held_out)]
    f1 = em = 0.0
    for question in test:
        seen = answers.get(_template(question))
        guess = seen.most_common(1)[0][0] if seen else ""
        f1 += f1_score(guess, question.answers)
        em += exact_match(guess, question.answers)
    count = max(len(test), 1)
    return GuessScore(f1 / count, em / count, len(test))


def world_template_guess(world_dir: Path, held_out: set[str] | None = None) -> GuessScore | None:
    """`template_guess` of the world written in `world_dir`; None where its files are not a
    synthetic world's (no supporting pages to name a question's start)."""
    questions = read_world_questions(world_dir)
    if not questions or not all(q.supporting_urls for q in questions):
        return None
    return template_guess(questions, held_out)
