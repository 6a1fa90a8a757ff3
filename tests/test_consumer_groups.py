"""Consumer groups: partitions are shared, a dead member's work is taken over, nothing is lost."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from asearcher.streams.io.consumer import EventConsumer
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.events import ToolCallRequested
from asearcher.streams.wire.records import Record
from tests.conftest import worker_command
from tests.support.rollout import group_offsets
from tests.support.waiting import wait_for

FAST_GROUP = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


def produce_calls(settings, codec, topic: str, count: int) -> set[str]:
    """`count` tool calls spread over all partitions; returns their event ids."""
    events = [
        ToolCallRequested(call_id=f"c{i}", trajectory_id=f"t{i}", tool="search")
        for i in range(count)
    ]
    with EventProducer(settings, codec) as producer:
        for event in events:
            producer.send(topic, event)
    return {e.event_id for e in events}


class Member:
    """An in-process group member consuming on its own thread."""

    def __init__(self, settings, codec, topic: str, group: str) -> None:
        self.consumer = EventConsumer(settings, group, [topic], codec, **FAST_GROUP)
        self.seen: list[tuple[int, str]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.consumer.run(self._handle, timeout=90)

    def _handle(self, record: Record) -> None:
        self.seen.append((record.partition, record.event.event_id))

    def stop(self) -> None:
        self.consumer.stop()
        self.thread.join(30)
        self.consumer.close()


def test_two_consumers_in_one_group_split_the_partitions(settings, codec, make_topic) -> None:
    topic, group = make_topic(partitions=4), f"split-{time.time_ns()}"
    members = [Member(settings, codec, topic, group) for _ in range(2)]
    try:
        wait_for(
            "both members to be assigned partitions",
            lambda: (
                all(m.consumer.assignment for m in members)
                and sum(len(m.consumer.assignment) for m in members) == 4
            ),
            30,
            every=0.1,
        )
        ids = produce_calls(settings, codec, topic, 200)
        wait_for(
            lambda: f"all records: {[len(m.seen) for m in members]}",
            lambda: sum(len(m.seen) for m in members) >= 200,
            30,
            every=0.1,
        )
    finally:
        for member in members:
            member.stop()
    partitions = [{p for p, _ in m.seen} for m in members]
    assert all(partitions) and not partitions[0] & partitions[1]
    handled = [event_id for m in members for _, event_id in m.seen]
    assert sorted(handled) == sorted(ids)  # each record once, none lost


@pytest.mark.slow
def test_killed_consumer_partitions_are_taken_over_without_loss(
    settings, codec, make_topic, worker_env, tmp_path: Path
) -> None:
    topic, group = make_topic(partitions=4), f"takeover-{time.time_ns()}"
    ids = produce_calls(settings, codec, topic, 400)
    victim_log = tmp_path / "victim.log"
    victim = subprocess.Popen(
        worker_command("group_member.py", topic, group, str(victim_log), "0.2"), env=worker_env
    )
    try:
        wait_for(
            "the victim",
            lambda: victim_log.exists() and victim_log.stat().st_size > 0,
            60,
            every=0.1,
        )
        survivor = Member(settings, codec, topic, group)
        wait_for("the survivor to share the work", lambda: len(survivor.seen) > 10, 60, every=0.1)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        victim_seen = {line.split()[1] for line in victim_log.read_text().splitlines()}
        wait_for(
            "takeover", lambda: victim_seen | {i for _, i in survivor.seen} >= ids, 60, every=0.1
        )
    finally:
        victim.kill()
        survivor.stop()
    victim_partitions = {int(line.split()[0]) for line in victim_log.read_text().splitlines()}
    survivor_partitions = {p for p, _ in survivor.seen}
    assert victim_partitions and survivor_partitions == {0, 1, 2, 3}  # it took over the rest
    assert victim_seen | {i for _, i in survivor.seen} == ids


@pytest.mark.slow
def test_sigterm_stops_a_member_gracefully_and_commits_what_it_handled(
    settings, codec, make_topic, worker_env, tmp_path: Path
) -> None:
    topic, group = make_topic(partitions=2), f"sigterm-{time.time_ns()}"
    produce_calls(settings, codec, topic, 300)
    log = tmp_path / "member.log"
    member = subprocess.Popen(
        worker_command("group_member.py", topic, group, str(log), "0.01"),
        env=worker_env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for(
        "progress", lambda: log.exists() and len(log.read_text().splitlines()) >= 30, 60, every=0.1
    )
    member.send_signal(signal.SIGTERM)
    out, _ = member.communicate(timeout=30)
    assert member.returncode == 0
    handled = log.read_text().splitlines()
    assert f"stopped after {len(handled)} records" in out
    assert 30 <= len(handled) < 300
    committed = group_offsets(settings, group)
    assert sum(committed.values()) == len(handled)


def test_a_loop_stopped_mid_batch_hands_the_rest_to_its_next_run(settings, codec, make_topic):
    topic = make_topic()
    ids = produce_calls(settings, codec, topic, 10)
    seen: list[str] = []
    with EventConsumer(settings, f"rerun-{time.time_ns()}", [topic], codec) as consumer:

        def stop_after_three(record: Record) -> None:
            seen.append(record.event.event_id)
            if len(seen) == 3:
                consumer.stop()

        first = consumer.run(stop_after_three, timeout=30)
        second = consumer.run(lambda r: seen.append(r.event.event_id), max_messages=7, timeout=30)
    assert (first.handled, second.handled) == (3, 7)
    assert sorted(seen) == sorted(ids)  # nothing skipped, nothing twice
