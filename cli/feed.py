"""`asearcher feed serve`: the request feeder, a QA file onto rollout.requests epoch by epoch."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from asearcher.cli.errors import CliError
from asearcher.cli.options import Instance, overriding
from asearcher.cli.wiring import ClusterOptions, as_cli_error, service_command, with_cluster
from asearcher.producers.rollout.feeder import FeederConfig

console = Console()
app = typer.Typer(
    help="The request feeder: QA items onto rollout.requests, epoch by epoch.",
    no_args_is_help=True,
)


@app.callback()
def feed() -> None:
    """The request feeder: QA items onto rollout.requests, epoch by epoch."""
    # A callback keeps `serve` a sub-command even while it is the only one.


@app.command("serve")
@with_cluster
def serve(
    config_file: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Feeder config (TOML), see docs/running.md."),
    ] = None,
    qa: Annotated[Path | None, typer.Option(help=overriding(FeederConfig, "qa"))] = None,
    run: Annotated[str | None, typer.Option(help=overriding(FeederConfig, "run"))] = None,
    epochs: Annotated[int | None, typer.Option(help=overriding(FeederConfig, "epochs"))] = None,
    instance: Instance = None,
    *,
    cluster: ClusterOptions,
) -> None:
    """Publish rollout requests for every question, epoch after epoch, until Ctrl-C/SIGTERM.

    At most `outstanding` requests wait for their groups at a time. The position commits with
    each batch of requests, so a restart continues where the last one stopped and publishes no
    request twice. Once every epoch is fed it stays up, idle, until stopped.
    """
    from asearcher.producers.rollout.feeder import FeederService, load_feeder_config, load_questions

    if config_file is not None and not config_file.is_file():
        raise CliError(f"--config {config_file} is not a file")
    with service_command("feeder", cluster) as command:
        with as_cli_error(ValueError):
            config = load_feeder_config(
                config_file,
                qa=None if qa is None else str(qa),
                run=run,
                epochs=epochs,
                instance=instance,
            )
            load_questions(config.qa)  # a bad QA file is named before Kafka is reached
            service = command.start(lambda settings, codec: FeederService(settings, codec, config))
        console.print(
            feeding_line(config, len(service.questions), len(service.slots), service.published)
        )
        stats = service.run()
    console.print(f"feeder stopped: {stats.line()}")


def feeding_line(config: FeederConfig, questions: int, plays: int, published: int) -> str:
    """The feeder's start line: the run, its file, what an epoch plays, what was published."""
    # plays_by_hops plays some questions more than once an epoch: the line says so when it does.
    per_epoch = f"{questions} questions" + (f" ({plays} plays)" if plays != questions else "")
    return (
        f"feeding run {config.run} from {config.qa}: {per_epoch} an epoch x "
        f"{config.epochs or 'unlimited'} epochs, at most {config.outstanding} outstanding; "
        f"{published} already published"
    )
