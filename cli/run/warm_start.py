"""A run's warm start: the scripted expert demonstrates, the policy clones it (SFT).

`stream up` runs it before the run's services start, when `warm_start.enabled` and the run has
announced no version yet. The expert plays the chosen train questions through a real rollout
producer and a real tool worker in this process, onto `expert.requests` / `expert.trajectories`
(topics the RL trainer never reads), each request tagged with the run's name and keyed by a
group id made from the run and the question, so a warm start killed half way plays only what
is missing when started again. The questions are those of the demonstration worlds
(`warm_start.worlds`, each searched through its own knowledge base), or the run's own train
split. Then `SftJob` replays the run's demonstrations from the topic, clones them through the
trainer's DeepSpeed code and announces the result as the run's first version: the trainer
resumes from it and the producers load it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import msgspec
from rich.console import Console

from asearcher.cli.run.config import Paths, Resolved, RunConfig, groups
from asearcher.consumers.world.world import WorldQuestion
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.service.log import quieter
from asearcher.streams.storage.weight_reader import PublishedVersion
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import RolloutRequested, TrajectoryFinished
from asearcher.streams.wire.topics import EXPERT_REQUESTS, EXPERT_TRAJECTORIES, TOOL_CALLS, WEIGHTS

if TYPE_CHECKING:
    import torch

    from asearcher.cli.run.clone_cache import KeptClone
    from asearcher.trainer.runtime.weight_publisher import WeightStore
    from asearcher.trainer.sft.sft_job import SftConfig, SftJob, TrainingSet

console = Console()
DEMONSTRATION_TIMEOUT_S = 1800.0


class Demonstrations(NamedTuple):
    """Questions the expert plays with the knowledge base they are asked about."""

    qa: Path
    index_dir: Path
    questions: list[WorldQuestion]


def warm_start(
    config: RunConfig, resolved: Resolved, where: Paths, settings: KafkaSettings,
    codec: EventCodec,
) -> PublishedVersion | None:  # fmt: skip
    """Clone the expert into the run's first version unless the run has one; that version."""
    from asearcher.trainer.runtime.service import last_announced
    from asearcher.trainer.runtime.weight_publisher import WeightStore

    store = WeightStore(where.store)
    announced = last_announced(settings, codec, WEIGHTS, config.name, store)
    if announced is not None:
        console.print(f"warm start: run {config.name!r} is at v{announced.version}; skipped")
        return None
    done = demonstrated(settings, codec, config.name)
    played = 0
    for source in demonstration_sources(where, config):
        missing = [q for q in source.questions if q.id not in done]
        if missing:
            play_expert(
                config, resolved, where, settings, codec, source._replace(questions=missing)
            )
        played += len(missing)
    if not played:
        console.print(f"warm start: the expert's {len(done)} demonstrations are on the topic")
    return clone(config, resolved, where, settings, codec, store)


def demonstration_sources(where: Paths, config: RunConfig) -> list[Demonstrations]:
    """What the expert demonstrates on: each demonstration world's train split, or the run's."""
    if where.demonstration_worlds:
        return [
            Demonstrations(
                world / "qa_train.jsonl",
                world / "index",
                demonstration_questions(world / "qa_train.jsonl", config),
            )  # fmt: skip
            for world in where.demonstration_worlds
        ]
    return [Demonstrations(where.qa, where.index_dir, demonstration_questions(where.qa, config))]


def demonstration_questions(qa: Path, config: RunConfig) -> list[WorldQuestion]:
    """The questions of `qa` the expert demonstrates: at most `max_hops` hops, the first
    `questions` of them."""
    decoder = msgspec.json.Decoder(WorldQuestion)
    lines = [line for line in qa.read_bytes().splitlines() if line.strip()]
    section = config.warm_start
    picked = [q for q in map(decoder.decode, lines)
              if section.max_hops is None or q.hops <= section.max_hops]  # fmt: skip
    return picked[: section.questions] if section.questions else picked


def demonstrated(settings: KafkaSettings, codec: EventCodec, run: str) -> set[str]:
    """Question ids the run's expert already has a committed trajectory of."""
    from asearcher.streams.io.tail import read_to_end

    return {
        record.event.question_id
        for record in read_to_end(settings, codec, EXPERT_TRAJECTORIES, timeout_s=300.0)
        if isinstance(record.event, TrajectoryFinished) and record.event.metadata.get("run") == run
    }


def play_expert(
    config: RunConfig, resolved: Resolved, where: Paths, settings: KafkaSettings,
    codec: EventCodec, source: Demonstrations,
) -> None:  # fmt: skip
    """The expert plays the source's questions once each with the run's agent, tools (over the
    source's knowledge base) and sampling."""
    from asearcher.consumers.tools.tool_thread import ToolWorkerThread
    from asearcher.producers.engines.registry import make_engine
    from asearcher.producers.rollout.service import RolloutService, RolloutTopics
    from asearcher.producers.rollout.staleness import StalenessConfig
    from asearcher.streams.cluster.admin import skip_backlog
    from asearcher.streams.io.producer import EventProducer

    name, world = config.name, source.index_dir.parent.name
    # Its own tool pool: no tool worker of the run (or of another warm start) answers its calls.
    pool = f"{name}-expert"
    # A group per world: the next world's producer never joins a group the last one just left.
    producers_group = f"{groups(name)['rollout']}-expert-{world}"
    # Requests a killed warm start left unplayed are sent again below: skip the old copies.
    skip_backlog(settings, producers_group, EXPERT_REQUESTS)
    requests = [_request(name, q, resolved) for q in source.questions]
    with EventProducer(settings, codec) as producer:
        for request in requests:
            producer.send(EXPERT_REQUESTS, request)
        producer.flush()
    rollout = msgspec.structs.replace(
        resolved.rollout[0] if resolved.rollout else resolved.evaluator,
        mode="train", model=f"{name}-expert", instance=f"{name}-expert", group_id=producers_group,
        topics=RolloutTopics(requests=EXPERT_REQUESTS, trajectories=EXPERT_TRAJECTORIES),
        staleness=StalenessConfig(enabled=False), concurrency=8, tool_pool=pool,
    )  # fmt: skip
    engine = make_engine(
        "expert", where.model_dir, qa_file=source.qa,
        shortcut_rate=config.warm_start.shortcut_rate, quote=config.warm_start.quote_evidence,
        cue=config.warm_start.cue_evidence,
    )  # fmt: skip
    tools = msgspec.structs.replace(resolved.tools, index_dir=str(source.index_dir), pool=pool)
    results = (where.run_dir / "tool-results").as_uri()
    tools_group = f"{groups(name)['tools']}-expert-{world}"
    skip_backlog(settings, tools_group, TOOL_CALLS)
    with (
        quieter("producers", "consumers", "streams"),
        ToolWorkerThread(settings, codec, tools, results, tools_group),
        closing(RolloutService(settings, codec, engine, rollout)) as service,
        console.status(f"warm start: the expert plays {len(requests)} questions of {world}"),
    ):
        stats = service.run(max_groups=len(requests), timeout=DEMONSTRATION_TIMEOUT_S)
    console.print(f"warm start: expert on {world}: {stats.line(0, engine.version)}")


def _request(run: str, question: WorldQuestion, resolved: Resolved) -> RolloutRequested:
    return RolloutRequested(
        question_id=question.id, group_id=f"{run}-expert-{question.id}",
        question=question.question, gold_answers=list(question.answers), group_size=1,
        supporting_urls=list(question.supporting_urls), sampling=resolved.feeder.sampling,
        purpose="train", metadata={"run": run},
    )  # fmt: skip


def cloning_config(config: RunConfig, *, model: str, seed: int) -> SftConfig:
    """How the warm start clones the run's demonstrations (its epochs, batch and rate) into
    the versions of `model`, shuffled with `seed`."""
    from asearcher.trainer.sft.sft_job import SftConfig

    section = config.warm_start
    return SftConfig(
        topic=EXPERT_TRAJECTORIES, model=model, run=config.name, epochs=section.epochs,
        min_reward=section.min_reward, trajectories_per_step=section.batch, lr=section.lr,
        lr_decay=section.lr_decay, seed=seed,
        micro_batch_tokens=config.trainer.config.batching.micro_batch_tokens,
    )  # fmt: skip


def clone(
    config: RunConfig, resolved: Resolved, where: Paths, settings: KafkaSettings,
    codec: EventCodec, store: WeightStore,
) -> PublishedVersion:  # fmt: skip
    """Behaviour cloning of the run's demonstrations into its next announced version: with
    `warm_start.orders` or `warm_start.snapshots` > 1, the clone (of its orders, at the steps
    of its last epoch) that scores best on the demonstration worlds' held-out questions
    (`clone_selection`); with `warm_start.keep_clone`, the one this machine kept from a run
    with the same inputs (`clone_cache`), or the new one, kept."""
    from asearcher.cli.run.clone_cache import clone_key, keep_clone, kept_clone
    from asearcher.trainer.sft.sft_job import SftJob

    def job(seed: int) -> SftJob:
        sft = cloning_config(config, model=config.name, seed=seed)
        return SftJob(settings, codec, sft, where.model_dir, store)

    first = job(config.data.world_seed)
    data = first.data()
    console.print(f"warm start: cloning {data.summary()}")
    if not data.trajectories:
        raise ValueError(f"warm start: the expert left nothing to imitate on {first.config.topic}")
    keep = config.warm_start.keep_clone
    key = clone_key(config, resolved, where, first.config, data) if keep else None
    found = kept_clone(key) if key else None
    if found is not None:
        record, weights, kept = found
        console.print(f"warm start: cloned before on this machine, copied from {kept}")
        chosen = first if record.seed == first.config.seed else job(record.seed)
    else:
        chosen, record, weights = _clone_afresh(config, resolved, where, first, job, data, key)
        if key:
            keep_clone(key, record, weights)
    published = chosen.publish(data, record.losses, record.notes, weights)
    console.print(
        f"warm start: v{published.version} announced (loss {record.losses[0]:.3f} -> "
        f"{record.losses[-1]:.3f} over {len(record.losses)} steps, shuffle seed {record.seed})"
    )
    return published


def _clone_afresh(
    config: RunConfig, resolved: Resolved, where: Paths, first: SftJob,
    job: Callable[[int], SftJob], data: TrainingSet, key: str | None,
) -> tuple[SftJob, KeptClone, dict[str, torch.Tensor]]:  # fmt: skip
    """The clone to announce: its job, what it was and its weights."""
    from asearcher.cli.jobs.cloning import train_with_progress
    from asearcher.cli.run.clone_cache import KeptClone
    from asearcher.cli.run.clone_selection import best_clone

    if config.warm_start.orders > 1 or config.warm_start.snapshots > 1:
        return best_clone(config, resolved, where, first, job, data, key)
    results = train_with_progress(first, data, "warm start (sft)")
    losses = [r.stats.loss for r in results]
    return first, KeptClone(seed=first.config.seed, losses=losses), first.state_dict()
