"""Building the local knowledge base under progress bars (`index build` and a run's preparation)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from asearcher.cli.progress import LoggedProgress
from asearcher.cli.wiring import as_cli_error

console = Console()


def build_index_with_progress(corpus: Path, out: Path, dense: bool = True) -> None:
    """Index `corpus` into `out` (BM25, and dense when asked), a bar per stage; re-running
    resumes an interrupted build."""
    from asearcher.consumers.tools.local_index import build_index

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with LoggedProgress(*columns, TimeElapsedColumn(), console=console) as bar:
        tasks: dict[str, int] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total or None)
            bar.update(tasks[stage], completed=done, total=total or None)

        with as_cli_error(ValueError, OSError, os_error=f"cannot build the index in {out}"):
            manifest = build_index(corpus, out, dense=dense, progress=progress)
    console.print(f"indexed {manifest.pages:,} pages into {out} ({', '.join(manifest.stages)})")
