"""What every benchmark shares: a cross-process clock, child processes, tables and JSON results."""

from __future__ import annotations

import json
import math
import os
import platform
import queue
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from importlib import metadata
from multiprocessing import get_context
from multiprocessing.context import SpawnContext, SpawnProcess
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

import confluent_kafka
import msgspec
from confluent_kafka import Consumer
from rich.console import Console
from rich.table import Table

from asearcher.streams.cluster.local_broker import KAFKA_VERSION

RESULTS_DIR = Path(__file__).parent / "results"
SPAWN: SpawnContext = get_context("spawn")

Role = Callable[..., dict[str, Any]]


def clock() -> float:
    """Seconds on CLOCK_MONOTONIC, which every process on the machine shares."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def environment() -> dict[str, Any]:
    """Where the figures were measured."""
    return {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "confluent_kafka": metadata.version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
        "msgspec": msgspec.__version__,
        "kafka_broker": KAFKA_VERSION,
    }


def write_results(name: str, results: dict[str, Any]) -> Path:
    """Write `results` with the environment to `results/<name>.json`; return the path."""
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {"benchmark": name, "environment": environment(), **results}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def show_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    table = Table(title=title)
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index == 0 else "right")
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    Console(width=200).print(table)


def percentile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-th percentile of already sorted values."""
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def wait_for_assignment(consumer: Consumer, timeout: float = 30.0) -> None:
    """Poll until the group gave `consumer` its partitions (before anything was produced)."""
    deadline = clock() + timeout
    while not consumer.assignment():
        if clock() > deadline:
            raise TimeoutError(f"no partitions assigned after {timeout:.0f}s")
        message = consumer.poll(0.05)
        if message is not None and message.error() is None:
            raise RuntimeError("a record arrived before the benchmark started producing")


def child_main(role: Role, name: str, results: Any, kwargs: dict[str, Any]) -> None:
    """Run one role in a child process and report its result or its traceback."""
    try:
        results.put((name, "ok", role(**kwargs)))
    except BaseException:
        results.put((name, "error", traceback.format_exc()))


class Children:
    """Child processes running roles, each reporting one result on a shared queue."""

    def __init__(self) -> None:
        self.results = SPAWN.Queue()
        self.processes: dict[str, SpawnProcess] = {}
        self.reports: dict[str, dict[str, Any]] = {}

    def event(self) -> MpEvent:
        return SPAWN.Event()

    def start(self, name: str, role: Role, **kwargs: Any) -> None:
        process = SPAWN.Process(
            target=child_main, args=(role, name, self.results, kwargs), name=name, daemon=True
        )
        process.start()
        self.processes[name] = process

    def wait(self, events: Sequence[MpEvent], timeout: float = 60.0) -> None:
        """Block until every event is set, failing fast if a child died on the way."""
        deadline = clock() + timeout
        for event in events:
            while not event.wait(0.1):
                self._raise_if_failed()
                if clock() > deadline:
                    raise TimeoutError(f"children not ready after {timeout:.0f}s")

    def gather(self, timeout: float) -> dict[str, dict[str, Any]]:
        """Every child's result; raises with a child's traceback if one failed."""
        deadline = clock() + timeout
        while len(self.reports) < len(self.processes):
            if clock() > deadline:
                missing = sorted(set(self.processes) - set(self.reports))
                raise TimeoutError(f"no result from {missing} after {timeout:.0f}s")
            if not self._collect(0.5):
                self._raise_if_failed()
        for process in self.processes.values():
            process.join(30)
        return self.reports

    def stop(self) -> None:
        for process in self.processes.values():
            if process.is_alive():
                process.terminate()
            process.join(10)

    def _collect(self, timeout: float) -> bool:
        try:
            name, status, value = self.results.get(timeout=timeout)
        except queue.Empty:
            return False
        if status == "error":
            raise RuntimeError(f"benchmark process {name} failed:\n{value}")
        self.reports[name] = value
        return True

    def _raise_if_failed(self) -> None:
        if self._dead():
            self._collect(1.0)
            if dead := self._dead():
                raise RuntimeError(f"benchmark processes {dead} exited without a result")

    def _dead(self) -> list[str]:
        return [
            name
            for name, process in self.processes.items()
            if not process.is_alive() and name not in self.reports
        ]

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
