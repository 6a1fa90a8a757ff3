"""Read back any range of the event log: to inspect it, export it, or re-drive it into a topic.

Replay never joins a consumer group and never commits: it assigns partitions directly, reads from
a start to an end fixed when it begins, and leaves the log and every group untouched. That
bounded read (`read_spans`) is also what `tail.read_to_end` reads a topic to its end with.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from typing import IO

import fsspec
import msgspec
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from asearcher.streams.cluster import admin
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.consumer import next_batch
from asearcher.streams.io.deadletter import dead_letter_of
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.service.log import get_logger
from asearcher.streams.wire.codec import EventCodec, EventDecodeError
from asearcher.streams.wire.events import AnyEvent, Event
from asearcher.streams.wire.packed import as_list, dec_hook
from asearcher.streams.wire.records import Record
from asearcher.streams.wire.topics import topic_spec

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


# -- the bounded-read core: given partitions, from a start offset to an end fixed up front ------

Where = tuple[str, int]  # (topic, partition)
Span = tuple[int, int]  # [start, end) offsets
BATCH = 500
# Errors that say a partition cannot be read at all. Others (a dropped connection, a group
# coordinator that cannot be looked up, which assigned reads never need) are retried by the
# client; no error ever ends a partition, so none can make an unreadable topic look empty.
_UNREADABLE = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.TOPIC_AUTHORIZATION_FAILED)


class ReadError(RuntimeError):
    """A bounded read cannot go on: a topic or one of its partitions cannot be read."""


class ReadTimeout(TimeoutError):
    """A bounded read ran out of time with partitions still unfinished."""

    def __init__(self, message: str, pending: list[Where]) -> None:
        super().__init__(message)
        self.pending = pending


def bounded_reader(settings: KafkaSettings, group_id: str) -> Consumer:
    """A consumer for bounded reads: committed records only, end-of-partition notices, no commits.

    Partitions are assigned, never subscribed: `group_id` is only named (librdkafka needs one,
    ACLs grant DESCRIBE on it), so no group's offsets or lag change.
    """
    return Consumer(
        settings.client(
            **{
                "group.id": group_id,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                # A start that retention deleted meanwhile resumes at the oldest record left.
                "auto.offset.reset": "earliest",
            }
        )
    )


def topic_spans(consumer: Consumer, topic: str) -> dict[Where, Span]:
    """[low, high) watermarks of every partition of `topic` now; ReadError if it cannot be read.

    An unreadable topic must never pass for an empty one.
    """
    metadata = consumer.list_topics(topic, timeout=30).topics[topic]
    if metadata.error is not None or not metadata.partitions:
        reason = metadata.error.str() if metadata.error is not None else "no partitions"
        raise ReadError(f"cannot read topic {topic}: {reason}")
    return {
        (topic, partition): watermarks(consumer, TopicPartition(topic, partition))
        for partition in sorted(metadata.partitions)
    }


def watermarks(consumer: Consumer, where: TopicPartition) -> Span:
    """[low, high) of one partition, waiting out a partition without a leader yet (a topic just
    created, or about to be); ReadError on any other failure."""
    try:
        return admin.watermarks(consumer, where)
    except KafkaException as exc:
        raise ReadError(f"cannot read topic {where.topic}[{where.partition}]: {exc}") from exc


def read_spans(
    consumer: Consumer,
    spans: dict[Where, Span],
    *,
    timeout_s: float | None = None,
    idle_s: float | None = None,
) -> Iterator[Message]:
    """The committed data records of every span, each partition in offset order.

    A partition is done at its end-of-partition notice (in read_committed mode the last stable
    offset: an open transaction does not hold the read up) or once its position reached the end
    of its span. Raises ReadError on an error that says a partition cannot be read, and
    ReadTimeout once `timeout_s` passed since the start (the caller's time included), or
    `idle_s` without a record or notice.
    """
    open_ = {where: end for where, (start, end) in spans.items() if start < end}
    if not open_:
        return  # nothing to fetch: no assignment, no wait
    consumer.assign([TopicPartition(t, p, spans[(t, p)][0]) for t, p in sorted(open_)])
    clock = _Clock(timeout_s, idle_s)
    while open_:
        for message in next_batch(consumer, BATCH):
            where = (message.topic() or "", message.partition() or 0)
            if message.error() is not None:
                if _reached_end(message):
                    open_.pop(where, None)
                    clock.progressed()
            elif where in open_ and (message.offset() or 0) < open_[where]:
                yield message
                clock.progressed()  # after the yield: the caller's time is not idle time
            # Anything else was prefetched past the end of its span: not part of this read.
        _close_passed(consumer, open_)
        clock.check(open_)


def _reached_end(message: Message) -> bool:
    """True for an end-of-partition notice; raise ReadError if the error means "unreadable"."""
    error = message.error()
    if error.code() == KafkaError._PARTITION_EOF:
        return True
    where = f"{message.topic()}[{message.partition()}]" if message.topic() else "the cluster"
    if error.fatal() or error.code() in _UNREADABLE:
        raise ReadError(f"cannot read {where}: {error.str()}")
    log.warning("reading %s: %s (the client retries)", where, error.str())
    return False


def _close_passed(consumer: Consumer, open_: dict[Where, int]) -> None:
    # Transaction markers take offsets too, so no record may sit at end-1: a partition is done
    # once its position (the next offset to fetch) reached the end.
    if open_:
        for tp in consumer.position([TopicPartition(t, p) for t, p in open_]):
            if tp.offset >= open_[(tp.topic, tp.partition)]:
                del open_[(tp.topic, tp.partition)]


class _Clock:
    """The two deadlines of a bounded read: in all, and without progress."""

    def __init__(self, timeout_s: float | None, idle_s: float | None) -> None:
        self.started = self.last_progress = time.monotonic()
        self.timeout_s, self.idle_s = timeout_s, idle_s

    def progressed(self) -> None:
        self.last_progress = time.monotonic()

    def check(self, open_: dict[Where, int]) -> None:
        """Raise ReadTimeout if a deadline passed while partitions are still open."""
        if not open_:
            return
        now = time.monotonic()
        if self.timeout_s is not None and now - self.started > self.timeout_s:
            message = f"reading {_describe(list(open_))} took over {self.timeout_s:.0f}s"
        elif self.idle_s is not None and now - self.last_progress > self.idle_s:
            message = f"no records for {self.idle_s:.0f}s"
        else:
            return
        raise ReadTimeout(message, sorted(open_))


def _describe(partitions: list[Where]) -> str:
    return ", ".join(f"{topic}[{partition}]" for topic, partition in sorted(partitions))


def _bounds(consumer: Consumer, topic: str, rng: ReplayRange) -> dict[Where, Span]:
    """The [start, end) of every partition of `topic` that has records in range."""
    bounds = {}
    for (_, partition), (low, high) in topic_spans(consumer, topic).items():
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
            bounds[(topic, partition)] = (start, end)
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
    shows them instead of hiding them. Raises `ReplayError` when a topic cannot be read; a
    partition that makes no progress for IDLE_SECONDS is given up with a warning.
    """
    consumer = bounded_reader(settings, f"asearcher-replay-{uuid.uuid4().hex[:8]}")
    try:
        spans: dict[Where, Span] = {}
        for topic in topics:
            spans.update(_bounds(consumer, topic, rng))
        for message in read_spans(consumer, spans, idle_s=IDLE_SECONDS):
            record = _record_of(codec, message)
            if rng.accepts(record.event):
                yield record
    except ReadError as exc:
        raise ReplayError(str(exc)) from exc
    except ReadTimeout as exc:
        # A replay shows what it could read: a quiet broker is a warning, not a failure.
        log.warning("replay gave up on %s: %s", _describe(exc.pending), exc)
    finally:
        consumer.close()


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
    encoder = msgspec.json.Encoder(enc_hook=as_list)  # numbers a reader can see
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
    decoder = msgspec.json.Decoder(ExportedRecord, dec_hook=dec_hook)
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
