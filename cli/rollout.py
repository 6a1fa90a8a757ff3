"""`asearcher rollout serve|request`: rollout producers and the requests they answer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from asearcher.cli.options import Instance, StoreUrl, overriding
from asearcher.cli.wiring import ClusterOptions, as_cli_error, serve_producer, with_cluster
from asearcher.producers.rollout.service import RolloutConfig

if TYPE_CHECKING:
    pass
from asearcher.cli.jobs.requests import (
    request_events,
)

console = Console()
app = typer.Typer(
    help="Rollout producers: play agent trajectories for requested questions.",
    no_args_is_help=True,
)

ConfigFile = Annotated[
    Path | None, typer.Option("--config", "-c", help="Rollout config (TOML), see docs/rollout.md.")
]


@app.command("serve")
@with_cluster
def serve(
    config_file: ConfigFile = None,
    engine: Annotated[
        str,
        typer.Option(
            help="transformers (CPU), vllm (GPU), expert (scripted oracle) or endpoint (no local "
            "model: the workflow calls its own endpoint)."
        ),
    ] = "transformers",
    model: Annotated[
        Path | None,
        typer.Option(help="Hugging Face model directory.", show_default="<home>/model"),
    ] = None,
    qa: Annotated[
        Path | None,
        typer.Option(
            help="qa_*.jsonl the expert engine knows the answers of (or a world's directory: all)."
        ),
    ] = None,
    mistake_rate: Annotated[
        float, typer.Option(help="Expert engine: share of answers it gets wrong on purpose.")
    ] = 0.0,
    concurrency: Annotated[
        int | None, typer.Option(help=overriding(RolloutConfig, "concurrency"))
    ] = None,
    instance: Instance = None,
    max_groups: Annotated[
        int | None, typer.Option(help="Stop after this many finished groups.")
    ] = None,
    group: Annotated[str | None, typer.Option(help=overriding(RolloutConfig, "group_id"))] = None,
    store: StoreUrl = None,
    *,
    cluster: ClusterOptions,
) -> None:
    """Play requested groups until Ctrl-C/SIGTERM, emitting steps, tool calls and trajectories.

    Run more copies to add throughput: they share rollout.requests through one consumer group.
    Tool calls need `asearcher tools serve` running; weights follow the `weights` topic.
    """
    from asearcher.producers.rollout.service import load_rollout_config

    with as_cli_error(ValueError):
        config = load_rollout_config(
            config_file, concurrency=concurrency, instance=instance, group_id=group, store=store
        )
    serve_producer("rollout producer", config, engine, model, qa, mistake_rate, cluster, max_groups)


@app.command("request")
@with_cluster
def request(
    qa: Annotated[
        Path,
        typer.Option(
            help="A QA file: JSON lines or a .json array; question, answer/answers/gt, "
            "optional aug_answer and id/idx/qid (the reference's layouts)."
        ),
    ],
    limit: Annotated[
        int | None,
        typer.Option(help="How many questions to request, picked by --seed (default: all)."),
    ] = None,
    group_size: Annotated[int, typer.Option(help="Trajectories per question (GRPO group).")] = 4,
    max_turns: Annotated[int, typer.Option(help="Turn limit of each trajectory.")] = 32,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens generated per turn at most.")] = 512,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 1.0,
    purpose: Annotated[str, typer.Option(help="train, eval or synthesis.")] = "train",
    seed: Annotated[int, typer.Option(help="Which questions are picked.")] = 0,
    *,
    cluster: ClusterOptions,
) -> None:
    """Publish RolloutRequested events for questions of a QA file onto rollout.requests."""
    from asearcher.streams.io.producer import EventProducer
    from asearcher.streams.wire.topics import ROLLOUT_REQUESTS

    events = request_events(
        qa, limit, group_size, max_turns, max_new_tokens, temperature, purpose, seed
    )
    connection = cluster.connect(check_local=False)
    with EventProducer(connection.settings, connection.codec) as producer:
        for event in events:
            producer.send(ROLLOUT_REQUESTS, event)
    console.print(f"requested {len(events)} groups of {group_size} on {ROLLOUT_REQUESTS}")
