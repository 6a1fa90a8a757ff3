"""Processes a job starts for its own duration (an evaluator for one evaluation, synthesis
processors for one job), each with one log file, all stopped when the job ends.

A run's long-lived services are supervised (`supervisor.py`); these live and die with the
command that started them, so they need no restarts, only a clean stop: SIGTERM (a service
finishes what it holds), then SIGKILL after `stop_wait_s`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from asearcher.streams.service.log import get_logger

log = get_logger(__name__)


class JobChildren:
    """The processes one job started, by name."""

    def __init__(self, log_dir: Path, stop_wait_s: float = 60.0) -> None:
        self.log_dir, self.stop_wait_s = log_dir, stop_wait_s
        self.children: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, command: list[str]) -> Path:
        """Start `command` as `name`, its output in `<log_dir>/<name>.log`; that log's path."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"{name}.log"
        with path.open("wb") as out:  # the child keeps its own descriptor
            self.children[name] = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        return path

    def exited(self) -> dict[str, int]:
        """The children that ended already, with their exit status."""
        return {n: c.returncode for n, c in self.children.items() if c.poll() is not None}

    def stop(self) -> None:
        """SIGTERM to every child still running, then SIGKILL to those past `stop_wait_s`."""
        for child in self.children.values():
            if child.poll() is None:
                child.terminate()
        for name, child in self.children.items():
            try:
                child.wait(self.stop_wait_s)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0f s: killed", name, self.stop_wait_s)
                child.kill()
                child.wait()

    def __enter__(self) -> JobChildren:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
