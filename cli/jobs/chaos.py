"""Chaos over a running topology: kill -9 random services and restart the broker, then prove
from the topics that nothing was lost or done twice (`asearcher stream chaos`).

The run is first watched for `baseline_s` without faults. For `seconds` after that, a random
running service is killed with SIGKILL at random intervals (exponential, mean `every_s`), and
the local broker is killed and started again `broker_restarts` times, evenly spread. Each
fault's recovery is timed: a service is back when supervisord runs it again under a new pid;
the broker when it answers again. After `settle_s` more the run's ledger is read
(`consumers.run_ledger`) and trained trajectories per minute are compared before, during and
after the faults.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from typing import Annotated

import msgspec
from msgspec import Meta

from asearcher.cli.jobs.resource_samples import ResourceReport, ResourceSampler
from asearcher.consumers.observability.run_ledger import RunLedger, read_ledger, topic_events
from asearcher.streams.cluster.local_broker import LocalBroker
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.service.supervisor import RunSupervisor
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import TrainerStepFinished
from asearcher.streams.wire.topics import TRAINER_METRICS

BROKER = "broker"
POLL_S = 0.5


class ChaosPlan(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How long, how often and what to break."""

    seconds: float = 300.0
    every_s: Annotated[float, Meta(description="mean time between kills")] = 20.0
    broker_restarts: int = 1
    baseline_s: float = 60.0
    settle_s: float = 60.0
    seed: int = 0
    recovery_timeout_s: float = 180.0
    sample_every_s: Annotated[
        float, Meta(description="memory and disk of every service, the broker and the run")
    ] = 30.0
    warmup_s: Annotated[
        float, Meta(description="memory and disk trends are of the samples after this")
    ] = 600.0

    def __post_init__(self) -> None:
        for name in ("seconds", "every_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.sample_every_s <= 0:
            raise ValueError(f"sample_every_s must be positive, got {self.sample_every_s}")
        for name in ("broker_restarts", "baseline_s", "settle_s", "warmup_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


class Fault(msgspec.Struct, kw_only=True):
    """One kill: when (seconds into the faults), what, and how long until it was back."""

    at_s: float
    target: str
    pid: int
    recovered_s: float | None = None  # None: not back within the recovery timeout


class Throughput(msgspec.Struct, kw_only=True):
    """Trajectories trained per minute in each phase."""

    before: float
    during: float
    after: float

    @property
    def lost_fraction(self) -> float:
        """The share of the baseline rate lost while the faults ran."""
        return 1 - self.during / self.before if self.before else 0.0


class ChaosReport(msgspec.Struct, kw_only=True):
    """Everything a chaos run did and proved."""

    run: str
    plan: ChaosPlan
    faults: list[Fault]
    throughput: Throughput
    versions_during: int  # weight versions published while the faults ran
    # Restarts nobody caused: services that crashed by themselves (on the broker's restart).
    unplanned_restarts: dict[str, int]
    ledger: RunLedger
    resources: ResourceReport

    @property
    def unrecovered(self) -> list[Fault]:
        return [f for f in self.faults if f.recovered_s is None]

    @property
    def ok(self) -> bool:
        return self.ledger.ok and not self.unrecovered


class Chaos:
    """Plays a plan against one run's supervisor and, optionally, its local broker."""

    def __init__(
        self,
        supervisor: RunSupervisor,
        broker: LocalBroker | None,
        plan: ChaosPlan,
        say: Callable[[str], None] = print,
    ) -> None:
        if plan.broker_restarts and broker is None:
            raise ValueError("broker_restarts needs the local broker (the run uses another)")
        self.supervisor, self.broker, self.plan, self.say = supervisor, broker, plan, say
        self.rng = random.Random(plan.seed)
        self.faults: list[Fault] = []
        self._restarts_before: dict[str, int] = {}
        self._pending: list[tuple[Fault, float]] = []  # kills not yet recovered, with kill time
        places = {"run dir": supervisor.run_dir}
        if broker is not None:
            places["broker data"] = broker.data_dir
        self.sampler = ResourceSampler(self._pids, places, plan.sample_every_s, plan.warmup_s)

    def _pids(self) -> dict[str, int]:
        pids = {p.name: p.pid for p in self.supervisor.processes() if p.pid}
        broker_pid = self.broker.pid() if self.broker is not None else None
        return {**pids, BROKER: broker_pid} if broker_pid else pids

    def _wait(self, seconds: float) -> None:
        """Sleep `seconds`, sampling memory and disk meanwhile."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.sampler.maybe_sample()
            time.sleep(min(POLL_S, max(until - time.monotonic(), 0)))

    def play(self) -> tuple[float, float]:
        """Watch, break things, settle; the wall-clock start and end of the faults."""
        self.say(f"watching for {self.plan.baseline_s:.0f}s before the first fault")
        self._wait(self.plan.baseline_s)
        self._restarts_before = self._restarts()
        started = time.monotonic()
        wall_start = time.time()
        broker_at = [
            self.plan.seconds * (i + 1) / (self.plan.broker_restarts + 1)
            for i in range(self.plan.broker_restarts)
        ]
        next_kill = self.rng.expovariate(1 / self.plan.every_s)
        while (now := time.monotonic() - started) < self.plan.seconds:
            if broker_at and now >= broker_at[0]:
                broker_at.pop(0)
                self._restart_broker(now)
            elif now >= next_kill:
                self._kill_one(now)
                next_kill = now + self.rng.expovariate(1 / self.plan.every_s)
            self._check_recoveries()
            self._wait(POLL_S)
        wall_end = time.time()
        deadline = time.monotonic() + self.plan.recovery_timeout_s
        while self._pending and time.monotonic() < deadline:
            self._check_recoveries()
            self._wait(POLL_S)
        self.say(f"faults over; settling for {self.plan.settle_s:.0f}s")
        self._wait(self.plan.settle_s)
        return wall_start, wall_end

    def _restarts(self) -> dict[str, int]:
        return {p.name: p.restarts for p in self.supervisor.processes()}

    def unplanned_restarts(self) -> dict[str, int]:
        """Restarts per service beyond the kills, since the faults began."""
        kills = {f.target: 0 for f in self.faults}
        for fault in self.faults:
            kills[fault.target] += 1
        after = self._restarts()
        extra = {
            name: count - self._restarts_before.get(name, 0) - kills.get(name, 0)
            for name, count in after.items()
        }
        return {name: n for name, n in extra.items() if n > 0}

    def _kill_one(self, now: float) -> None:
        running = [p for p in self.supervisor.processes() if p.state == "RUNNING" and p.pid]
        if not running:
            return
        victim = self.rng.choice(sorted(running, key=lambda p: p.name))
        try:
            os.kill(victim.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        fault = Fault(at_s=round(now, 2), target=victim.name, pid=victim.pid)
        self.faults.append(fault)
        self._pending.append((fault, time.monotonic()))
        self.say(f"{now:6.1f}s  kill -9 {victim.name} (pid {victim.pid})")

    def _restart_broker(self, now: float) -> None:
        assert self.broker is not None
        killed = time.monotonic()
        pid = self.broker.kill()
        if pid is None:
            return
        self.say(f"{now:6.1f}s  kill -9 the broker (pid {pid}); starting it again")
        self.broker.up()
        fault = Fault(at_s=round(now, 2), target=BROKER, pid=pid)
        fault.recovered_s = round(time.monotonic() - killed, 2)
        self.faults.append(fault)
        self.say(f"          the broker answers again after {fault.recovered_s:.1f}s")

    def _check_recoveries(self) -> None:
        if not self._pending:
            return
        states = {p.name: p for p in self.supervisor.processes()}
        still = []
        for fault, killed in self._pending:
            state = states.get(fault.target)
            if state is not None and state.state == "RUNNING" and state.pid != fault.pid:
                fault.recovered_s = round(time.monotonic() - killed, 2)
                self.say(f"          {fault.target} is back after {fault.recovered_s:.1f}s")
            else:
                still.append((fault, killed))
        self._pending = still


def trainer_steps(settings: KafkaSettings, codec: EventCodec, run: str) -> list[tuple[float, int]]:
    """When each of the run's steps finished, and how many trajectories it trained."""
    return [
        (event.created_at, len(event.trained_ids))
        for event in topic_events(settings, codec, TRAINER_METRICS)
        if isinstance(event, TrainerStepFinished) and event.model == run
    ]


def per_minute(steps: list[tuple[float, int]], start: float, end: float) -> float:
    """Trajectories trained per minute in [start, end) of wall-clock time."""
    trained = sum(n for at, n in steps if start <= at < end)
    return 60 * trained / (end - start) if end > start else 0.0


def run_chaos(
    supervisor: RunSupervisor,
    broker: LocalBroker | None,
    settings: KafkaSettings,
    codec: EventCodec,
    run: str,
    plan: ChaosPlan,
    say: Callable[[str], None] = print,
) -> ChaosReport:
    """Play `plan` on the run, then measure and audit it."""
    chaos = Chaos(supervisor, broker, plan, say)
    baseline_start = time.time()
    start, end = chaos.play()
    after_end = time.time()
    steps = trainer_steps(settings, codec, run)
    throughput = Throughput(
        before=per_minute(steps, baseline_start, start),
        during=per_minute(steps, start, end),
        after=per_minute(steps, end, after_end),
    )
    return ChaosReport(
        run=run,
        plan=plan,
        faults=chaos.faults,
        throughput=throughput,
        versions_during=sum(start <= at < end for at, _ in steps),
        unplanned_restarts=chaos.unplanned_restarts(),
        ledger=read_ledger(settings, codec, run),
        resources=chaos.sampler.finish(),
    )
