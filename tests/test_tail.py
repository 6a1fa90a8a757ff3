"""`read_to_end`: committed records up to the end now; an unreadable topic never reads as empty.
`KeyTail`: the keys and kinds of a topic followed, its values never decoded. `TopicWatch`: the
events of some topics a job waits for."""

from __future__ import annotations

import time
import uuid

import pytest

from asearcher.streams.io.producer import EventProducer
from asearcher.streams.io.tail import KeyTail, read_to_end
from asearcher.streams.io.watch import TopicWatch
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import DeadLetter, ToolCallRequested
from asearcher.streams.wire.topics import DEAD_LETTERS
from tests.conftest import read_raw
from tests.support.waiting import wait_for

GARBAGE = b"\xc1\xff not an event \x00"


def call(name: str) -> ToolCallRequested:
    # One trajectory id per partition key: records of a key keep their order in one partition.
    return ToolCallRequested(call_id=name, trajectory_id=f"t-{name[-1]}", tool="search")


def letters_from(settings, topic: str) -> list[DeadLetter]:
    codec = EventCodec()
    messages = read_raw(settings, DEAD_LETTERS)
    letters = [codec.decode(m.value(), m.headers(), (DeadLetter,)) for m in messages]
    return [letter for letter in letters if letter.origin_topic == topic]


def test_committed_records_in_order_without_aborted_or_open_transactions(
    settings, codec, make_topic
) -> None:
    topic = make_topic(partitions=2)
    with EventProducer(settings, codec) as plain:
        for name in ("a0", "a1", "b0", "b1"):
            plain.send(topic, call(name))
    txn = EventProducer(settings, codec, transactional_id=f"tail-{uuid.uuid4().hex[:8]}")
    txn.kafka.init_transactions()
    txn.kafka.begin_transaction()
    txn.send(topic, call("aborted0"))
    txn.flush()
    txn.kafka.abort_transaction()
    with EventProducer(settings, codec) as plain:
        plain.send(topic, call("c0"))
    txn.kafka.begin_transaction()  # left open while reading: the end is the last stable offset
    txn.send(topic, call("open0"))
    txn.flush()
    try:
        started = time.monotonic()
        records = read_to_end(settings, codec, topic, timeout_s=30)
        took = time.monotonic() - started
    finally:
        txn.kafka.abort_transaction()
    assert sorted(r.event.call_id for r in records) == ["a0", "a1", "b0", "b1", "c0"]
    assert took < 15  # the open transaction did not hold the read up until the deadline
    for partition in {r.partition for r in records}:
        offsets = [r.offset for r in records if r.partition == partition]
        assert offsets == sorted(offsets)
    even = [r.event.call_id for r in records if r.event.call_id.endswith("0")]
    assert even == ["a0", "b0", "c0"]  # produced in this order on one partition


def test_an_empty_topic_reads_as_empty_at_once(settings, codec, make_topic) -> None:
    started = time.monotonic()
    assert read_to_end(settings, codec, make_topic(partitions=3), timeout_s=30) == []
    assert time.monotonic() - started < 10


def test_an_unknown_topic_raises_instead_of_reading_as_empty(settings, codec) -> None:
    with pytest.raises(RuntimeError, match="cannot read topic"):
        read_to_end(settings, codec, f"no-such-{uuid.uuid4().hex[:8]}", timeout_s=30)


@pytest.mark.parametrize("own_producer", [True, False])
def test_undecodable_records_are_dead_lettered_before_it_returns(
    settings, codec, make_topic, own_producer: bool
) -> None:
    topic = make_topic()
    with EventProducer(settings, codec) as producer:
        producer.send(topic, call("x0"))
        producer.send_raw(topic, GARBAGE, key=b"t-0")
        producer.send(topic, call("y0"))
    letters = EventProducer(settings, codec) if own_producer else None
    records = read_to_end(settings, codec, topic, dead_letters=letters, timeout_s=30)
    assert [r.event.call_id for r in records] == ["x0", "y0"]
    if letters is not None:
        assert letters.delivered == 1  # flushed through the producer it was given
    [letter] = letters_from(settings, topic)
    assert letter.payload == GARBAGE and letter.origin_offset == 1
    assert letter.error_type == "EventDecodeError"


def test_a_key_tail_hands_out_keys_and_kinds_without_decoding_values(
    settings, codec, make_topic
) -> None:
    topic = make_topic(partitions=2)
    with EventProducer(settings, codec) as producer:
        producer.send(topic, call("before0"))
    seen: list[tuple[str, str | None]] = []
    tail = KeyTail(settings, topic, lambda key, kind: seen.append((key, kind)), "beginning")
    tail.start()
    try:
        wait_for("the key tail to catch up", tail.caught_up.is_set, timeout=30)
        with EventProducer(settings, codec) as producer:
            producer.send(topic, call("after1"))
            producer.send_raw(topic, GARBAGE, key=b"t-garbage")  # its value is never read
            producer.send_raw(topic, GARBAGE)  # no key: nothing to say
        wait_for("three keys", lambda: len(seen) >= 3, timeout=30)
    finally:
        tail.stop()
    assert sorted(seen) == [
        ("t-0", "ToolCallRequested"), ("t-1", "ToolCallRequested"), ("t-garbage", None),
    ]  # fmt: skip
    assert letters_from(settings, topic) == []  # nothing decoded, so nothing dead-lettered


def test_a_follower_reads_records_larger_than_what_it_may_fetch_ahead(
    settings, codec, make_topic
) -> None:
    topic = make_topic(partitions=1)
    big = bytes(300 * 1024)  # each record is larger than the whole prefetch bound
    with EventProducer(settings, codec) as producer:
        for index in range(8):
            producer.send_raw(topic, big, key=f"k{index}".encode())
    seen: list[str] = []
    tail = KeyTail(settings, topic, lambda key, _kind: seen.append(key), "beginning", 64)
    tail.start()
    try:
        wait_for("the bounded tail to catch up", tail.caught_up.is_set, timeout=60)
    finally:
        tail.stop()
    assert seen == [f"k{index}" for index in range(8)]


def test_a_topic_watch_keeps_what_its_picks_accept_from_where_it_starts(
    settings, codec, make_topic
) -> None:
    calls, other = make_topic(partitions=2), make_topic()
    with EventProducer(settings, codec) as producer:
        producer.send(calls, call("early0"))
    picks = {calls: lambda e: e.call_id.startswith("keep"), other: lambda e: True}
    with (
        TopicWatch(settings, codec, picks) as from_now,
        TopicWatch(settings, codec, {calls: lambda e: True}, "beginning") as from_start,
    ):
        with EventProducer(settings, codec) as producer:
            for name in ("keep0", "drop0", "keep1"):
                producer.send(calls, call(name))
            producer.send(other, call("x0"))
        wait_for("the picked events", lambda: from_now.count(calls) == 2, timeout=30)
        wait_for("the other topic", lambda: from_now.count(other) == 1, timeout=30)
        assert from_start.caught_up(timeout=30)
        wait_for("every call", lambda: from_start.count(calls) == 4, timeout=30)
        assert sorted(e.call_id for e in from_now.events(calls)) == ["keep0", "keep1"]
        later = from_now.events(calls, start=1)
        assert len(later) == 1 and later[0] == from_now.events(calls)[1]
    assert "early0" in {e.call_id for e in from_start.events(calls)}  # readable after stopping
