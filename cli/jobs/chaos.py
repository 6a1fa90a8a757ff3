"""Chaos over a running topology: kill -9 random services and restart the broker, then prove
from the topics that nothing was lost or done twice (`asearcher stream chaos`).

The run is first watched for `baseline_s` without faults. For `seconds` after that, a random
running service is killed with SIGKILL at random intervals (exponential, mean `every_s`), and
the cluster faults are spread evenly: on a local cluster of three nodes, the node leading most
partitions of `trajectories` killed -9 (`leader_kills`, started again after `node_down_s`)
and every node stopped and started in turn (`rolling_restarts`, each once every partition is
in sync again); then the whole local cluster killed -9 and started again (`broker_restarts`).
Each fault's recovery is timed: a service is back when supervisord runs it again under a new
pid; the broker when it answers again; a node when every partition is in sync again. After
`settle_s` more the run's ledger is read (`consumers.run_ledger`), trained trajectories per
minute are compared before, during and after the faults, and each fault gets the time to the
run's next trained step.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable

import msgspec
from confluent_kafka import KafkaException

from asearcher.cli.jobs.chaos_plan import ChaosPlan
from asearcher.cli.jobs.resource_samples import ResourceReport, ResourceSampler
from asearcher.consumers.observability.run_ledger import RunLedger, read_ledger, topic_events
from asearcher.streams.cluster.admin import leading_node, under_replicated_partitions
from asearcher.streams.cluster.local_broker import LocalBroker
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.service.supervisor import RunSupervisor
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import TrainerStepFinished
from asearcher.streams.wire.topics import TRAINER_METRICS, TRAJECTORIES

BROKER = "broker"
POLL_S = 0.5


class Fault(msgspec.Struct, kw_only=True):
    """One kill: when (seconds into the faults), what, and how long until it was back."""

    at_s: float
    target: str
    pid: int
    recovered_s: float | None = None  # None: not back within the recovery timeout
    at_wall: float = 0.0  # when, as a Unix time (steps are timed so)
    next_step_s: float | None = None  # until the run's next trained step; None: none after


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
        if (plan.leader_kills or plan.rolling_restarts) and (broker is None or broker.brokers < 3):
            raise ValueError(
                "leader kills and rolling restarts need a local cluster of 3 nodes "
                "(`asearcher stream up --brokers 3`)"
            )
        self.supervisor, self.broker, self.plan, self.say = supervisor, broker, plan, say
        self.rng = random.Random(plan.seed)
        self.faults: list[Fault] = []
        self._restarts_before: dict[str, int] = {}
        self._pending: list[tuple[Fault, float]] = []  # kills not yet recovered, with kill time
        places = {"run dir": supervisor.run_dir}
        if broker is not None:
            places["broker data"] = broker.data_dir if broker.brokers == 1 else broker.dir
        self.sampler = ResourceSampler(self._pids, places, plan.sample_every_s, plan.warmup_s)

    def _pids(self) -> dict[str, int]:
        pids = {p.name: p.pid for p in self.supervisor.processes() if p.pid}
        if self.broker is None:
            return pids
        nodes = self.broker.pids()
        if self.broker.brokers == 1:
            return {**pids, BROKER: nodes[1]} if nodes else pids
        return {**pids, **{f"{BROKER}-{node}": pid for node, pid in nodes.items()}}

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
        cluster_faults = self.plan.cluster_faults()
        next_kill = self.rng.expovariate(1 / self.plan.every_s)
        # A planned cluster fault is always played: one whose recovery outlasts the next one's
        # slot delays that one (a slow machine) rather than dropping it from the report.
        while (now := time.monotonic() - started) < self.plan.seconds or cluster_faults:
            if cluster_faults and now >= cluster_faults[0][0]:
                _, kind = cluster_faults.pop(0)
                {"leader": self._kill_leader, "rolling": self._rolling_restart,
                 "broker": self._restart_broker}[kind](now)  # fmt: skip
            elif now >= next_kill and now < self.plan.seconds:
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
        fault = Fault(at_s=round(now, 2), target=victim.name, pid=victim.pid, at_wall=time.time())
        self.faults.append(fault)
        self._pending.append((fault, time.monotonic()))
        self.say(f"{now:6.1f}s  kill -9 {victim.name} (pid {victim.pid})")

    def _restart_broker(self, now: float) -> None:
        assert self.broker is not None
        killed, at_wall = time.monotonic(), time.time()
        pid = self.broker.kill()
        if pid is None:
            return
        self.say(f"{now:6.1f}s  kill -9 the broker (pid {pid}); starting it again")
        self.broker.up()
        fault = Fault(at_s=round(now, 2), target=BROKER, pid=pid, at_wall=at_wall)
        fault.recovered_s = round(time.monotonic() - killed, 2)
        self.faults.append(fault)
        self.say(f"          the broker answers again after {fault.recovered_s:.1f}s")

    def _kill_leader(self, now: float) -> None:
        """Kill -9 the node leading most partitions of `trajectories`; start it again after
        `node_down_s`; back when every partition is in sync again."""
        assert self.broker is not None
        node = leading_node(self.broker.admin_settings(), TRAJECTORIES)
        if node < 0:
            return
        killed, at_wall = time.monotonic(), time.time()
        pid = self.broker.kill_node(node)
        if pid is None:
            return
        fault = Fault(at_s=round(now, 2), target=f"{BROKER}-{node} (leader)", pid=pid,
                      at_wall=at_wall)  # fmt: skip
        self.faults.append(fault)
        self.say(f"{now:6.1f}s  kill -9 broker {node}, leader of trajectories (pid {pid}); "
                 f"down for {self.plan.node_down_s:.0f}s")  # fmt: skip
        self._wait(self.plan.node_down_s)
        self.broker.start_node(node)
        if self._wait_in_sync():
            fault.recovered_s = round(time.monotonic() - killed, 2)
            self.say(f"          broker {node} is back and in sync after {fault.recovered_s:.1f}s")

    def _rolling_restart(self, now: float) -> None:
        """Stop and start every node in turn (SIGTERM: leaders move away first), each after
        the previous one's partitions are in sync again."""
        assert self.broker is not None
        started, at_wall = time.monotonic(), time.time()
        first = self.broker.nodes[0].pid() or 0
        fault = Fault(at_s=round(now, 2), target=f"{BROKER}s (rolling restart)", pid=first,
                      at_wall=at_wall)  # fmt: skip
        self.faults.append(fault)
        self.say(f"{now:6.1f}s  rolling restart of the {self.broker.brokers} brokers")
        for node in self.broker.nodes:
            self.broker.stop_node(node.node_id)
            self.broker.start_node(node.node_id)
            if not self._wait_in_sync():
                return
            self.say(f"          broker {node.node_id} restarted and in sync")
        fault.recovered_s = round(time.monotonic() - started, 2)
        self.say(f"          the rolling restart took {fault.recovered_s:.1f}s")

    def _wait_in_sync(self) -> bool:
        """Wait (sampling) until no partition lacks an in-sync copy; False on the timeout."""
        assert self.broker is not None
        deadline = time.monotonic() + self.plan.recovery_timeout_s
        while time.monotonic() < deadline:
            try:
                if under_replicated_partitions(self.broker.admin_settings()) == 0:
                    return True
            except KafkaException:
                pass  # a node still joining: ask again
            self._wait(POLL_S)
        self.say("          partitions still out of sync at the recovery timeout")
        return False

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


def next_step_after(steps: list[tuple[float, int]], at: float) -> float | None:
    """Seconds from `at` to the first step that finished after it; None if none did."""
    after = [finished for finished, _ in steps if finished > at]
    return round(min(after) - at, 2) if after else None


def per_minute(steps: list[tuple[float, int]], start: float, end: float) -> float:
    """Trajectories trained per minute in [start, end) of wall-clock time."""
    trained = sum(n for at, n in steps if start <= at < end)
    return 60 * trained / (end - start) if end > start else 0.0


def run_chaos(chaos: Chaos, settings: KafkaSettings, codec: EventCodec, run: str) -> ChaosReport:
    """Play the chaos's plan on the run, then measure and audit it."""
    plan = chaos.plan
    baseline_start = time.time()
    start, end = chaos.play()
    after_end = time.time()
    steps = trainer_steps(settings, codec, run)
    for fault in chaos.faults:
        fault.next_step_s = next_step_after(steps, fault.at_wall)
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
