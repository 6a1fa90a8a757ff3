"""Behaviour cloning under a progress bar (`sft` and a run's warm start)."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from asearcher.cli.progress import LoggedProgress

if TYPE_CHECKING:
    from asearcher.trainer.policy.step import StepResult
    from asearcher.trainer.sft.sft_job import SftJob, TrainingSet
console = Console()


def train_with_progress(
    job: SftJob, data: TrainingSet, label: str, keep_at: Collection[int] = ()
) -> list[StepResult]:
    """`job.train(data, keep_at=keep_at)` under a progress bar of its steps and the last loss."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn())  # fmt: skip
    with LoggedProgress(*columns, console=console) as progress:
        task = progress.add_task(label, total=None, loss="-")

        def advance(done: int, total: int, result: StepResult) -> None:
            progress.update(task, completed=done, total=total, loss=f"{result.stats.loss:.3f}")

        return job.train(data, advance, keep_at)
