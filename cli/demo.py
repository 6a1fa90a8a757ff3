"""`asearcher demo`: the main job on the embedded defaults.

It brings the local broker and the topics up, builds a knowledge base over a synthetic world,
creates the small CPU policy, and runs a real rollout producer with a real tool worker:
first with the scripted expert (it knows the world's answers, so the full search → browse →
answer path shows with reward 1), then with the CPU model itself (untrained, so mostly format
failures, but real generation with per-token log-probs and versions). A stand-in trainer reads
half of the trajectories; then one trajectory is replayed turn by turn and the status of every
topic and consumer group is shown.
"""

from __future__ import annotations

from contextlib import closing
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from asearcher.cli.render import status_view
from asearcher.cli.run.config import DataConfig
from asearcher.cli.run.prepare import policy, world_and_index
from asearcher.cli.wiring import ClusterOptions, broker_up, with_cluster
from asearcher.consumers.tools.tool_thread import ToolWorkerThread
from asearcher.consumers.tools.toolbox import load_tool_config

console = Console()
DEMO_GROUP = "demo-rollout-producers"


@with_cluster
def demo(
    questions: Annotated[int, typer.Option(help="Questions per engine.")] = 4,
    group_size: Annotated[int, typer.Option(help="Trajectories per question.")] = 4,
    max_new_tokens: Annotated[int, typer.Option(help="CPU model: tokens per turn at most.")] = 96,
    entities: Annotated[int, typer.Option(help="Size of the synthetic world.")] = 300,
    seed: Annotated[int, typer.Option(help="Seed of the world, the model and the picks.")] = 0,
    *,
    cluster: ClusterOptions,
) -> None:
    """Bring the event log up, roll out questions with a real producer and tool worker, show it."""
    from asearcher.streams.cluster.settings import state_dir

    broker_up(9092, cluster.bootstrap, cluster.kafka_config, cluster.home)
    connection = cluster.connect(
        check_local=False  # just brought up by broker_up
    )
    settings, codec = connection.settings, connection.codec
    root = state_dir(cluster.home) / "demo"
    data = DataConfig(world_seed=seed, world_entities=entities)
    files, index_dir = world_and_index(root / data.world_key(), data)
    model_dir = policy(root / "model", files["corpus"], seed)
    finished = []
    tools = load_tool_config(None, index_dir=str(index_dir), search_mode="bm25")
    results = (state_dir(cluster.home) / "tool-results").as_uri()
    with ToolWorkerThread(settings, codec, tools, results, group_id="demo-tool-workers") as worker:
        for engine, tokens in (("expert", 256), ("transformers", max_new_tokens)):
            finished += _roll_out(
                settings, codec, engine, model_dir, files["qa_train"], questions, group_size,
                tokens, seed,
            )  # fmt: skip
        console.print(f"tool worker answered calls as {worker.worker.name}")
    _show_groups(finished)
    _train_on_half(settings, codec, len(finished))
    _replay(settings, codec, finished[0].trajectory_id if finished else None)
    console.print(status_view(settings, cluster.home, None))


def _roll_out(settings, codec, engine_kind, model_dir, qa, questions, group_size, tokens, seed):
    from asearcher.cli.jobs.requests import request_events
    from asearcher.producers.engines.registry import make_engine
    from asearcher.producers.rollout.service import RolloutConfig, RolloutService
    from asearcher.producers.rollout.staleness import StalenessConfig
    from asearcher.streams.cluster.admin import skip_backlog
    from asearcher.streams.io.producer import EventProducer
    from asearcher.streams.wire.topics import ROLLOUT_REQUESTS

    requests = request_events(qa, questions, group_size, 16, tokens, 1.0, "train", seed)
    # Requests left by earlier runs stay for other producers; this demo plays its own.
    skip_backlog(settings, DEMO_GROUP, ROLLOUT_REQUESTS)
    with EventProducer(settings, codec) as producer:
        for request in requests:
            producer.send(ROLLOUT_REQUESTS, request)
    engine = make_engine(engine_kind, model_dir, qa_file=qa)
    config = RolloutConfig(group_id=DEMO_GROUP, staleness=StalenessConfig(enabled=False))
    with (
        closing(RolloutService(settings, codec, engine, config)) as service,
        console.status(f"rolling out {len(requests)} groups of {group_size} ({engine_kind})"),
    ):
        stats = service.run(max_groups=len(requests), timeout=600)
    console.print(f"{engine_kind}: {stats.line(0, engine.version)}")
    return _finished_groups(settings, codec, {r.group_id for r in requests})


def _finished_groups(settings, codec, group_ids: set[str]) -> list:
    from asearcher.streams.io.replay import ReplayRange, read_range
    from asearcher.streams.wire.events import TrajectoryFinished
    from asearcher.streams.wire.topics import TRAJECTORIES

    records = read_range(settings, codec, [TRAJECTORIES], ReplayRange())
    return [
        r.event for r in records
        if isinstance(r.event, TrajectoryFinished) and r.event.group_id in group_ids
    ]  # fmt: skip


def _show_groups(finished: list) -> None:
    table = Table(title="Finished trajectories by group")
    for column in ("question", "n", "rewards", "turns", "tokens", "finish"):
        table.add_column(column, justify="left" if column in ("question", "finish") else "right")
    groups: dict[str, list] = {}
    for trajectory in finished:
        groups.setdefault(trajectory.group_id, []).append(trajectory)
    for members in groups.values():
        reasons = sorted({t.finish_reason for t in members})
        table.add_row(
            members[0].question_id,
            str(len(members)),
            " ".join(f"{t.reward:.2f}" for t in members),
            " ".join(str(t.num_turns) for t in members),
            f"{sum(len(t.token_ids) for t in members):,}",
            ", ".join(reasons),
        )
    console.print(table)


def _train_on_half(settings, codec, trajectories: int) -> None:
    from asearcher.streams.io.consumer import EventConsumer
    from asearcher.streams.wire.topics import TRAJECTORIES

    # A stand-in trainer reads half of this run's trajectories, so `status` shows it lagging.
    with EventConsumer(settings, "demo-trainer", [TRAJECTORIES], codec) as consumer:
        stats = consumer.run(
            lambda record: None, max_messages=max(1, trajectories // 2), timeout=30
        )
    console.print(f"group demo-trainer consumed {stats.handled} trajectories")


def _replay(settings, codec, trajectory_id: str | None) -> None:
    from asearcher.cli.render import print_trajectory
    from asearcher.streams.io.replay import ReplayRange, read_range
    from asearcher.streams.wire.topics import ROLLOUT_STEPS, TOOL_CALLS, TOOL_RESULTS, TRAJECTORIES

    if trajectory_id is None:
        return
    topics = [ROLLOUT_STEPS, TOOL_CALLS, TOOL_RESULTS, TRAJECTORIES]
    one = ReplayRange(trajectory_id=trajectory_id)
    print_trajectory(console, read_range(settings, codec, topics, one))
