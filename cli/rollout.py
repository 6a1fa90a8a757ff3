"""`asearcher rollout serve|request`: rollout producers and the requests they answer."""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from asearcher.cli.errors import CliError
from asearcher.cli.options import BootstrapServers, ClaimsUrl, Home, Instance, KafkaConfig
from asearcher.cli.weights import StoreUrl
from asearcher.cli.wiring import ClusterOptions, as_cli_error, service_command

if TYPE_CHECKING:
    from asearcher.producers.rollout.service import RolloutConfig
    from asearcher.streams.wire.events import SamplingSettings

console = Console()
app = typer.Typer(
    help="Rollout producers: play agent trajectories for requested questions.",
    no_args_is_help=True,
)

ConfigFile = Annotated[
    Path | None, typer.Option("--config", "-c", help="Rollout config (TOML), see docs/rollout.md.")
]


@app.command("serve")
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
        Path | None, typer.Option(help="qa_*.jsonl the expert engine knows the answers of.")
    ] = None,
    mistake_rate: Annotated[
        float, typer.Option(help="Expert engine: share of answers it gets wrong on purpose.")
    ] = 0.0,
    concurrency: Annotated[
        int | None, typer.Option(help="Trajectories played at once (config: concurrency).")
    ] = None,
    instance: Instance = None,
    max_groups: Annotated[
        int | None, typer.Option(help="Stop after this many finished groups.")
    ] = None,
    group: Annotated[
        str | None, typer.Option(help="Consumer group of the producers (config: group_id).")
    ] = None,
    store: StoreUrl = None,
    bootstrap: BootstrapServers = None,
    kafka_config: KafkaConfig = None,
    home: Home = None,
    claims_url: ClaimsUrl = None,
) -> None:
    """Play requested groups until Ctrl-C/SIGTERM, emitting steps, tool calls and trajectories.

    Run more copies to add throughput: they share rollout.requests through one consumer group.
    Tool calls need `asearcher tools serve` running; weights follow the `weights` topic.
    """
    from asearcher.producers.rollout.service import load_rollout_config

    options = ClusterOptions(bootstrap, kafka_config, home, claims_url)
    with as_cli_error(ValueError):
        config = load_rollout_config(
            config_file, concurrency=concurrency, instance=instance, group_id=group, store=store
        )
    serve_producer("rollout producer", config, engine, model, qa, mistake_rate, options, max_groups)


def serve_producer(
    label: str,
    config: RolloutConfig,
    engine: str,
    model: Path | None,
    qa: Path | None,
    mistake_rate: float,
    options: ClusterOptions,
    max_groups: int | None,
) -> None:
    """Build the engine and run a rollout service (a producer or an evaluator) until stopped."""
    import msgspec

    from asearcher.producers.engines.registry import make_engine
    from asearcher.producers.rollout.service import RolloutService
    from asearcher.streams.cluster.settings import state_dir
    from asearcher.streams.storage.weight_reader import resolve_store_url

    home = options.home
    with service_command(label, options) as command:
        with as_cli_error(ValueError, ImportError):
            # Only versions in the trainer's store are loaded: the same default as `train serve`.
            config = msgspec.structs.replace(config, store=resolve_store_url(config.store, home))
            policy = make_engine(
                engine, model or state_dir(home) / "model", qa_file=qa,
                mistake_rate=mistake_rate, threads=config.engine_threads,
            )  # fmt: skip
        service = command.start(
            lambda settings, codec: RolloutService(settings, codec, policy, config)
        )
        bound = (
            f"staleness eta {config.staleness.eta}" if config.mode == "train"
            else "each request's own weight version"
        )  # fmt: skip
        console.print(
            f"{label} ({engine}, v{policy.version}) in group {config.group_id}, "
            f"concurrency {config.concurrency}, {bound}"
        )
        stats = service.run(max_groups=max_groups)
    console.print(f"finished: {stats.line(0, policy.version)}")


@app.command("request")
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
    bootstrap: BootstrapServers = None,
    kafka_config: KafkaConfig = None,
    home: Home = None,
    claims_url: ClaimsUrl = None,
) -> None:
    """Publish RolloutRequested events for questions of a QA file onto rollout.requests."""
    from asearcher.streams.io.producer import EventProducer
    from asearcher.streams.wire.topics import ROLLOUT_REQUESTS

    events = request_events(
        qa, limit, group_size, max_turns, max_new_tokens, temperature, purpose, seed
    )
    connection = ClusterOptions(bootstrap, kafka_config, home, claims_url).connect(
        check_local=False
    )
    with EventProducer(connection.settings, connection.codec) as producer:
        for event in events:
            producer.send(ROLLOUT_REQUESTS, event)
    console.print(f"requested {len(events)} groups of {group_size} on {ROLLOUT_REQUESTS}")


def request_events(
    qa: Path,
    limit: int | None,
    group_size: int,
    max_turns: int,
    max_new_tokens: int,
    temperature: float,
    purpose: str,
    seed: int,
) -> list:
    """RolloutRequested events for `limit` questions of `qa` (all if None), validated like a
    producer would."""
    from asearcher.consumers.formats.qa_files import read_qa_file
    from asearcher.producers.agents.agent import check_request
    from asearcher.streams.wire.events import RolloutRequested

    if purpose not in ("train", "eval", "synthesis"):
        raise CliError(f"--purpose must be train, eval or synthesis, not {purpose!r}")
    if limit is not None and limit < 1:
        raise CliError(f"--limit must be at least 1, got {limit}")
    sampling = checked_sampling(group_size, max_turns, max_new_tokens, temperature, purpose)
    if not qa.is_file():
        raise CliError(f"--qa {qa} is not a file")
    with as_cli_error(ValueError):
        questions = read_qa_file(str(qa))
    if limit is not None and limit > len(questions):
        raise CliError(f"--limit {limit} exceeds the {len(questions)} questions in {qa}")
    picked = questions if limit is None else random.Random(seed).sample(questions, limit)
    events = []
    for item in picked:
        event = RolloutRequested(
            question_id=item.id,
            group_id=uuid.uuid4().hex,
            question=item.question,
            gold_answers=list(item.answers),
            aug_answers=list(item.aug_answers),
            sampling=sampling,
            group_size=group_size,
            purpose=purpose,  # type: ignore[arg-type]
        )
        with as_cli_error(ValueError):
            check_request(event)
        events.append(event)
    return events


# The request fields the `request` options set, for errors that name the option typed.
_OPTION_OF_FIELD = {
    "group_size": "--group-size",
    "sampling.max_turns": "--max-turns",
    "sampling.max_new_tokens_per_turn": "--max-new-tokens",
    "sampling.temperature": "--temperature",
}


def checked_sampling(
    group_size: int, max_turns: int, max_new_tokens: int, temperature: float, purpose: str
) -> SamplingSettings:
    """The sampling settings of the options, refused as a producer would refuse them."""
    from asearcher.producers.agents.agent import BadRequest, check_sampling
    from asearcher.streams.wire.events import SamplingSettings

    if purpose == "train" and temperature == 0:
        # Greedy: every trajectory of a group is the same, so every group is flat and dropped.
        raise CliError("--temperature: must be above 0 for train requests (0 is greedy), got 0.0")
    sampling = SamplingSettings(
        temperature=temperature, max_new_tokens_per_turn=max_new_tokens, max_turns=max_turns
    )
    try:
        check_sampling(sampling, group_size)
    except BadRequest as exc:
        raise CliError(f"{_OPTION_OF_FIELD.get(exc.field, exc.field)}: {exc}") from exc
    return sampling
