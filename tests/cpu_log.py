"""Where the machine's CPU went during each test, for finding what slows the suite down.

Set `ASEARCHER_TEST_CPU_LOG=FILE` and every test appends one line to FILE: its id, its wall
time, the load average, and the processes that used the most CPU while it ran (this pytest
process, the broker, services the test started, and anything left running by earlier tests).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

ENV = "ASEARCHER_TEST_CPU_LOG"
TOP = 6


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """CPU seconds so far of every process, with a short name of what it runs."""
    seen = {}
    for process in psutil.process_iter(["cmdline", "name"]):
        try:
            times = process.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        words = process.info["cmdline"] or [process.info["name"] or "?"]
        seen[process.pid] = (_short(words), times.user + times.system)
    return seen


def _reaped_children_s() -> float:
    """CPU seconds of this process's children that have ended (and were waited for)."""
    times = psutil.Process().cpu_times()
    return times.children_user + times.children_system


def _short(words: list[str]) -> str:
    if any("kafka.Kafka" in w for w in words):
        return "kafka broker"
    named = [Path(w).name for w in words[:6] if not w.startswith("-")]
    return " ".join(named)[:80]


class CpuLog:
    """Snapshots before and after each test; the difference, written as one line."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.before: dict[int, tuple[str, float]] = {}
        self.started = 0.0

    def start(self) -> None:
        self.before, self.started = cpu_by_process(), time.monotonic()
        self.reaped = _reaped_children_s()

    def finish(self, test_id: str) -> None:
        after = cpu_by_process()
        used = sorted(
            ((seconds - self.before.get(pid, ("", 0.0))[1], pid, name)
             for pid, (name, seconds) in after.items()),
            reverse=True,
        )  # fmt: skip
        wall = time.monotonic() - self.started
        top = "; ".join(f"{name} [{pid}] {cpu:.1f}s" for cpu, pid, name in used[:TOP] if cpu > 0.5)
        load = os.getloadavg()[0]
        ended = _reaped_children_s() - self.reaped
        with self.path.open("a") as log:
            log.write(f"{test_id}\twall {wall:.1f}s\tload {load:.2f}\t"
                      f"ended subprocesses {ended:.1f}s\t{top}\n")  # fmt: skip


def from_env() -> CpuLog | None:
    """The log `ASEARCHER_TEST_CPU_LOG` names, or None."""
    path = os.environ.get(ENV)
    return CpuLog(path) if path else None
