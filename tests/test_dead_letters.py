"""Records that cannot be decoded are kept on the dead-letter topic with the reason."""

from __future__ import annotations

import time

from confluent_kafka import TopicPartition

from asearcher.streams.codec import EventCodec, header_value
from asearcher.streams.consumer import EventConsumer
from asearcher.streams.events import DeadLetter, GenerationStep, ToolCallRequested
from asearcher.streams.producer import EventProducer
from asearcher.streams.records import Outgoing
from asearcher.streams.topics import DEAD_LETTERS, TOOL_CALLS
from asearcher.streams.transactional import TransactionalProcessor
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


def test_transactional_processor_dead_letters_garbage_inside_its_transaction(
    settings, codec, make_topic
) -> None:
    in_topic, out_topic = make_topic(), make_topic()
    with EventProducer(settings, codec) as producer:
        producer.send(in_topic, call(0))
        producer.send_raw(in_topic, GARBAGE)
        producer.send(in_topic, call(2))
    with TransactionalProcessor(
        settings, f"tx-dlq-{time.time_ns()}", [in_topic], f"tx-dlq-{time.time_ns()}", codec
    ) as processor:
        stats = processor.run(lambda r: [Outgoing(out_topic, r.event)], max_messages=3, timeout=30)
    assert (stats.handled, stats.dead_lettered) == (2, 1)
    assert len(read_raw(settings, out_topic)) == 2
    [(letter, _)] = dead_letters_from(settings, in_topic)
    assert letter.payload == GARBAGE
