"""Records that cannot be decoded are kept on the dead-letter topic with the reason."""

from __future__ import annotations

import time

from confluent_kafka import TopicPartition

from asearcher.streams.io.consumer import EventConsumer
from asearcher.streams.io.intake import OutOfOrderIntake
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.codec import EventCodec, header_value
from asearcher.streams.wire.events import DeadLetter, Event, GenerationStep, ToolCallRequested
from asearcher.streams.wire.records import Outgoing, Record
from asearcher.streams.wire.topics import DEAD_LETTERS, TOOL_CALLS
from tests.conftest import read_raw

GARBAGE = b"\xc1\xff not an event \x00"


def dead_letters_from(settings, topic: str) -> list[tuple[DeadLetter, list]]:
    letters = []
    for message in read_raw(settings, DEAD_LETTERS):
        letter = EventCodec().decode(message.value(), message.headers(), (DeadLetter,))
        if letter.origin_topic == topic:
            letters.append((letter, message.headers()))
    return letters


def call(i: int) -> ToolCallRequested:
    return ToolCallRequested(call_id=f"c{i}", trajectory_id="t", tool="search")


def test_garbage_goes_to_the_dead_letter_topic_and_the_loop_keeps_running(
    settings, codec, make_topic
) -> None:
    topic = make_topic()
    with EventProducer(settings, codec) as producer:
        producer.send(topic, call(0))
        producer.send_raw(topic, GARBAGE, key=b"t", headers=[("trace", b"x1")])
        producer.send(topic, call(1))
    handled = []
    with EventConsumer(settings, f"dlq-{time.time_ns()}", [topic], codec) as consumer:
        stats = consumer.run(lambda r: handled.append(r.event.call_id), max_messages=3, timeout=30)
    assert (stats.handled, stats.dead_lettered) == (2, 1)
    assert handled == ["c0", "c1"]  # the record after the garbage was still handled
    [(letter, headers)] = dead_letters_from(settings, topic)
    assert letter.payload == GARBAGE and letter.key == b"t"
    assert letter.origin_offset == 1 and ("trace", b"x1") in letter.headers
    assert letter.error_type == "EventDecodeError"
    assert "not a valid msgpack event" in letter.reason
    assert header_value(headers, "dlq-reason") == letter.reason
    assert header_value(headers, "dlq-origin") == f"{topic}[0]@1"


def test_an_event_of_the_wrong_kind_for_its_topic_is_dead_lettered(settings, codec) -> None:
    step = GenerationStep(
        trajectory_id=f"wrong-{time.time_ns()}", turn=0, token_ids=[1], logprobs=[0.0],
        policy_version=0,
    )  # fmt: skip
    with EventProducer(settings, codec) as producer:
        producer.send(TOOL_CALLS, step)
    # Read back only this record: tool.calls is shared with other tests.
    [message] = [
        m for m in read_raw(settings, TOOL_CALLS) if m.key() == step.trajectory_id.encode()
    ]
    group = f"wrong-kind-{time.time_ns()}"
    with EventConsumer(settings, group, [TOOL_CALLS], codec) as consumer:
        consumer.kafka.unsubscribe()
        consumer.kafka.assign([TopicPartition(TOOL_CALLS, message.partition(), message.offset())])
        stats = consumer.run(lambda r: None, max_messages=1, timeout=30)
    assert stats.dead_lettered == 1
    letters = [
        letter
        for letter, _ in dead_letters_from(settings, TOOL_CALLS)
        if letter.origin_offset == message.offset()
        and letter.origin_partition == message.partition()
    ]
    assert letters and "ToolCallRequested" in letters[0].reason


def poll_until(intake: OutOfOrderIntake, wanted: int, timeout: float) -> list[Record]:
    records, deadline = [], time.monotonic() + timeout
    while len(records) < wanted and time.monotonic() < deadline:
        records += intake.poll(wanted - len(records))
        time.sleep(0.05)
    return records


def refuse_foreign_tools(event: Event) -> str | None:
    return None if event.tool == "search" else f"no tool {event.tool!r}"


def test_intake_sets_aside_garbage_and_invalid_records_for_good_then_commits_past_them(
    settings, codec, make_topic
) -> None:
    in_topic, out_topic = make_topic(), make_topic()
    with EventProducer(settings, codec) as producer:
        producer.send(in_topic, call(0))
        producer.send_raw(in_topic, GARBAGE)
        producer.send(in_topic, ToolCallRequested(call_id="c2", trajectory_id="t", tool="rm"))
        producer.send(in_topic, call(3))
    group = f"tx-dlq-{time.time_ns()}"

    def member() -> OutOfOrderIntake:
        return OutOfOrderIntake(
            settings, codec, group, in_topic, f"tx-dlq-{time.time_ns()}",
            validate=refuse_foreign_tools,
        )  # fmt: skip

    first = member()
    try:
        records = poll_until(first, 2, timeout=30)
        assert [r.event.call_id for r in records] == ["c0", "c3"]
        assert first.stats.dead_lettered == 2
        # Durable before any commit can move the group's offset past the originals.
        found = dead_letters_from(settings, in_topic)
        letters = {letter.origin_offset: letter for letter, _ in found}
        assert sorted(letters) == [1, 2]
        assert letters[1].payload == GARBAGE and letters[1].error_type == "EventDecodeError"
        assert (letters[2].error_type, letters[2].reason) == ("InvalidRequest", "no tool 'rm'")
        assert first.commit([Outgoing(out_topic, r.event) for r in records], records)
    finally:
        first.close()
    assert len(read_raw(settings, out_topic)) == 2

    # The set-aside records count as finished: a new member redoes nothing, sets nothing aside.
    second = member()
    try:
        assert poll_until(second, 1, timeout=5) == []
        assert second.stats.dead_lettered == 0
    finally:
        second.close()
    assert len(dead_letters_from(settings, in_topic)) == 2
