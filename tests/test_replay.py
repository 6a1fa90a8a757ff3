"""Replay reads back exactly what was produced; export and re-drive preserve every event."""

from __future__ import annotations

import random
import time
import uuid

import pytest
from confluent_kafka import KafkaError, Message, TopicPartition
from typer.testing import CliRunner

from asearcher.cli.app import app
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.io.replay import (
    IDLE_SECONDS,
    ReadError,
    ReadTimeout,
    ReplayError,
    ReplayRange,
    bounded_reader,
    export_jsonl,
    load_jsonl,
    read_range,
    read_spans,
    redrive,
    watermarks,
)
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import DeadLetter, ToolCallRequested
from asearcher.streams.wire.topics import DEAD_LETTERS
from tests.conftest import read_raw
from tests.support.samples import episode


@pytest.fixture
def episodes_topic(settings, codec, make_topic):
    """Three sample episodes (every kind of a rollout) in one fresh 3-partition topic."""
    topic = make_topic(partitions=3)
    rng = random.Random(11)
    events = [out.event for q in range(3) for out in episode(rng, question_id=f"q{q}")]
    with EventProducer(settings, codec) as producer:
        for event in events:
            producer.send(topic, event)
    return topic, events


def replayed(settings, codec, topic, **bounds):
    return list(read_range(settings, codec, [topic], ReplayRange(**bounds)))


def test_replay_of_the_whole_topic_equals_what_was_produced(settings, codec, episodes_topic):
    topic, events = episodes_topic
    records = replayed(settings, codec, topic)
    assert sorted(r.event.event_id for r in records) == sorted(e.event_id for e in events)
    by_id = {e.event_id: e for e in events}
    assert all(r.event == by_id[r.event.event_id] for r in records)
    for partition in {r.partition for r in records}:
        offsets = [r.offset for r in records if r.partition == partition]
        assert offsets == sorted(offsets) == list(range(len(offsets)))


def test_replay_honours_offset_range_trajectory_and_kind(settings, codec, episodes_topic):
    topic, events = episodes_topic
    ranged = replayed(settings, codec, topic, from_offset=2, to_offset=5)
    assert ranged and all(2 <= r.offset < 5 for r in ranged)
    trajectory_id = events[1].trajectory_id
    one = replayed(settings, codec, topic, trajectory_id=trajectory_id)
    expected = [e for e in events if getattr(e, "trajectory_id", None) == trajectory_id]
    assert sorted(r.event.event_id for r in one) == sorted(e.event_id for e in expected)
    steps = replayed(settings, codec, topic, kinds=["GenerationStep"])
    assert len(steps) == 9 and {r.event.kind() for r in steps} == {"GenerationStep"}


def test_replay_by_time_returns_only_records_after_since(settings, codec, make_topic):
    topic = make_topic()
    rng = random.Random(5)
    first, second = episode(rng, "early"), episode(rng, "late")
    with EventProducer(settings, codec) as producer:
        for out in first:
            producer.send(topic, out.event)
        producer.flush()
        time.sleep(0.05)
        since_ms = int(time.time() * 1000)
        time.sleep(0.05)
        for out in second:
            producer.send(topic, out.event)
    records = replayed(settings, codec, topic, since_ms=since_ms)
    assert [r.event.event_id for r in records] == [o.event.event_id for o in second]
    until = replayed(settings, codec, topic, until_ms=since_ms)
    assert [r.event.event_id for r in until] == [o.event.event_id for o in first]


def test_export_to_jsonl_and_redrive_into_a_fresh_topic_preserve_every_event(
    settings, codec, episodes_topic, make_topic, tmp_path
):
    topic, events = episodes_topic
    url = (tmp_path / "export.jsonl.gz").as_uri()
    assert export_jsonl(read_range(settings, codec, [topic], ReplayRange()), url) == len(events)
    exported = list(load_jsonl(url))
    assert sorted(e.event.event_id for e in exported) == sorted(e.event_id for e in events)
    assert all(e.topic == topic for e in exported)

    target = make_topic(partitions=3)
    with EventProducer(settings, codec) as producer:
        count = redrive(read_range(settings, codec, [topic], ReplayRange()), producer, target)
    assert count == len(events)
    original = {r.event.event_id: r for r in replayed(settings, codec, topic)}
    copies = replayed(settings, codec, target)
    assert sorted(r.event.event_id for r in copies) == sorted(original)
    for copy in copies:
        assert copy.event == original[copy.event.event_id].event
        assert copy.key == original[copy.event.event_id].key


def test_replay_cli_prints_exports_and_redrives(
    settings, episodes_topic, make_topic, tmp_path, monkeypatch
):
    topic, events = episodes_topic
    monkeypatch.setenv("ASEARCHER_BOOTSTRAP_SERVERS", settings.bootstrap_servers)
    monkeypatch.setenv("ASEARCHER_HOME", str(tmp_path))
    runner = CliRunner()
    listing = runner.invoke(app, ["replay", topic, "--kind", "TrajectoryFinished"])
    assert listing.exit_code == 0, listing.output
    assert listing.output.count("TrajectoryFinished traj=") == 3

    trajectory_id = events[1].trajectory_id
    turns = runner.invoke(app, ["replay", topic, "-t", trajectory_id])
    assert turns.exit_code == 0
    assert "turn 0" in turns.output and "turn 2" in turns.output

    export = tmp_path / "cli.jsonl"
    exported = runner.invoke(app, ["replay", topic, "--export", export.as_uri()])
    assert exported.exit_code == 0
    assert len(export.read_text().splitlines()) == len(events)

    target = f"{topic}-copy"
    redriven = runner.invoke(app, ["replay", topic, "--to-topic", target, "--create"])
    assert redriven.exit_code == 0 and f"re-drove {len(events)} events" in redriven.output
    assert len(replayed(settings, EventCodec(), target)) == len(events)

    bad = runner.invoke(app, ["replay", topic, "--kind", "Nope"])
    assert bad.exit_code != 0 and "Nope" in str(bad.exception or bad.output)


# -- the bounded-read core, against a scripted consumer ------------------------------------------


class ScriptedConsumer:
    """Hands out scripted batches, then nothing; positions follow the data handed out."""

    def __init__(self, *batches: list[Message]) -> None:
        self.batches = list(batches)
        self.assigned: list[TopicPartition] = []
        self.next_offset: dict[tuple[str, int], int] = {}

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = partitions

    def poll(self, timeout: float) -> Message | None:
        if not self.batches or not self.batches[0]:
            if self.batches:
                self.batches.pop(0)
            time.sleep(min(timeout, 0.01))
            return None
        return self._take(self.batches[0].pop(0))

    def consume(self, limit: int, timeout: float) -> list[Message]:
        batch = self.batches.pop(0) if self.batches else []
        return [self._take(m) for m in batch[:limit]]

    def _take(self, message: Message) -> Message:
        if message.error() is None:
            where = (message.topic(), message.partition())
            self.next_offset[where] = message.offset() + 1
        return message

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        unfetched = -1001  # librdkafka's "no position yet"
        where = [(tp.topic, tp.partition) for tp in partitions]
        return [TopicPartition(t, p, self.next_offset.get((t, p), unfetched)) for t, p in where]


def data(partition: int, offset: int) -> Message:
    return Message(topic="t", partition=partition, offset=offset, value=b"v")


def notice(partition: int, code: int) -> Message:
    return Message(topic="t", partition=partition, offset=0, error=KafkaError(code))


def test_core_reads_each_span_to_its_end_or_its_eof_notice() -> None:
    consumer = ScriptedConsumer(
        [data(0, 2), data(0, 3), data(1, 0), data(0, 4)],  # 0 ends at 4: offset 4 is past it
        [notice(1, KafkaError._PARTITION_EOF)],  # 1 ends early: the rest is not stable yet
    )
    spans = {("t", 0): (2, 4), ("t", 1): (0, 9), ("t", 2): (5, 5)}
    read = [(m.partition(), m.offset()) for m in read_spans(consumer, spans, idle_s=2)]
    assert read == [(0, 2), (0, 3), (1, 0)]
    # An empty span is not even assigned; the others start where their span starts.
    assert [(tp.partition, tp.offset) for tp in consumer.assigned] == [(0, 2), (1, 0)]


def test_core_raises_on_an_unreadable_partition_but_waits_out_a_passing_error() -> None:
    passing = ScriptedConsumer([notice(0, KafkaError._TRANSPORT), data(0, 0)])
    assert [m.offset() for m in read_spans(passing, {("t", 0): (0, 1)}, idle_s=2)] == [0]
    refused = ScriptedConsumer([data(0, 0), notice(0, KafkaError.TOPIC_AUTHORIZATION_FAILED)])
    with pytest.raises(ReadError, match="t\\[0\\].*authorization"):
        list(read_spans(refused, {("t", 0): (0, 5)}, idle_s=2))


@pytest.mark.parametrize("deadline", ["timeout_s", "idle_s"])
def test_core_gives_up_after_its_deadline_naming_what_is_unfinished(deadline: str) -> None:
    consumer = ScriptedConsumer([data(0, 0)])
    started = time.monotonic()
    with pytest.raises(ReadTimeout) as timed_out:
        list(read_spans(consumer, {("t", 0): (0, 1), ("t", 1): (0, 3)}, **{deadline: 0.3}))
    assert 0.3 <= time.monotonic() - started < 5
    assert timed_out.value.pending == [("t", 1)]  # partition 0 was finished


def test_core_does_not_count_the_callers_time_as_idle() -> None:
    consumer = ScriptedConsumer([data(0, 0), data(0, 1)])
    for _ in read_spans(consumer, {("t", 0): (0, 2)}, idle_s=0.1):
        time.sleep(0.3)  # a slow re-drive between records


# -- read_range's own behaviour on a real topic ---------------------------------------------------


def test_replay_shows_undecodable_records_as_dead_letters_and_sends_nothing(
    settings, codec, make_topic
) -> None:
    topic = make_topic()
    garbage = b"\xc1\xff not an event"
    with EventProducer(settings, codec) as producer:
        producer.send(topic, ToolCallRequested(call_id="c0", trajectory_id="t", tool="search"))
        producer.send_raw(topic, garbage, key=b"t")
    first, second = replayed(settings, codec, topic)
    assert first.event.call_id == "c0"
    assert isinstance(second.event, DeadLetter) and second.event.payload == garbage
    assert second.event.origin_topic == topic and second.offset == 1
    messages = read_raw(settings, DEAD_LETTERS)
    letters = [EventCodec().decode(m.value(), m.headers(), (DeadLetter,)) for m in messages]
    assert not [letter for letter in letters if letter.origin_topic == topic]


def test_replay_of_an_unknown_topic_raises_replay_error(settings, codec) -> None:
    with pytest.raises(ReplayError, match="cannot read topic"):
        replayed(settings, codec, f"no-such-{uuid.uuid4().hex[:8]}")


def test_replay_is_not_held_up_by_an_open_transaction(settings, codec, make_topic) -> None:
    topic = make_topic()
    with EventProducer(settings, codec) as producer:
        producer.send(topic, ToolCallRequested(call_id="c0", trajectory_id="t", tool="search"))
    txn = EventProducer(settings, codec, transactional_id=f"replay-{uuid.uuid4().hex[:8]}")
    txn.kafka.init_transactions()
    txn.kafka.begin_transaction()
    txn.send(topic, ToolCallRequested(call_id="open", trajectory_id="t", tool="search"))
    txn.flush()
    try:
        started = time.monotonic()
        records = replayed(settings, codec, topic)
        took = time.monotonic() - started
    finally:
        txn.kafka.abort_transaction()
    assert [r.event.call_id for r in records] == ["c0"]
    assert took < IDLE_SECONDS  # ended at the last stable offset, not by giving up


def test_watermarks_of_a_partition_without_a_leader_yet_are_waited_for(settings) -> None:
    # A first `asearcher learn` reads the weights topic right after creating it; the broker
    # answered "not leader" for a moment, which once ended the run with a traceback. Here the
    # partition has no leader until the topic is created, two seconds after the read began.
    import threading

    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"fresh-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(settings.client())
    later = threading.Timer(2.0, lambda: admin.create_topics([NewTopic(name, num_partitions=1)]))
    consumer = bounded_reader(settings, "test-fresh-spans")
    later.start()
    try:
        started = time.monotonic()
        assert watermarks(consumer, TopicPartition(name, 0)) == (0, 0)
        assert time.monotonic() - started >= 1.5
    finally:
        later.join()
        consumer.close()
