"""The best of several cloning orders: clones scored on questions that none of them trained on.

Clones of the same demonstrations differ by the order they were shuffled in: seven orders of
one run's demonstrations scored 0.13-0.23 held-out F1, beyond the evaluation's noise
(tests/benchmarks/bench_clone_orders.py, docs/learning.md). With `warm_start.orders` > 1 the
warm start clones once per order and keeps the clone that answers best on the held-out
questions of the demonstration worlds, each searched through its own knowledge base. The run's
own world is never played here: its train split is RL's, its held-out split the evaluation's.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import msgspec
from rich.console import Console

from asearcher.cli.run.config import Paths, Resolved, RunConfig
from asearcher.consumers.world.world import WorldQuestion
from asearcher.streams.service.log import quieter

if TYPE_CHECKING:
    import torch

    from asearcher.cli.run.clone_cache import KeptClone
    from asearcher.producers.agents.agent import AgentConfig
    from asearcher.producers.engines.base import InferenceEngine
    from asearcher.producers.rollout.tool_router import InProcessToolClient
    from asearcher.streams.wire.events import SamplingSettings
    from asearcher.trainer.sft.sft_job import SftJob, TrainingSet

console = Console()
PLAYS_AT_ONCE = 8  # the engine batches this many generations: the evaluator's concurrency


class Asked(Protocol):
    """A question with its gold answers (a world's or a benchmark's)."""

    question: str
    answers: list[str]


class HeldOut(NamedTuple):
    """Held-out questions of one demonstration world, with the index they are searched in."""

    world: str
    index_dir: Path
    questions: list[WorldQuestion]


class OrderScore(NamedTuple):
    """How a clone cloned with shuffle seed `seed` answered the selection questions."""

    seed: int
    f1: float
    standard_error: float


def selection_sets(where: Paths, config: RunConfig) -> list[HeldOut]:
    """The held-out split of every demonstration world, at most `selection_questions` of each;
    never a question of the run's world."""
    decoder = msgspec.json.Decoder(WorldQuestion)
    limit = config.warm_start.selection_questions
    sets = []
    for world in where.demonstration_worlds:
        lines = (world / "qa_test.jsonl").read_bytes().splitlines()
        questions = [decoder.decode(line) for line in lines if line.strip()]
        sets.append(HeldOut(world.name, world / "index", questions[:limit] if limit else questions))
    return sets


async def f1_per_question(
    policy: InferenceEngine, tools: InProcessToolClient, agent: AgentConfig,
    questions: Sequence[Asked], sampling: SamplingSettings, samples: int = 1,
) -> list[float]:  # fmt: skip
    """Each question's mean F1 over `samples` plays of `policy`, `PLAYS_AT_ONCE` at a time."""
    from asearcher.producers.agents.agent import run_trajectory
    from asearcher.streams.wire.events import RolloutRequested, new_id

    gate = asyncio.Semaphore(PLAYS_AT_ONCE)

    async def play(question: Asked) -> float:
        request = RolloutRequested(
            question_id=new_id(), group_id=new_id(), question=question.question,
            gold_answers=list(question.answers), group_size=1, purpose="eval",
            sampling=sampling,
        )  # fmt: skip
        async with gate:
            done = await run_trajectory(request, 0, policy, tools, _Unwatched(), agent)
        return done.reward_parts.get("f1", 0.0)

    plays = await asyncio.gather(*(play(q) for q in questions for _ in range(samples)))
    return [statistics.mean(plays[i * samples : (i + 1) * samples]) for i in range(len(questions))]


def mean_and_error(scores: list[float]) -> tuple[float, float]:
    """The mean of `scores` and its standard error (0 for a single score)."""
    error = statistics.stdev(scores) / len(scores) ** 0.5 if len(scores) > 1 else 0.0
    return statistics.mean(scores), error


class _Unwatched:
    """Where a scoring play's steps go: nowhere (only its score is wanted)."""

    def emit(self, event: object) -> None:
        return None


class CloneScorer:
    """Plays clones held in memory on the selection questions, with the run's evaluator agent,
    tools over each demonstration world's index and the evaluation's sampling."""

    def __init__(self, config: RunConfig, resolved: Resolved, where: Paths) -> None:
        from asearcher.consumers.tools.toolbox import Toolbox, build_backends
        from asearcher.producers.engines.registry import make_engine
        from asearcher.producers.rollout.tool_router import InProcessToolClient

        self.sets = selection_sets(where, config)
        self.agent = resolved.evaluator.agent
        self.sampling = config.eval.config.sampling
        self.policy = make_engine("transformers", where.model_dir)
        self.tools = []
        for held_out in self.sets:
            tools = msgspec.structs.replace(resolved.tools, index_dir=str(held_out.index_dir))
            self.tools.append(InProcessToolClient(Toolbox(*build_backends(tools), tools)))

    @property
    def questions(self) -> int:
        """How many questions score each clone."""
        return sum(len(s.questions) for s in self.sets)

    def score(self, seed: int, tensors: dict[str, torch.Tensor]) -> OrderScore:
        """The clone `tensors` (cloned with shuffle `seed`) on every selection question."""
        # The engine and tools log per load and call; the warm start prints the score.
        with quieter("producers", "consumers"):
            return asyncio.run(self._score(seed, tensors))

    async def _score(self, seed: int, tensors: dict[str, torch.Tensor]) -> OrderScore:
        await self.policy.load_tensors(tensors, seed)  # type: ignore[attr-defined]
        scores: list[float] = []
        for held_out, tools in zip(self.sets, self.tools, strict=True):
            scores += await f1_per_question(
                self.policy, tools, self.agent, held_out.questions, self.sampling
            )
        return OrderScore(seed, *mean_and_error(scores))

    def close(self) -> None:
        """Stop the scoring engine's worker."""
        asyncio.run(self.policy.close())


def snapshot_steps(total: int, per_epoch: int, count: int) -> list[int]:
    """`count` steps of the last epoch, evenly spaced and ending with the last step."""
    spacing = max(1, per_epoch // count)
    return sorted({max(1, total - i * spacing) for i in range(count)})


def best_clone(
    config: RunConfig, resolved: Resolved, where: Paths, first: SftJob,
    job: Callable[[int], SftJob], data: TrainingSet, key: str | None = None,
) -> tuple[SftJob, KeptClone, dict[str, torch.Tensor]]:  # fmt: skip
    """`warm_start.orders` clones of `data` (`first`, then `job(seed)` for the next shuffle
    seeds), each scored as it is made at `warm_start.snapshots` steps of its last epoch; the
    best snapshot, still unpublished: its job, what it was (every score in its notes) and its
    weights. With `key` (the clone's inputs, `clone_cache.clone_key`) each order is kept once
    scored, and an order kept by a warm start that was cut is taken as it is."""
    from asearcher.cli.run.clone_cache import keep_order, kept_order

    scorer = CloneScorer(config, resolved, where)
    best: tuple[float, SftJob, KeptClone, dict[str, torch.Tensor]] | None = None
    scores: list[dict[str, Any]] = []
    try:
        for k in range(config.warm_start.orders):
            candidate = first if k == 0 else job(first.config.seed + k)
            kept = kept_order(key, candidate.config.seed) if key else None
            if kept is not None:
                _say(k, kept[0], scorer.questions, "kept by a warm start that was cut, ")
            else:
                kept = clone_order(config, candidate, data, scorer, k)
                if key:
                    keep_order(key, *kept)
            record, weights = kept
            scores += record.notes["scores"]
            f1 = _best_score(record)["f1"]
            if best is None or f1 > best[0]:
                best = (f1, candidate, record, weights)
    finally:
        scorer.close()
    assert best is not None
    _, chosen, record, weights = best
    notes = {
        "snapshot_step": record.notes["snapshot_step"],
        "selection": {
            "scores": scores,
            "questions": [q.id for s in scorer.sets for q in s.questions],
            "worlds": [s.world for s in scorer.sets],
        },
    }  # fmt: skip
    return chosen, msgspec.structs.replace(record, notes=notes), weights


def clone_order(
    config: RunConfig, candidate: SftJob, data: TrainingSet, scorer: CloneScorer, k: int
) -> tuple[KeptClone, dict[str, torch.Tensor]]:
    """Clone `data` in `candidate`'s order (the `k`th), score its snapshots; the best of them
    with its losses up to it, every score in its notes."""
    from asearcher.cli.jobs.cloning import train_with_progress
    from asearcher.cli.run.clone_cache import KeptClone

    orders, epochs = config.warm_start.orders, candidate.config.epochs
    total = candidate.steps(data)
    keep = snapshot_steps(total, total // epochs, config.warm_start.snapshots)
    results = train_with_progress(
        candidate, data, f"warm start (sft, order {k + 1}/{orders})", keep
    )
    losses = [r.stats.loss for r in results]
    scored = []
    for step in keep:
        score = scorer.score(candidate.config.seed, candidate.snapshots[step])
        scored.append({"seed": score.seed, "step": step, "f1": score.f1,
                       "standard_error": score.standard_error})  # fmt: skip
    best = max(scored, key=lambda s: s["f1"])  # the first of equals, as before
    step = best["step"]
    record = KeptClone(
        seed=candidate.config.seed, losses=losses[:step],
        notes={"snapshot_step": step, "scores": scored, "snapshots": len(keep), "total": total},
    )  # fmt: skip
    weights, candidate.snapshots = candidate.snapshots[step], {}
    _say(k, record, scorer.questions)
    return record, weights


def _best_score(record: KeptClone) -> dict[str, Any]:
    step = record.notes["snapshot_step"]
    return next(s for s in record.notes["scores"] if s["step"] == step)


def _say(k: int, record: KeptClone, questions: int, how: str = "") -> None:
    """Print each scored snapshot of the `k`th order."""
    many = record.notes["snapshots"] > 1
    for score in record.notes["scores"]:
        at = f", step {score['step']}/{record.notes['total']}" if many else ""
        console.print(
            f"warm start: order {k + 1} (shuffle seed {score['seed']}{at}): {how}F1 "
            f"{score['f1']:.3f} ± {score['standard_error']:.3f} on {questions} held-out "
            "questions of the demonstration worlds"
        )
