"""Long CLI work still says how far it is when its output goes to a file, not a terminal."""

from __future__ import annotations

import io

from rich.console import Console
from rich.progress import TextColumn

from asearcher.cli.progress import LoggedProgress


def run(console: Console, every_s: float) -> list[str]:
    with LoggedProgress(TextColumn("{task.description}"), console=console, every_s=every_s,
                        transient=True) as progress:  # fmt: skip
        task = progress.add_task("cloning", total=10, loss="-")
        for step in range(1, 11):
            progress.update(task, completed=step, loss=f"{1 / step:.2f}")
    assert isinstance(console.file, io.StringIO)
    return [line for line in console.file.getvalue().splitlines() if line.strip()]


def test_a_log_gets_a_line_now_and_then_and_one_at_the_end() -> None:
    lines = run(Console(file=io.StringIO(), force_terminal=False, width=120), every_s=3600)
    assert lines[0].startswith("cloning: 1/10 loss 1.00 (")  # the first update says it began
    assert lines[-1].startswith("cloning: 10/10 loss 0.10 (")  # and the end is said once
    assert len(lines) == 2
    every = run(Console(file=io.StringIO(), force_terminal=False, width=120), every_s=0)
    assert [line.split(" loss")[0] for line in every] == [f"cloning: {n}/10" for n in range(1, 11)]


def test_a_terminal_gets_the_bar_alone() -> None:
    lines = run(Console(file=io.StringIO(), force_terminal=True, width=120), every_s=0)
    assert not any("cloning: " in line for line in lines)
