"""The whole training topology as a user runs it: `stream up -c run.toml`, status, kills, down.

Every service is a real process under supervisord, talking to the session's real broker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest

from asearcher.consumers.observability.run_ledger import read_ledger
from asearcher.streams.service.run_status import latest_heartbeats
from asearcher.streams.wire.events import (
    EvalResult,
    RolloutRequested,
    ServiceStatus,
)
from asearcher.streams.wire.topics import (
    EVAL_RESULTS,
    ROLLOUT_REQUESTS,
)
from tests.support.rollout import events_of
from tests.support.runs import (
    EXPERT_RUN,
    UNTRAINED_RUN,
    Run,
    run_trajectories,
    versions,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.whole_run  # a whole topology: one at a time (tests/conftest.py)


def service_line(status: str, service: str) -> str:
    return next(line for line in status.splitlines() if line.strip("│┃ ").startswith(service))


def kill_and_time_restart(run: Run, service: str, timeout: float = 90) -> float:
    """SIGKILL `service`; seconds until supervisord has it RUNNING again under a new pid."""
    old = run.pids()[service]
    os.kill(old, signal.SIGKILL)
    killed = time.monotonic()

    def restarted() -> bool:
        state = {p.name: p for p in run.supervisor.processes()}[service]
        return state.state == "RUNNING" and state.pid not in (0, old)

    wait_for(f"{service} to be restarted", restarted, timeout, every=0.2)
    return time.monotonic() - killed


def group_member(settings, group: str, instance: str) -> str | None:
    """The member id of the static member `instance` of `group` that holds partitions."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(settings.client())
    description = admin.describe_consumer_groups([group])[group].result(timeout=30)
    for member in description.members:
        if member.group_instance_id == instance and member.assignment.topic_partitions:
            return member.member_id
    return None


def takeover_s(run: Run, settings, service: str, group: str, instance: str) -> float:
    """SIGKILL `service`; seconds until its restarted self holds its partitions again."""
    before = group_member(settings, group, instance)
    os.kill(run.pids()[service], signal.SIGKILL)
    killed = time.monotonic()

    def taken_over() -> bool:
        member = group_member(settings, group, instance)
        return member is not None and member != before

    wait_for(f"{service} to take its partitions back", taken_over, 120, every=0.2)
    return time.monotonic() - killed


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_stream_up_closes_the_loop_survives_kills_and_resumes_after_down(
    broker, settings, codec, tmp_path: Path
) -> None:
    run = Run(tmp_path / "home", broker.bootstrap_servers, EXPERT_RUN)
    try:
        run.cli("stream", "up", "-c", str(run.config))
        status = run.cli("stream", "status", "--run", run.name)
        for service in ("tools-0", "rollout-0", "trainer", "feeder", "evaluator-0",
                        "eval-processor", "metrics"):  # fmt: skip
            assert "RUNNING" in service_line(status, service), status

        # The loop closes on its own: versions are published and producers generate with them.
        wait_for("3 weight versions", lambda: len(versions(settings, codec, run.name)) >= 3, 300)
        wait_for(
            "trajectories generated with a trained version",
            lambda: any(max(t.token_versions) >= 1
                        for t in run_trajectories(settings, codec, run.name)),
            120,
        )  # fmt: skip

        # Continuous evaluation: version 2 is scored on the world's held-out questions, with
        # exactly its own weights, and the score shows in status.
        evaluated = wait_for(
            "the evaluation of v2",
            lambda: [e for e in evaluations(settings, codec, run.name) if e.policy_version == 2],
            300,
        )
        assert len(evaluated) == 1 and evaluated[0].questions == 4, evaluated
        assert evaluated[0].averages["f1"] >= 0.99, evaluated[0]  # the expert evaluator
        assert "latest evaluation per benchmark" in run.cli("stream", "status", "--run", run.name)

        # Every service killed -9 comes back; its restart shows in status.
        restart_s = {s: kill_and_time_restart(run, s) for s in ("tools-0", "feeder")}
        groups = f"asearcher-{run.name}"
        takeover = {
            "rollout-0": takeover_s(run, settings, "rollout-0", f"{groups}-rollout",
                                    f"rollout-{run.name}-rollout-0"),
            "trainer": takeover_s(run, settings, "trainer", f"{groups}-trainer",
                                  f"trainer-{run.name}-trainer"),
        }  # fmt: skip
        print(f"restart after kill -9: {restart_s}; partitions taken back: {takeover}")
        assert all(seconds < 40 for seconds in takeover.values()), takeover  # not 45 s + start
        # A restarted program is STARTING until supervisord's start check passes (the trainer's
        # is 5 s), which can be after it took its partitions back.
        wait_for("every restarted service RUNNING",
                 lambda: all(p.state == "RUNNING" for p in run.supervisor.processes()), 60,
                 every=0.5)  # fmt: skip
        status = run.cli("stream", "status", "--run", run.name)
        for service in ("tools-0", "feeder", "rollout-0", "trainer"):
            cells = [c.strip() for c in service_line(status, service).split("│") if c.strip()]
            assert "RUNNING" in cells and int(cells[-1]) >= 1, status  # restarts column
        reached = max(versions(settings, codec, run.name))
        wait_for("2 more versions after the kills",
                 lambda: max(versions(settings, codec, run.name)) >= reached + 2, 240)  # fmt: skip

        pids = run.pids()
        supervisord = int(run.supervisor.pid_file.read_text())
        run.cli("stream", "down", "--keep-broker")
        assert not any(_alive(pid) for pid in [*pids.values(), supervisord])
        leftovers = subprocess.run(["pgrep", "-f", str(run.supervisor.run_dir)],
                                   capture_output=True, text=True)  # fmt: skip
        assert leftovers.stdout == "", leftovers.stdout
        _assert_ledger(settings, codec, run.name)

        # Up again: versions continue, the feeder does not republish.
        last = max(versions(settings, codec, run.name))
        run.cli("stream", "up", "-c", str(run.config))
        wait_for("a version after the restart",
                 lambda: max(versions(settings, codec, run.name)) > last, 240)  # fmt: skip
        published = versions(settings, codec, run.name)
        assert sorted(published) == list(range(1, max(published) + 1))
        requests = [
            e.group_id
            for e in events_of(settings, codec, ROLLOUT_REQUESTS)
            if isinstance(e, RolloutRequested) and e.group_id.startswith(f"{run.name}-")
        ]
        assert requests and len(requests) == len(set(requests))  # fmt: skip
    finally:
        run.down()
    _assert_ledger(settings, codec, run.name)


def evaluations(settings, codec, name: str) -> list[EvalResult]:
    return [e for e in events_of(settings, codec, EVAL_RESULTS)
            if isinstance(e, EvalResult) and e.model == name]  # fmt: skip


def _assert_ledger(settings, codec, name: str) -> None:
    """Every guarantee the run ledger checks holds (one group per request, every trajectory
    trained once or dropped once, versions without gaps, evaluations counted once)."""
    ledger = read_ledger(settings, codec, name)
    assert ledger.ok, ledger.violations
    assert ledger.trained and ledger.groups_complete and ledger.evaluations, ledger


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_untrained_policy_keeps_producing_and_the_stall_is_reported_with_counts(
    broker, settings, codec, tmp_path: Path
) -> None:
    run = Run(tmp_path / "home", broker.bootstrap_servers, UNTRAINED_RUN)
    # Staleness lets a producer start (version + eta + 1) x batch trajectories at version 0:
    # 2 x 8 = 16, i.e. 4 groups. More than that is only possible if flat groups give it back.
    capacity_groups = 4
    try:
        run.cli("stream", "up", "-c", str(run.config))

        def beat(instance: str) -> ServiceStatus | None:
            return latest_heartbeats(settings, codec).get(instance)

        def trainer_reports_flat() -> ServiceStatus | None:
            status = beat(f"{run.name}-trainer")
            return status if status and "dropped as flat" in status.waiting_for else None

        trainer = wait_for("the trainer to report the stall", trainer_reports_flat, 300)
        assert "every reward is 0" in trainer.waiting_for
        assert "is the policy producing answers?" in trainer.waiting_for
        assert trainer.state == "waiting" and trainer.counters["dropped_flat_groups"] >= 1

        def producer_past_capacity() -> bool:
            status = beat(f"{run.name}-rollout-0")
            return status is not None and status.counters["groups"] > capacity_groups

        wait_for("the producer to play past its initial capacity", producer_past_capacity, 300)
        status = run.cli("stream", "status", "--run", run.name)
        assert "is the policy producing answers?" in status, status
        assert versions(settings, codec, run.name) == []  # flat groups are never trained
    finally:
        run.down()


@pytest.mark.timeout(600)
def test_a_supervisord_killed_9_leaves_no_service_behind_up_or_down(broker, tmp_path) -> None:
    run = Run(tmp_path / "home", broker.bootstrap_servers, UNTRAINED_RUN)

    def kill_supervisord() -> list[int]:
        services = [pid for pid in run.pids().values() if pid]
        os.kill(int(run.supervisor.pid_file.read_text()), signal.SIGKILL)
        wait_for("supervisord to die", lambda: not run.supervisor.is_running(), 30)
        return services

    def alive(pids: list[int]) -> list[int]:
        return [pid for pid in pids if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]  # fmt: skip

    try:
        run.cli("stream", "up", "-c", str(run.config))
        orphans = kill_supervisord()
        assert len(orphans) >= 4 and alive(orphans) == orphans  # the services outlive it
        assert {p.pid for p in run.supervisor.leftovers()} >= set(orphans)

        again = run.cli("stream", "up", "-c", str(run.config))
        assert "that outlived its supervisord" in again, again
        assert alive(orphans) == []
        assert set(run.pids().values()).isdisjoint(orphans)  # a fresh set, the only one

        orphans = kill_supervisord()
        down = run.cli("stream", "down", "--keep-broker")
        assert "that outlived its supervisord" in down, down
        assert alive(orphans) == [] and run.supervisor.leftovers() == []
    finally:
        run.down()


def test_a_new_run_s_groups_start_after_what_earlier_runs_left(settings) -> None:
    """The first `stream up` of a run commits the end of the shared topics for its groups,
    the evaluation processor's included: it never decodes other runs' samples."""
    from confluent_kafka import Consumer, TopicPartition

    from asearcher.cli.run.config import RunConfig, groups, paths, resolve
    from asearcher.cli.run.topology import _skip_foreign_backlog
    from asearcher.streams.cluster.admin import committed_offsets, end_offsets
    from asearcher.streams.wire.topics import (
        EVAL_TRAJECTORIES,
        SYNTH_REQUESTS,
        TOOL_CALLS,
        topic_spec,
    )

    config = RunConfig(name=f"t{uuid.uuid4().hex[:8]}")
    resolved = resolve(config, paths(config, Path("/nonexistent")))
    processor, synth = resolved.eval_processor.app_id, resolved.synth_processor.app_id
    _skip_foreign_backlog(settings, config.name, processor, synth)
    tools = groups(config.name)["tools"]
    for group, topic in ((processor, EVAL_TRAJECTORIES), (tools, TOOL_CALLS),
                         (synth, SYNTH_REQUESTS)):  # fmt: skip
        partitions = topic_spec(topic).partitions
        ends = {p: high for p, (_, high) in end_offsets(settings, topic, partitions).items()}
        consumer = Consumer(settings.client(**{"group.id": group, "enable.auto.commit": False}))
        try:
            offsets = committed_offsets(consumer, [TopicPartition(topic, p) for p in ends])
        finally:
            consumer.close()
        assert {o.partition: o.offset for o in offsets} == ends, (group, topic)
