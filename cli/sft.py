"""`asearcher sft`: behaviour cloning of trajectories replayed from a topic, as a new version."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from asearcher.cli.errors import CliError
from asearcher.cli.options import (
    InitialPolicy,
    StoreUrl,
)
from asearcher.cli.wiring import ClusterOptions, as_cli_error, with_cluster
from asearcher.streams.wire.topics import TRAJECTORIES

if TYPE_CHECKING:
    pass
from asearcher.cli.jobs.cloning import (
    train_with_progress,
)

console = Console()


@with_cluster
def sft(
    topic: Annotated[
        str, typer.Option(help="Topic of the trajectories to imitate.")
    ] = TRAJECTORIES,
    model_name: Annotated[
        str, typer.Option("--model-name", help="The run (model) whose next version this is.")
    ] = "policy",
    model: InitialPolicy = None,
    min_reward: Annotated[
        float, typer.Option(help="Imitate trajectories rewarded at least this.")
    ] = 1.0,
    limit: Annotated[int | None, typer.Option(help="At most this many trajectories.")] = None,
    epochs: Annotated[int, typer.Option(help="Passes over the trajectories.")] = 2,
    batch: Annotated[int, typer.Option(help="Trajectories per optimiser step.")] = 8,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 1e-3,
    lr_decay: Annotated[
        bool,
        typer.Option(help="Warm the rate up over 5 % of the steps, then decay it linearly to 0."),
    ] = False,
    seed: Annotated[int, typer.Option(help="Shuffling and initialisation seed.")] = 0,
    store: StoreUrl = None,
    *,
    cluster: ClusterOptions,
) -> None:
    """Train the policy on the rewarded trajectories of a topic (loss on its own tokens only)
    and publish the result as the run's next weight version, announced on `weights`.

    Starts from the newest version the run announced (or the initial policy); the version's
    manifest records the recipe (topic, trajectories, epochs, losses) and the trajectory ids.
    Run it while the run's trainer is stopped: the trainer then resumes from this version.
    """
    from asearcher.streams.cluster.settings import state_dir
    from asearcher.streams.storage.weight_reader import resolve_store_url
    from asearcher.trainer.runtime.weight_publisher import WeightStore
    from asearcher.trainer.sft.sft_job import SftConfig, SftJob

    with as_cli_error(ValueError):
        config = SftConfig(
            topic=topic, model=model_name, min_reward=min_reward, limit=limit, epochs=epochs,
            trajectories_per_step=batch, lr=lr, lr_decay=lr_decay, seed=seed,
        )  # fmt: skip
    model_dir = model or state_dir(cluster.home) / "model"
    if not (model_dir / "config.json").is_file():
        raise CliError(f"no model in {model_dir}: create one with `asearcher model init`")
    connection = cluster.connect()
    weights = WeightStore(resolve_store_url(store, cluster.home))
    with as_cli_error(ValueError):
        job = SftJob(connection.settings, connection.codec, config, model_dir, weights)
    data = job.data()
    console.print(f"{topic}: {data.summary()}")
    if not data.trajectories:
        raise CliError(
            f"nothing to imitate on {topic}: no trajectory of purpose train rewarded "
            f">= {min_reward:g} (play some with an expert engine first)"
        )
    results = train_with_progress(job, data, "sft")
    losses = [r.stats.loss for r in results]
    published = job.publish(data, losses)
    console.print(
        f"v{published.version} of {model_name}: {len(losses)} steps, loss "
        f"{losses[0]:.3f} -> {losses[-1]:.3f}, at {published.uri}"
    )
