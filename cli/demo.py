"""`asearcher demo`: the main job on the embedded defaults.

For now it brings the local broker and the topics up, pushes a sample of agent episodes through
them, lets two consumer groups read part of it, replays one trajectory and shows the status.
Later stages (rollout producers, tool workers, trainer) will join this topology.
"""

from __future__ import annotations

import random
import socket
from collections import Counter
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import track

from asearcher.cli.options import BootstrapServers, ClaimsUrl, Home, KafkaConfig, cluster
from asearcher.cli.stream import status, up

console = Console()


def demo(
    questions: Annotated[int, typer.Option(help="How many sample episodes to push through.")] = 50,
    seed: Annotated[int, typer.Option(help="Seed of the sample generator.")] = 0,
    bootstrap: BootstrapServers = None,
    kafka_config: KafkaConfig = None,
    home: Home = None,
    claims_url: ClaimsUrl = None,
) -> None:
    """Bring the event log up, push sample episodes through it and show what happened."""
    from asearcher.cli.render import print_trajectory
    from asearcher.streams.codec import EventCodec
    from asearcher.streams.consumer import EventConsumer
    from asearcher.streams.producer import EventProducer
    from asearcher.streams.replay import ReplayRange, read_range
    from asearcher.streams.samples import episode
    from asearcher.streams.settings import claim_store
    from asearcher.streams.topics import ROLLOUT_STEPS, TOOL_CALLS, TOOL_RESULTS, TRAJECTORIES

    up(port=9092, bootstrap=bootstrap, kafka_config=kafka_config, home=home)
    settings = cluster(bootstrap, kafka_config, home)
    codec = EventCodec(claim_store(claims_url, home))
    rng = random.Random(seed)
    run = f"demo-{socket.gethostname()}-{rng.randrange(1 << 32):08x}"
    last_trajectory = None
    produced: Counter[str] = Counter()
    with EventProducer(settings, codec) as producer:
        for i in track(range(questions), description="producing sample episodes", console=console):
            for out in episode(rng, question_id=f"{run}-q{i}"):
                producer.send(out.topic, out.event, key=out.key)
                produced[out.topic] += 1
                last_trajectory = getattr(out.event, "trajectory_id", last_trajectory)
    console.print(f"produced {producer.delivered:,} events for {questions} episodes")
    # Two groups read what they would consume in the full system; the trainer reads only half
    # of this run's trajectories, so `status` shows it lagging.
    readers = (("demo-tool-worker", TOOL_CALLS, 1.0), ("demo-trainer", TRAJECTORIES, 0.5))
    for group, topic, share in readers:
        wanted = max(1, int(produced[topic] * share))
        with EventConsumer(settings, group, [topic], codec) as consumer:
            stats = consumer.run(lambda record: None, max_messages=wanted, timeout=30)
        console.print(f"group {group} consumed {stats.handled} events from {topic}")
    if last_trajectory:
        rng_one = ReplayRange(trajectory_id=last_trajectory)
        topics = [ROLLOUT_STEPS, TOOL_CALLS, TOOL_RESULTS, TRAJECTORIES]
        print_trajectory(console, read_range(settings, codec, topics, rng_one))
    status(bootstrap=bootstrap, kafka_config=kafka_config, home=home)
