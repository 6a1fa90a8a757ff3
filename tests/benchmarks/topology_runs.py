"""What the topology benchmarks share: a run brought up and down as a user does, and its
figures read back from the topics (trainer steps, staleness, the producers' counters)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec

from asearcher.producers.agents.timed_workflow import ENV_WORKLOAD, TimedWorkload
from asearcher.streams.wire.events import ServiceStatus, TrainerStepFinished
from asearcher.streams.wire.topics import SERVICE_STATUS, TRAINER_METRICS
from tests.support.rollout import events_of
from tests.support.runs import ASEARCHER


@contextmanager
def run_up(home: Path, bootstrap: str, name: str, config: str, workload: TimedWorkload
           ) -> Iterator[None]:  # fmt: skip
    """Run `config` (a run config's TOML) with `stream up` until the block ends, then down."""
    path = home / f"{name}.toml"
    path.write_text(config)
    env = {**os.environ, "ASEARCHER_HOME": str(home), "ASEARCHER_BOOTSTRAP_SERVERS": bootstrap,
           ENV_WORKLOAD: msgspec.json.encode(workload).decode()}  # fmt: skip
    up = subprocess.run([ASEARCHER, "stream", "up", "-c", str(path)], env=env, cwd="/",
                        capture_output=True, text=True, timeout=600)  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield
    finally:
        subprocess.run([ASEARCHER, "stream", "down", "--keep-broker"], env=env, cwd="/",
                       capture_output=True, text=True, timeout=600)  # fmt: skip


def trainer_figures(settings, codec, name: str, least_steps: int) -> dict:
    """Steps, trajectories trained per second (first to last step), the trainer's idle
    fraction and the staleness of what it trained, for run `name`."""
    steps = sorted(
        (e for e in events_of(settings, codec, TRAINER_METRICS)
         if isinstance(e, TrainerStepFinished) and e.model == name),
        key=lambda e: e.created_at,
    )  # fmt: skip
    assert len(steps) >= least_steps, f"only {len(steps)} steps for {name}"
    window = steps[-1].created_at - steps[0].created_at
    ages = [k for s in steps for k, n in enumerate(s.staleness_counts) for _ in range(n)]
    return {
        "steps": len(steps),
        "samples_per_s": sum(s.stats.samples for s in steps[1:]) / window,
        "trainer_idle": sum(s.idle_fraction for s in steps[1:]) / (len(steps) - 1),
        "staleness_mean": sum(ages) / max(len(ages), 1),
        "staleness_max": max(ages, default=0),
        "window_s": window,
    }


def generation_idle(settings, codec, name: str) -> float:
    """The share of the producers' lifetime they held requests back for the staleness bound
    (from each rollout producer's last heartbeat)."""
    prefix = f"{name}-rollout-"
    last: dict[str, dict] = {}
    beats = [e for e in events_of(settings, codec, SERVICE_STATUS)
             if isinstance(e, ServiceStatus) and e.instance.startswith(prefix)]  # fmt: skip
    for beat in sorted(beats, key=lambda b: b.created_at):
        last[beat.instance] = beat.counters
    lifetime = sum(c["trajectories"] / c["trajectories_per_s"] for c in last.values()
                   if c["trajectories_per_s"])  # fmt: skip
    return sum(c["staleness_wait_s"] for c in last.values()) / max(lifetime, 1e-9)
