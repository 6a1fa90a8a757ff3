"""Runs brought up with the real CLI, as a user does, in their own state directories."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from asearcher.cli.run.config import run_dir
from asearcher.streams.service.supervisor import RunSupervisor
from asearcher.streams.wire.events import (
    TrajectoryFinished,
    WeightsPublished,
)
from asearcher.streams.wire.topics import (
    TRAJECTORIES,
    WEIGHTS,
)
from tests.support.rollout import events_of

ASEARCHER = str(Path(sys.executable).parent / "asearcher")


EXPERT_RUN = """
name = "{name}"
[data]
world_entities = 60
dense = false
[rollout]
engine = "expert"
mistake_rate = 0.4
[rollout.config]
concurrency = 8
drain_timeout_s = 10
status_every_s = 1
[trainer.config]
status_every_s = 1
[trainer.config.batching]
groups_per_batch = 2
micro_batch_tokens = 8192
[feeder.config]
group_size = 4
outstanding = 8
status_every_s = 1
[feeder.config.sampling]
max_new_tokens_per_turn = 64
max_turns = 16
[eval]
concurrency = 4
[eval.config]
every_versions = 2
samples = 2
limit = 4
[eval.config.sampling]
max_new_tokens_per_turn = 64
max_turns = 16
"""


UNTRAINED_RUN = """
name = "{name}"
[data]
world_entities = 60
dense = false
[rollout.config]
concurrency = 8
status_every_s = 1
[trainer.config]
stall_after_s = 8
status_every_s = 1
[trainer.config.batching]
groups_per_batch = 2
eta = 1
[feeder.config]
group_size = 4
outstanding = 8
[feeder.config.sampling]
max_new_tokens_per_turn = 24
max_turns = 2
[eval]
replicas = 0
"""


def docs_hosts() -> str:
    """The `[hosts]` tables of docs/cluster.md's example (a learner and the actors' two
    producers and evaluator): the placement the docs tell users to write."""
    from tests.conftest import readme_toml

    example = readme_toml("[hosts.learner]")
    return example[example.index("[hosts.learner]") :]


class Run:
    """One run brought up with the real CLI in its own state directory."""

    def __init__(
        self, home: Path, bootstrap: str | None, template: str, name: str | None = None
    ) -> None:
        self.name = name or f"t{uuid.uuid4().hex[:8]}"  # a name of its own, or a shared run's
        self.home, self.bootstrap = home, bootstrap
        self.config = home / "run.toml"
        home.mkdir(parents=True, exist_ok=True)
        self.config.write_text(template.format(name=self.name))
        self.supervisor = RunSupervisor(run_dir(home, self.name))

    def cli(self, *args: str, check: bool = True, timeout: float = 300) -> str:
        result = self.call(*args, timeout=timeout)
        if check:
            assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    def call(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """`asearcher ARGS` against this run's home and broker, as a user types it."""
        env = {**os.environ, "ASEARCHER_HOME": str(self.home), "COLUMNS": "200"}
        env.pop("ASEARCHER_BOOTSTRAP_SERVERS", None)
        if self.bootstrap:  # else the run's own local broker in its home
            env["ASEARCHER_BOOTSTRAP_SERVERS"] = self.bootstrap
        return subprocess.run([ASEARCHER, *args], env=env, capture_output=True, text=True,
                              timeout=timeout, cwd="/")  # fmt: skip

    def pids(self) -> dict[str, int]:
        return {p.name: p.pid for p in self.supervisor.processes()}

    def down(self) -> None:
        self.cli("stream", "down", "--keep-broker", check=False)


def versions(settings, codec, model: str) -> list[int]:
    return [e.version for e in events_of(settings, codec, WEIGHTS)
            if isinstance(e, WeightsPublished) and e.model == model]  # fmt: skip


def run_trajectories(settings, codec, name: str) -> list[TrajectoryFinished]:
    prefix = f"{name}-e"
    return [e for e in events_of(settings, codec, TRAJECTORIES)
            if isinstance(e, TrajectoryFinished) and e.group_id.startswith(prefix)]  # fmt: skip
