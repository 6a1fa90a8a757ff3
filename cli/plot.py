"""`asearcher plot`: a run's training and evaluation curves as PNG files, from the event log.

Reads `trainer.metrics` and `eval.results` from their beginning to their end now (outside any
consumer group, so nobody's offsets move), keeps the events of one run and draws:

- `reward.png`: reward mean and loss per version;
- `staleness.png`: mean and max staleness of the trained samples and the drops, per version;
- `throughput.png`: the trainer's tokens per second and trajectories trained per second;
- `eval-<benchmark>.png`: per benchmark, Avg@k and Pass@k of the scores (and Avg@k of the
  agent's counts: searches, pages, turns, generated tokens) per version.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from asearcher.cli.errors import CliError
from asearcher.cli.wiring import ClusterOptions, as_cli_error, with_cluster

if TYPE_CHECKING:
    pass
from asearcher.cli.jobs.plots import (
    plot_run,
    read_run,
)

console = Console()


@with_cluster
def plot(
    run: Annotated[str, typer.Option("--run", help="The run (its model name) to plot.")],
    out: Annotated[Path, typer.Option("--out", help="Directory for the PNG files.")],
    *,
    cluster: ClusterOptions,
) -> None:
    """Draw run RUN's training and evaluation curves as PNG files in OUT.

    Reads trainer.metrics and eval.results to their end without joining a consumer group.
    Example: asearcher plot --run default --out plots/
    """
    from asearcher.streams.cluster.preflight import missing_topics
    from asearcher.streams.io.replay import ReplayError
    from asearcher.streams.wire.topics import EVAL_RESULTS, TRAINER_METRICS

    topics = [TRAINER_METRICS, EVAL_RESULTS]
    settings = cluster.settings(check_local=True)
    missing = missing_topics(settings, topics)
    if missing:
        raise CliError(f"no topic {missing[0]!r} on {settings.bootstrap_servers} "
                       "(`asearcher stream up` creates the topics)")  # fmt: skip
    with as_cli_error(ReplayError):
        steps, results, others = read_run(settings, cluster.codec(), run, topics)
    if not steps and not results:
        seen = f" (runs seen: {', '.join(sorted(others))})" if others else ""
        raise CliError(f"run {run!r} has no events on {' or '.join(topics)}{seen}")
    with as_cli_error(OSError, os_error=f"cannot write the figures into {out}"):
        written = plot_run(steps, results, out)
    console.print(
        f"run [bold]{run}[/bold]: {len(steps):,} trainer steps, {len(results):,} evaluation "
        f"results; wrote {len(written)} figures:"
    )
    for path in written:
        console.print(f"  {path}")


# -- the figures: pure, no Kafka ------------------------------------------------------------------
