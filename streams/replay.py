"""Read back any range of the event log: to inspect it, export it, or re-drive it into a topic.

Replay never joins a consumer group and never commits: it assigns partitions directly, reads from
a start to an end fixed when it begins, and leaves the log and every group untouched.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from typing import IO

import fsspec
import msgspec
from confluent_kafka import Consumer, Message, TopicPartition

from asearcher.streams.codec import EventCodec, EventDecodeError
from asearcher.streams.consumer import next_batch
from asearcher.streams.deadletter import dead_letter_of
from asearcher.streams.events import AnyEvent, Event
from asearcher.streams.log import get_logger
from asearcher.streams.producer import EventProducer
from asearcher.streams.records import Record
from asearcher.streams.settings import KafkaSettings
from asearcher.streams.topics import topic_spec

log = get_logger(__name__)
IDLE_SECONDS = 5.0


class ReplayError(ValueError):
    """A replay cannot be done as asked (a topic cannot be read, an export cannot be written)."""


class ReplayRange(msgspec.Struct, kw_only=True):
    """Which records to read. Offsets apply to every partition; times are epoch milliseconds."""

    from_offset: int | None = None
    to_offset: int | None = None  # exclusive
    since_ms: int | None = None
    until_ms: int | None = None  # exclusive
    trajectory_id: str | None = None
    kinds: list[str] = []

    def accepts(self, event: Event) -> bool:
        """Whether `event` passes the trajectory and kind filters."""
        if self.kinds and event.kind() not in self.kinds:
            return False
        if self.trajectory_id is not None:
            return getattr(event, "trajectory_id", None) == self.trajectory_id
        return True


class ExportedRecord(msgspec.Struct, kw_only=True):
    """One line of a JSONL export: the event and where it was in the log."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: str | None
    event: AnyEvent


def _bounds(consumer: Consumer, topic: str, rng: ReplayRange) -> list[tuple[TopicPartition, int]]:
    """(start position, end offset) for every partition of `topic` that has records in range."""
    metadata = consumer.list_topics(topic, timeout=30)
    if metadata.topics[topic].error is not None:
        raise ReplayError(f"topic {topic!r} cannot be read: {metadata.topics[topic].error.str()}")
    bounds = []
    for partition in sorted(metadata.topics[topic].partitions):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
        start, end = low, high
        if rng.from_offset is not None:
            start = max(start, rng.from_offset)
        if rng.to_offset is not None:
            end = min(end, rng.to_offset)
        if rng.since_ms is not None:
            start = max(start, _offset_at(consumer, topic, partition, rng.since_ms, high))
        if rng.until_ms is not None:
            end = min(end, _offset_at(consumer, topic, partition, rng.until_ms, high))
        if start < end:
            bounds.append((TopicPartition(topic, partition, start), end))
    return bounds


def _offset_at(consumer: Consumer, topic: str, partition: int, ms: int, high: int) -> int:
    """The first offset at or after time `ms` (the end if there is none)."""
    found = consumer.offsets_for_times([TopicPartition(topic, partition, ms)], timeout=30)[0]
    return found.offset if found.offset >= 0 else high


def read_range(
    settings: KafkaSettings, codec: EventCodec, topics: Iterable[str], rng: ReplayRange
) -> Iterator[Record]:
    """Every record of `topics` in `rng`, partition by partition in offset order.

    Undecodable records come back as `DeadLetter` events (nothing is sent anywhere), so a replay
    shows them instead of hiding them.
    """
    consumer = Consumer(
        settings.client(
            **{
                "group.id": f"asearcher-replay-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
            }
        )
    )
    try:
        ends: dict[tuple[str, int], int] = {}
        starts: list[TopicPartition] = []
        for topic in topics:
            for tp, end in _bounds(consumer, topic, rng):
                starts.append(tp)
                ends[(tp.topic, tp.partition)] = end
        if starts:
            consumer.assign(starts)
            yield from _drain(consumer, codec, ends, rng)
    finally:
        consumer.close()


def _drain(
    consumer: Consumer, codec: EventCodec, ends: dict[tuple[str, int], int], rng: ReplayRange
) -> Iterator[Record]:
    last_progress = time.monotonic()
    while ends:
        for message in next_batch(consumer, 500):
            where = (message.topic(), message.partition())
            if where not in ends:
                continue
            if message.error() is None and message.offset() < ends[where]:
                record = _record_of(codec, message)
                if rng.accepts(record.event):
                    yield record
            last_progress = time.monotonic()
        _drop_finished(consumer, ends)
        if ends and time.monotonic() - last_progress > IDLE_SECONDS:
            log.warning("replay gave up on %s: no records for %.0fs", sorted(ends), IDLE_SECONDS)
            return


def _drop_finished(consumer: Consumer, ends: dict[tuple[str, int], int]) -> None:
    # Transaction markers take offsets too, so a partition is done when its position passed the end.
    positions = consumer.position([TopicPartition(t, p) for t, p in ends])
    for tp in positions:
        if tp.offset >= ends[(tp.topic, tp.partition)]:
            del ends[(tp.topic, tp.partition)]


def _record_of(codec: EventCodec, message: Message) -> Record:
    topic = message.topic() or ""
    headers = message.headers() or []
    try:
        event: Event = codec.decode(message.value(), headers, topic_spec(topic).event_types)
    except EventDecodeError as exc:
        event = dead_letter_of(message, str(exc), "EventDecodeError")
    return Record.of(message, event)


def export_jsonl(records: Iterable[Record], url: str) -> int:
    """Write `records` as JSON lines to an fsspec URL (compression by extension); return count."""
    encoder = msgspec.json.Encoder()
    count = 0
    with _open_for_writing(url) as out:
        for record in records:
            line = ExportedRecord(
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                timestamp_ms=record.timestamp_ms,
                key=record.key,
                event=record.event,
            )
            out.write(encoder.encode(line) + b"\n")
            count += 1
    return count


def _open_for_writing(url: str) -> IO[bytes]:
    # Opened before the first record is read, so a bad target fails before any Kafka work.
    try:
        return fsspec.open(url, "wb", compression="infer").open()
    except (OSError, ValueError, ImportError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ReplayError(f"cannot write {url}: {reason}") from exc


def load_jsonl(url: str) -> Iterator[ExportedRecord]:
    """The records of a JSONL export, decoded back to events."""
    decoder = msgspec.json.Decoder(ExportedRecord)
    with fsspec.open(url, "rb", compression="infer") as src:
        for line in src:
            if line.strip():
                yield decoder.decode(line)


def redrive(records: Iterable[Record], producer: EventProducer, to_topic: str) -> int:
    """Produce every record's event, unchanged and with its key, into `to_topic`."""
    count = 0
    for record in records:
        origin = [("replayed-from", record.origin.encode())]
        producer.send(to_topic, record.event, key=record.key, headers=origin)
        count += 1
    producer.flush()
    return count


def parse_timestamp(text: str) -> int:
    """Epoch milliseconds from an integer of milliseconds or an ISO-8601 time (UTC if no zone)."""
    import datetime as dt

    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"not a time: {text!r} (use ISO-8601 or epoch milliseconds)") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)
