"""A stream processor (`asearcher eval process`, `asearcher synth process`) run as a subprocess
against the test broker, killed however the test ends."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import msgspec

from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.storage.claimcheck import ClaimCheckStore

T = TypeVar("T")

# A faust worker needs some seconds to start, create its changelog topics and join its group;
# a restarted one also waits until the broker drops its SIGKILLed predecessor from the group.
START_S = 90.0
# faust reads its settings from the environment too. A SIGKILLed worker stays in its group until
# its session times out (faust's default: 60 s); 10 s lets the restarted one in sooner.
FAUST_ENV = {"BROKER_SESSION_TIMEOUT": "10", "BROKER_HEARTBEAT_INTERVAL": "1"}


# ---------------------------------------------------------------- the processor subprocess


class Processor:
    """One processor subprocess (`asearcher <command> -c config`) with its config file and log."""

    def __init__(
        self, settings: KafkaSettings, claims: ClaimCheckStore, config: msgspec.Struct,
        tmp_path: Path, command: Sequence[str] = ("eval", "process"),
    ) -> None:  # fmt: skip
        self.settings, self.claims, self.config = settings, claims, config
        self.command = list(command)
        self.tmp_path = tmp_path
        self.config_file = tmp_path / f"{config.app_id}.json"  # type: ignore[attr-defined]
        self.config_file.write_bytes(msgspec.json.encode(config))
        self.runs = 0
        self.process: subprocess.Popen | None = None
        self.log = tmp_path / "processor-0.log"

    def start(self) -> None:
        """Start (or restart) the processor; its output goes to a log file of its own."""
        self.log = self.tmp_path / f"processor-{self.runs}.log"
        self.runs += 1
        command = [sys.executable, "-m", "asearcher.cli.app", *self.command,
                   "-c", str(self.config_file),
                   "--bootstrap-servers", self.settings.bootstrap_servers,
                   "--home", str(self.tmp_path / "home"),
                   "--claims-url", self.claims.base_url]  # fmt: skip
        with self.log.open("wb") as output:
            self.process = subprocess.Popen(
                command, stdout=output, stderr=subprocess.STDOUT, env={**os.environ, **FAUST_ENV}
            )

    def kill(self) -> None:
        """SIGKILL: no shutdown, no last commit."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait(timeout=30)

    def check_alive(self) -> None:
        assert self.process is not None and self.process.poll() is None, (
            f"the processor exited: {self.log_tail()}"
        )

    def crashes(self) -> list[str]:
        """The log lines where faust reports an agent that crashed (it restarts it)."""
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return [line for line in lines if "Crashed reason=" in line]

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""


@contextmanager
def processor(
    settings: KafkaSettings,
    claims: ClaimCheckStore,
    config: msgspec.Struct,
    tmp_path: Path,
    command: Sequence[str] = ("eval", "process"),
) -> Iterator[Processor]:
    """A started processor, killed however the test ends."""
    running = Processor(settings, claims, config, tmp_path, command)
    running.start()
    try:
        yield running
    finally:
        running.kill()


def became(found: Callable[[], bool], timeout_s: float) -> bool:
    """Whether `found()` turned true within `timeout_s` (polled every half second)."""
    deadline = time.monotonic() + timeout_s
    while not found():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def wait_for(
    found: Callable[[], T | None],
    what: str,
    running: Processor,
    timeout_s: float = START_S,
    describe: Callable[[], str] | None = None,
) -> T:
    """Poll `found` until it returns something truthy; fail naming `what` after the deadline,
    with what `describe` says of the state then (offsets, tallies) and the log's tail."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = found()
        if value:
            return value
        running.check_alive()
        if time.monotonic() > deadline:
            state = f"\nstate: {describe()}" if describe else ""
            raise AssertionError(f"timed out waiting for {what}{state}\nlog:\n{running.log_tail()}")
        time.sleep(0.5)
