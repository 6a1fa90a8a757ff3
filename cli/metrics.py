"""`asearcher metrics serve`: a run's metrics as TensorBoard scalars, written as they come."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from asearcher.cli.errors import CliError
from asearcher.cli.wiring import ClusterOptions, as_cli_error, with_cluster

console = Console()
metrics_cli = typer.Typer(
    help="A run's training and evaluation metrics as TensorBoard scalars.",
    no_args_is_help=True,
)
# The run names the faust app, its consumer group and its internal topics: Kafka's name rules.
_RUN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")


@metrics_cli.callback()
def metrics() -> None:
    """A run's training and evaluation metrics as TensorBoard scalars."""
    # A callback keeps `serve` a sub-command even while it is the only one.


@metrics_cli.command("serve")
@with_cluster
def serve(
    run: Annotated[str, typer.Option("--run", help="The run (its model name) to follow.")],
    logdir: Annotated[
        Path | None,
        typer.Option(
            "--logdir",
            help="TensorBoard log directory.",
            show_default="<home>/runs/<run>/tensorboard",
        ),
    ] = None,
    *,
    cluster: ClusterOptions,
) -> None:
    """Write run RUN's metrics as TensorBoard scalars until Ctrl-C/SIGTERM.

    Follows trainer.metrics (train/*: reward, loss, staleness, drops, speed) and eval.results
    (eval/<benchmark>/<measure> and <score>_pass@<k>), the weight version as the step. Its
    consumer group, asearcher-<run>-metrics, keeps its place: a restart goes on from there.
    View with: tensorboard --logdir <logdir>
    """
    from asearcher.cli.run.config import run_dir
    from asearcher.consumers.observability.metrics_processor import serve_metrics
    from asearcher.streams.cluster.settings import state_dir
    from asearcher.streams.service.faust_app import exit_now

    if not _RUN.match(run):
        raise CliError(f"--run {run!r}: letters, digits, '-' and '_' only")
    connection = cluster.connect(check_local=True)
    target = logdir if logdir is not None else run_dir(state_dir(cluster.home), run) / "tensorboard"
    with as_cli_error(OSError, os_error=f"cannot write the TensorBoard logs into {target}"):
        target.mkdir(parents=True, exist_ok=True)
    console.print(
        f"writing the metrics of run [bold]{run}[/bold] to {target} "
        f"(view with: tensorboard --logdir {target})"
    )
    level = logging.getLevelName(logging.getLogger("asearcher").getEffectiveLevel())
    code = serve_metrics(
        connection.settings, run, target, cluster.home, level, codec=connection.codec
    )
    exit_now(code)
