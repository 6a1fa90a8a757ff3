"""`asearcher demo`: the main job on the embedded defaults.

It brings the local broker and the topics up, builds a knowledge base over a synthetic world,
pushes scripted agent episodes through the topics (a stand-in for the rollout producers, which
come next), lets a real tool worker answer their search and browse calls, replays one
trajectory turn by turn and shows the status of every topic and consumer group.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import track

from asearcher.cli.options import BootstrapServers, ClaimsUrl, Home, KafkaConfig, cluster
from asearcher.cli.stream import status, up

console = Console()


def demo(
    questions: Annotated[int, typer.Option(help="How many episodes to push through.")] = 20,
    entities: Annotated[int, typer.Option(help="Size of the synthetic world.")] = 300,
    seed: Annotated[int, typer.Option(help="Seed of the world and the episodes.")] = 0,
    bootstrap: BootstrapServers = None,
    kafka_config: KafkaConfig = None,
    home: Home = None,
    claims_url: ClaimsUrl = None,
) -> None:
    """Bring the event log up, answer scripted episodes' tool calls, and show what happened."""
    from asearcher.streams.codec import EventCodec
    from asearcher.streams.settings import claim_store, state_dir

    up(port=9092, bootstrap=bootstrap, kafka_config=kafka_config, home=home)
    settings = cluster(bootstrap, kafka_config, home)
    codec = EventCodec(claim_store(claims_url, home))
    world, index_dir = _world_and_index(state_dir(home) / "demo", seed, entities)
    produced, trajectory_id = _produce_episodes(settings, codec, world, questions, seed)
    _answer_tool_calls(settings, codec, index_dir, state_dir(home), produced["tool.calls"])
    _train_on_half(settings, codec, produced["trajectories"])
    _replay(settings, codec, trajectory_id)
    status(bootstrap=bootstrap, kafka_config=kafka_config, home=home)


def _world_and_index(root: Path, seed: int, entities: int):
    from asearcher.cli.tools import index_build
    from asearcher.consumers.world import generate_world, write_world

    world = generate_world(seed=seed, entities=entities)
    directory = root / f"world-{seed}-{entities}"
    files = write_world(world, directory)
    # Resumable: a second demo run finds the index built and skips it.
    index_build(corpus=files["corpus"], out=directory / "index", dense=True)
    return world, directory / "index"


def _produce_episodes(settings, codec, world, count: int, seed: int):
    from asearcher.streams.producer import EventProducer
    from asearcher.streams.samples import episode

    rng = random.Random(seed)
    picked = rng.sample(world.questions, min(count, len(world.questions)))
    produced: Counter[str] = Counter()
    trajectory_id = None
    with EventProducer(settings, codec) as producer:
        for question in track(picked, description="producing episodes", console=console):
            actions = [
                ("search", {"query": question.question}),
                ("browse", {"url": question.supporting_urls[0]}),
            ]
            events = episode(
                rng, f"{question.id}-{rng.randrange(1 << 32):08x}", question=question.question,
                answers=tuple(question.answers), actions=actions, with_results=False,
            )  # fmt: skip
            for out in events:
                producer.send(out.topic, out.event, key=out.key)
                produced[out.topic] += 1
                trajectory_id = getattr(out.event, "trajectory_id", trajectory_id)
    console.print(f"produced {sum(produced.values()):,} events for {len(picked)} episodes")
    return produced, trajectory_id


def _answer_tool_calls(settings, codec, index_dir: Path, home: Path, calls: int) -> None:
    from asearcher.consumers.result_store import ResultStore
    from asearcher.consumers.tool_worker import ToolWorker
    from asearcher.consumers.toolbox import Toolbox, build_backends, load_tool_config

    config = load_tool_config(None, index_dir=str(index_dir))
    toolbox = Toolbox(*build_backends(config), config)
    store = ResultStore((home / "tool-results").as_uri())
    worker = ToolWorker(settings, codec, toolbox, store, group_id="demo-tool-workers")
    with console.status(f"a tool worker answers {calls} calls"):
        try:
            stats = worker.run(max_messages=calls, timeout=180)
        finally:
            worker.close()
    console.print(f"tool worker answered {stats.handled} calls")


def _train_on_half(settings, codec, trajectories: int) -> None:
    from asearcher.streams.consumer import EventConsumer
    from asearcher.streams.topics import TRAJECTORIES

    # A stand-in trainer reads half of this run's trajectories, so `status` shows it lagging.
    with EventConsumer(settings, "demo-trainer", [TRAJECTORIES], codec) as consumer:
        stats = consumer.run(
            lambda record: None, max_messages=max(1, trajectories // 2), timeout=30
        )
    console.print(f"group demo-trainer consumed {stats.handled} trajectories")


def _replay(settings, codec, trajectory_id: str | None) -> None:
    from asearcher.cli.render import print_trajectory
    from asearcher.streams.replay import ReplayRange, read_range
    from asearcher.streams.topics import ROLLOUT_STEPS, TOOL_CALLS, TOOL_RESULTS, TRAJECTORIES

    if trajectory_id is None:
        return
    topics = [ROLLOUT_STEPS, TOOL_CALLS, TOOL_RESULTS, TRAJECTORIES]
    one = ReplayRange(trajectory_id=trajectory_id)
    print_trajectory(console, read_range(settings, codec, topics, one))
