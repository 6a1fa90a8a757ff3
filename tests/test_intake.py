"""Out-of-order work items, committed exactly once each, across a member's crash."""

from __future__ import annotations

import threading
import time
import uuid

import msgspec
import pytest

from asearcher.streams.io.consumer import EventConsumer
from asearcher.streams.io.done_marks import (
    MetadataTooLong,
    PartitionProgress,
    decode_done,
    encode_done,
)
from asearcher.streams.io.intake import OutOfOrderIntake
from asearcher.streams.io.played import PlayedRequests
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.events import RolloutRequested, TrajectoryFinished
from asearcher.streams.wire.records import Outgoing
from tests.conftest import read_raw
from tests.support.samples import trajectory


def test_progress_commits_the_oldest_open_offset_and_lists_done_ones_above() -> None:
    progress = PartitionProgress(committed=10)
    for offset in range(10, 16):
        assert progress.receive(offset)
    assert not progress.receive(12)  # fetched twice: not worked on twice
    assert progress.commit_point({11, 13, 14}) == (10, "done:1,3-4")
    assert progress.commit_point() == (10, "done:")  # computing a point changes nothing
    progress.advance({11, 13, 14}, 10)
    assert progress.commit_point({10}) == (12, "done:1-2")
    progress.advance({10}, 12)
    progress.advance({12, 15}, 16)
    assert progress.commit_point() == (16, "done:")


def test_progress_after_takeover_skips_done_records() -> None:
    progress = PartitionProgress(committed=12, metadata="done:1-2")
    assert [o for o in range(12, 17) if progress.receive(o)] == [12, 15, 16]
    assert progress.commit_point({15}) == (12, "done:1-3")


def test_progress_metadata_runs_round_trip_and_foreign_metadata_is_ignored() -> None:
    done = {101, 102, 103, 105, 110, 111}
    assert encode_done(100, done) == "done:1-3,5,10-11"
    assert decode_done(100, encode_done(100, done)) == done
    assert len(encode_done(0, set(range(1, 100_000)))) < 20  # one long run stays short
    assert decode_done(5, "written by someone else") == set()
    assert decode_done(5, "done:x") == set()
    with pytest.raises(MetadataTooLong):
        encode_done(0, set(range(1, 4000, 2)))


def _request(number: int) -> RolloutRequested:
    return RolloutRequested(
        question_id=f"q{number}", group_id=f"g{number}", question="?", group_size=1
    )


def _output(topic: str, request: RolloutRequested) -> list[Outgoing]:
    import random

    finished = trajectory(random.Random(1), tokens=8)
    return [Outgoing(topic, msgspec.structs.replace(finished, group_id=request.group_id))]


def _intake(
    settings, codec, group: str, topic: str, instance: str, played: str | None = None
) -> OutOfOrderIntake:
    once = None if played is None else PlayedRequests(
        settings, codec, consumer_group=group, topic=topic, played_topic=played
    )  # fmt: skip
    return OutOfOrderIntake(
        settings, codec, group, topic, f"test-{instance}", played=once,
        **{"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
    )  # fmt: skip


def _poll_until(intake: OutOfOrderIntake, count: int, timeout: float = 30.0) -> list:
    records, deadline = [], time.monotonic() + timeout
    while len(records) < count and time.monotonic() < deadline:
        records += intake.poll(count - len(records))
        time.sleep(0.05)
    return records


def test_intake_redoes_only_unfinished_records_after_a_crash(settings, codec, make_topic) -> None:
    requests, outputs = make_topic(partitions=1), make_topic(like="trajectories")
    with EventProducer(settings, codec) as producer:
        for number in range(6):
            producer.send(requests, _request(number))
    group = f"intake-{uuid.uuid4().hex[:6]}"

    first = _intake(settings, codec, group, requests, uuid.uuid4().hex)
    records = _poll_until(first, 6)
    assert [r.offset for r in records] == list(range(6))
    for record in (records[1], records[3], records[4]):  # finish out of order, then "crash"
        assert first.commit(_output(outputs, record.event), [record])
    first.kafka.close()  # leave without finishing 0, 2 and 5

    second = _intake(settings, codec, group, requests, uuid.uuid4().hex)
    redone = _poll_until(second, 3)
    assert [r.offset for r in redone] == [0, 2, 5]
    for record in redone:
        assert second.commit(_output(outputs, record.event), [record])
    assert _poll_until(second, 1, timeout=3) == []
    second.close()

    groups = [m.value() for m in read_raw(settings, outputs)]
    with EventConsumer(settings, f"read-{uuid.uuid4().hex[:6]}", [outputs], codec) as reader:
        seen = []
        reader.run(lambda r: seen.append(r.event), max_messages=len(groups), timeout=30)
    assert sorted(t.group_id for t in seen if isinstance(t, TrajectoryFinished)) == [
        f"g{n}" for n in range(6)
    ]


def test_a_request_sent_again_is_handed_out_once_across_members(
    settings, codec, make_topic
) -> None:
    requests, outputs = make_topic(partitions=1), make_topic(like="trajectories")
    played = make_topic(like="requests.played")
    same, other = _request(1), _request(2)
    with EventProducer(settings, codec) as producer:
        for request in (same, same, other):  # a retry: the very same event twice
            producer.send(requests, request)
    group = f"intake-{uuid.uuid4().hex[:6]}"

    first = _intake(settings, codec, group, requests, uuid.uuid4().hex, played)
    records = _poll_until(first, 3, timeout=4)
    # The copy arrived while the first was still being worked on: finished unplayed.
    assert [(r.offset, r.event.group_id) for r in records] == [(0, "g1"), (2, "g2")]
    assert first.played is not None and first.played.duplicates == 1
    assert first.commit(_output(outputs, same), [records[0]], played=True)
    first.close()  # g2 unfinished: its next owner plays it

    with EventProducer(settings, codec) as producer:
        producer.send(requests, same)  # re-driven after it was played and committed
    second = _intake(settings, codec, group, requests, uuid.uuid4().hex, played)
    redone = _poll_until(second, 2, timeout=4)
    assert [(r.offset, r.event.group_id) for r in redone] == [(2, "g2")]
    assert second.played is not None and second.played.duplicates == 1  # offset 3
    # Set aside unplayed (e.g. a version it cannot load): a later copy may still be played.
    assert second.commit([], redone, played=False)
    with EventProducer(settings, codec) as producer:
        producer.send(requests, other)
    assert [r.offset for r in _poll_until(second, 1, timeout=10)] == [4]
    second.close()

    trained = [t for t in (r.event for r in _read(settings, codec, outputs))]
    assert [t.group_id for t in trained] == ["g1"]
    markers = [r.event for r in _read(settings, codec, played)]
    assert [(m.request_id, m.offset, m.consumer_group) for m in markers] == [("g1", 0, group)]


def _one_request_taken(settings, codec, make_topic, partitions: int):
    """A requests topic holding one request, taken by the first member of a new group."""
    requests, outputs = make_topic(partitions=partitions), make_topic(like="trajectories")
    with EventProducer(settings, codec) as producer:
        producer.send(requests, _request(1))
    group = f"intake-{uuid.uuid4().hex[:6]}"
    first = _intake(settings, codec, group, requests, uuid.uuid4().hex)
    [record] = _poll_until(first, 1)
    return requests, outputs, group, first, record


def test_a_commit_that_runs_across_a_rebalance_is_refused_and_the_next_owner_plays_it(
    settings, codec, make_topic
) -> None:
    """Seen in CI: a group's transaction ran while its partition was revoked; the next owner
    read the commit point before it, played the group again and both copies committed."""
    requests, outputs, group, first, record = _one_request_taken(settings, codec, make_topic, 1)
    released, transaction = threading.Event(), first._transaction

    def slow_transaction(*args) -> bool:  # a broker slow to answer, as under chaos
        released.wait(60)
        return transaction(*args)

    first._transaction = slow_transaction  # type: ignore[method-assign]
    committed: list[bool] = []
    commit = threading.Thread(
        target=lambda: committed.append(first.commit(_output(outputs, record.event), [record]))
    )
    commit.start()
    time.sleep(0.5)  # the commit has checked the partition is ours and waits on the broker
    second = _intake(settings, codec, group, requests, uuid.uuid4().hex)  # a rebalance
    again: list[tuple[OutOfOrderIntake, object]] = []
    deadline = time.monotonic() + 30
    while not again and time.monotonic() < deadline:  # the new generation's owner has it
        again += [(member, r) for member in (first, second) for r in member.poll(5)]
        time.sleep(0.05)
    released.set()
    commit.join(60)
    assert committed == [False]  # refused: its generation no longer owns the partition
    first.outputs.flush(10)  # the aborted records' reports must not fail its next transaction
    assert [r.offset for _, r in again] == [record.offset]
    assert _read(settings, codec, outputs) == []  # the old generation's outputs were aborted
    owner, redone = again[0]
    assert owner.commit(_output(outputs, redone.event), [redone])
    assert _poll_until(first, 1, timeout=2) + _poll_until(second, 1, timeout=2) == []
    first.close()
    second.close()
    assert [t.group_id for t in (r.event for r in _read(settings, codec, outputs))] == ["g1"]


def _poll_while(members: list[OutOfOrderIntake], done, timeout: float = 30.0) -> list:
    """Poll every member (each serves its own rebalances) until `done()`; what they got."""
    records, deadline = [], time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        records += [record for member in members for record in member.poll(5)]
        time.sleep(0.05)
    assert done(), "timed out"
    return records


def test_a_record_kept_from_an_earlier_assignment_never_commits(
    settings, codec, make_topic
) -> None:
    """A request still waiting when its partition left and came back must not commit: in
    between, another member may have played it (seen in CI: a revoked request kept in a
    service's waiting list, played by both members)."""
    requests, outputs, group, first, kept = _one_request_taken(settings, codec, make_topic, 2)
    second = _intake(settings, codec, group, requests, uuid.uuid4().hex)

    def handed_to_its_new_owner() -> bool:
        # Waited for: a copy still on its way to the first member would arrive after the next
        # rebalance and pass for one fetched under it (seen in CI).
        if not len(first.progress) == len(second.progress) == 1:
            return False
        owner = first if kept.partition in first.progress else second
        return kept.offset in owner.progress[kept.partition].open

    _poll_while([first, second], handed_to_its_new_owner)
    second.close()  # its partition comes back to the first
    # The rebalance and the fetch under it may come back from one poll: keep what it returned.
    fetched_again = _poll_while([first], lambda: len(first.progress) == 2)
    fetched_again += _poll_until(first, 1 - len(fetched_again))
    assert not first.commit(_output(outputs, kept.event), [kept])
    assert [(r.partition, r.offset) for r in fetched_again] == [(kept.partition, kept.offset)]
    assert first.commit(_output(outputs, kept.event), fetched_again)
    first.close()
    assert [t.group_id for t in (r.event for r in _read(settings, codec, outputs))] == ["g1"]


def _read(settings, codec, topic: str) -> list:
    from asearcher.streams.io.tail import read_to_end

    return read_to_end(settings, codec, topic, timeout_s=30)
