"""`asearcher retrain`: a run's versions rebuilt from its event log, or re-trained otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from asearcher.cli.errors import CliError
from asearcher.cli.jobs.retraining import (
    RetrainReport,
    RetrainRequest,
    VersionCheck,
    plan,
    retrain,
)
from asearcher.cli.progress import LoggedProgress
from asearcher.cli.wiring import ClusterOptions, state_home, with_cluster

console = Console()


@with_cluster
def retrain_command(
    run: Annotated[str, typer.Option("--run", help="The run to rebuild, by name (e.g. learn).")],
    new: Annotated[str, typer.Option("--as", help="The new run's name (its own store).")],
    until: Annotated[
        str | None, typer.Option(help="Stop after this version (vN or N).", show_default=False)
    ] = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify", help="Check every rebuilt version is byte for byte the original's."
        ),
    ] = False,
    settings: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="Counterfactual: trainer.config.FIELD=VALUE (TOML value; repeatable)."
        ),
    ] = None,
    trajectories: Annotated[
        str | None,
        typer.Option(
            help="Read the trajectories from this topic (a copy of the log).", show_default=False
        ),
    ] = None,
    *,
    cluster: ClusterOptions,
) -> None:
    """Feed a run's trained batches, in the order its steps used them, through a fresh trainer
    (the same code and DeepSpeed set-up) and publish the versions as run NEW.

    With --verify (the run's own settings) every version must come out byte for byte as the
    original did; the first one that does not is named, with its largest weight difference,
    and the command exits 1. With --set, the same trajectories are re-trained under other
    trainer settings: off-policy, since the original run's policies generated them. The run must
    have been brought up under this home (its saved config gives the settings); NEW gets its own
    store and config, so `ask --run NEW` and `eval run --run NEW` reach it.
    Example: asearcher retrain --run learn --as clip --set trainer.config.objective.clip_eps=0.1
    """
    home = Path(cluster.home) if cluster.home else state_home()
    last = None if until is None else _version(until)
    request = RetrainRequest(run=run, new=new, until=last, verify=verify,
                             settings=settings or [], trajectories_topic=trajectories)  # fmt: skip
    planned = plan(home, request)
    connection = cluster.connect(check_local=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[last]}"), TimeElapsedColumn())  # fmt: skip
    with LoggedProgress(*columns, console=console) as progress:
        task = progress.add_task(f"re-training {run} as {new}", total=None, last="")

        def advance(done: int, total: int, check: VersionCheck) -> None:
            progress.update(task, completed=done, total=total,
                            last=f"v{check.version} loss {check.loss:.2e}")  # fmt: skip

        report = retrain(connection, planned, advance)
    _render(report, verify)
    if report.difference:
        raise typer.Exit(1)


def _version(until: str) -> int:
    text = until.removeprefix("v")
    if not text.isdigit():
        raise CliError(f"--until must be vN or N, got {until!r}")
    return int(text)


def _render(report: RetrainReport, verify: bool) -> None:
    table = Table(title=f"{report.run} re-trained as {report.new} (from v{report.start_version})")
    for column in ("version", "trajectories", "loss", "model file sha256", "original's"):
        table.add_column(column, justify="right" if column in ("version", "loss") else "left")
    for check in report.versions:
        mark = "same" if check.same else "differs"
        table.add_row(f"v{check.version}", str(check.trajectories), f"{check.loss:.2e}",
                      check.rebuilt_sha256[:16], mark)  # fmt: skip
    console.print(table)
    console.print(f"versions in {report.store}, announced as model {report.new!r}")
    if verify and report.difference:
        console.print(f"[red]verify failed: {report.difference}[/red]")
    elif verify:
        count = len(report.versions)
        console.print(f"verified: all {count} version(s) byte for byte the original's")
    else:
        changed = sum(not check.same for check in report.versions)
        console.print(f"{changed} of {len(report.versions)} versions differ from the original's")
    console.print(f"compare them: asearcher eval run --run {report.run} --engine transformers "
                  f"--weights vN [--weights-of {report.new}]", soft_wrap=True)  # fmt: skip
