"""Progress bars that still say something when the output is a file.

rich draws a bar only on a terminal; with the output redirected (`asearcher learn > learn.log`,
a CI log, supervisord) a transient bar prints nothing and a kept one prints its last state at
the end, so a log shows minutes of silence while pretraining or cloning runs. `LoggedProgress`
is rich's `Progress`, plus, where the console is not a terminal, a plain line per task at most
every `every_s` seconds and one when a task completes.
"""

from __future__ import annotations

import time
from typing import Any

from rich.progress import Progress, Task, TaskID

LOG_EVERY_S = 30.0


class LoggedProgress(Progress):
    """`rich.progress.Progress` that also prints a line now and then on a non-terminal console."""

    def __init__(self, *columns: Any, every_s: float = LOG_EVERY_S, **kwargs: Any) -> None:
        super().__init__(*columns, **kwargs)
        self._every_s = every_s
        self._said_at: dict[TaskID, float] = {}
        self._said_done: set[TaskID] = set()

    def update(self, task_id: TaskID, **kwargs: Any) -> None:  # type: ignore[override]
        super().update(task_id, **kwargs)
        self._say(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._say(task_id)

    def _say(self, task_id: TaskID) -> None:
        if self.console.is_terminal:
            return
        task = self._tasks[task_id]
        now = time.monotonic()
        done = task.total is not None and task.completed >= task.total
        if done and task_id in self._said_done:
            return
        if not done and now - self._said_at.get(task_id, float("-inf")) < self._every_s:
            return
        self._said_at[task_id] = now
        if done:
            self._said_done.add(task_id)
        self.console.print(plain_line(task), highlight=False)


def plain_line(task: Task) -> str:
    """The task as one line: description, progress, its fields, time so far."""
    count = f"{task.completed:,.0f}" + (f"/{task.total:,.0f}" if task.total is not None else "")
    fields = "".join(f" {name} {value}" for name, value in task.fields.items())
    elapsed = task.elapsed or 0.0
    return f"{task.description}: {count}{fields} ({elapsed:.0f} s)"
