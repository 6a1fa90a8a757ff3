"""`asearcher train serve`: the DeepSpeed trainer consuming finished trajectories."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from asearcher.cli.errors import CliError
from asearcher.cli.options import (
    InitialPolicy,
    StoreUrl,
)
from asearcher.cli.wiring import ClusterOptions, as_cli_error, service_command, with_cluster

console = Console()
app = typer.Typer(help="The trainer: GRPO groups in, policy versions out.", no_args_is_help=True)


@app.callback()
def train() -> None:
    """The trainer: GRPO groups in, policy versions out."""
    # A callback keeps `serve` a sub-command even while it is the only one.


@app.command("serve")
@with_cluster
def serve(
    config_file: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Trainer config (TOML), see docs/trainer.md."),
    ] = None,
    model: InitialPolicy = None,
    max_steps: Annotated[
        int | None, typer.Option(help="Stop after this many steps (at least 1).")
    ] = None,
    store: StoreUrl = None,
    *,
    cluster: ClusterOptions,
) -> None:
    """Train on finished trajectories until Ctrl-C/SIGTERM, publishing a version per step.

    Each step's weights go to the weight store; the step's WeightsPublished, its metrics and
    its input offsets commit in one Kafka transaction. Restarting resumes from the last
    announced version.
    """
    from asearcher.streams.cluster.settings import state_dir
    from asearcher.streams.storage.weight_reader import resolve_store_url
    from asearcher.trainer.runtime.config import load_trainer_config
    from asearcher.trainer.runtime.service import TrainerService
    from asearcher.trainer.runtime.weight_publisher import WeightStore

    if max_steps is not None and max_steps < 1:
        raise CliError(
            f"--max-steps must be at least 1, got {max_steps} (omit it to train until stopped)"
        )
    with as_cli_error(ValueError):
        config = load_trainer_config(config_file)
    model_dir = model or Path(config.model_dir or state_dir(cluster.home) / "model")
    if not (model_dir / "config.json").is_file():
        raise CliError(f"no model in {model_dir}: create one with `asearcher model init`")
    weights = WeightStore(resolve_store_url(store or config.store, cluster.home))
    if int(os.environ.get("RANK", "0")) > 0:
        # Started by DeepSpeed's launcher: rank 0 reads Kafka and broadcasts the batches.
        from asearcher.trainer.runtime.service import serve_other_rank

        serve_other_rank(config, model_dir, weights)
        return
    with service_command("trainer", cluster) as command:
        service = command.start(
            lambda settings, codec: TrainerService(settings, codec, config, model_dir, weights)
        )
        console.print(
            f"trainer at v{service.version} in group {config.group_id}: "
            f"{config.batching.groups_per_batch} groups per step, store {weights.root_url}"
        )
        steps = service.run(max_steps=max_steps)
    console.print(f"trained {steps} steps; now at v{service.version}")
