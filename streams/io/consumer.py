"""The consume loop every service runs: decode, handle, then store the offset.

Offsets are stored only after the handler returned, and committed by librdkafka in the
background and once more on close, so a crash redelivers at most the records in flight (at least
once). An undecodable record goes to the dead-letter topic with the reason and the loop goes on.
A handler that raises stops the loop without storing that record's offset, so it is redelivered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.deadletter import dead_letter_headers, dead_letter_of
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.service.lifecycle import stop_on_signals
from asearcher.streams.service.log import get_logger
from asearcher.streams.wire.codec import EventCodec, EventDecodeError
from asearcher.streams.wire.events import Event
from asearcher.streams.wire.records import Record
from asearcher.streams.wire.topics import DEAD_LETTERS, topic_spec

log = get_logger(__name__)

CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": True,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "isolation.level": "read_committed",
}
POLL_SECONDS = 0.2
_FATAL_CODES = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.TOPIC_AUTHORIZATION_FAILED)


@dataclass(slots=True)
class LoopStats:
    """What a run of a loop did."""

    handled: int = 0
    dead_lettered: int = 0

    @property
    def total(self) -> int:
        return self.handled + self.dead_lettered


class RecordDecoder:
    """Turns raw messages into `Record`s, routing the undecodable ones to the dead-letter topic."""

    def __init__(self, codec: EventCodec, dead_letters: EventProducer) -> None:
        self.codec = codec
        self.dead_letters = dead_letters
        self._kinds: dict[str, tuple[type[Event], ...]] = {}

    def decode(self, message: Message) -> Record | None:
        """The record, or None after sending the message to the dead-letter topic."""
        topic = message.topic() or ""
        kinds = self._kinds.get(topic)
        if kinds is None:
            kinds = self._kinds[topic] = topic_spec(topic).event_types
        headers = message.headers() or []
        try:
            event = self.codec.decode(message.value(), headers, kinds)
        except EventDecodeError as exc:
            self.set_aside(message, str(exc), "EventDecodeError")
            return None
        return Record.of(message, event)

    def decode_all(self, messages: list[Message], stats: LoopStats) -> list[Record]:
        """The decodable records of a batch; the others are dead-lettered and counted."""
        records = []
        for message in messages:
            if raise_if_fatal(message):
                continue
            record = self.decode(message)
            if record is None:
                stats.dead_lettered += 1
            else:
                records.append(record)
        return records

    def set_aside(self, message: Message, reason: str, error_type: str) -> None:
        """Queue `message` on the dead-letter topic with `reason`."""
        letter = dead_letter_of(message, reason, error_type)
        log.warning("dead-lettering %s", letter.summary())
        self.dead_letters.send(DEAD_LETTERS, letter, headers=dead_letter_headers(letter))


def next_batch(consumer: Consumer, limit: int) -> list[Message]:
    """Wait up to POLL_SECONDS for one record, then take whatever else is ready, up to `limit`.

    `consume(limit, timeout)` would hold the first record until the batch fills or the timeout
    ends, adding the whole timeout to every record when traffic is light.
    """
    first = consumer.poll(POLL_SECONDS)
    if first is None:
        return []
    return [first, *consumer.consume(limit - 1, 0)] if limit > 1 else [first]


def raise_if_fatal(message: Message) -> bool:
    """True if `message` carries an error; raise it when it is not a harmless notice."""
    err = message.error()
    if err is None:
        return False
    if err.code() == KafkaError._PARTITION_EOF:
        return True
    if err.fatal() or err.code() in _FATAL_CODES:
        raise KafkaException(err)
    log.warning("consumer error on %s[%s]: %s", message.topic(), message.partition(), err.str())
    return True


def _describe(partitions: list[TopicPartition]) -> str:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return ", ".join(f"{t}{sorted(p)}" for t, p in sorted(by_topic.items())) or "nothing"


class StopCondition:
    """When a loop should end: asked to stop, enough records, or out of time."""

    def __init__(self, max_messages: int | None, timeout: float | None) -> None:
        self.max_messages = max_messages
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.requested = threading.Event()

    def reached(self, stats: LoopStats) -> bool:
        if self.requested.is_set():
            return True
        if self.max_messages is not None and stats.total >= self.max_messages:
            return True
        return self.deadline is not None and time.monotonic() >= self.deadline

    def batch_limit(self, stats: LoopStats, batch_size: int) -> int:
        if self.max_messages is None:
            return batch_size
        return max(1, min(batch_size, self.max_messages - stats.total))


def _call(handler: Callable[[Record], None], record: Record) -> None:
    try:
        handler(record)
    except Exception:
        log.exception("handler failed on %s; it will be redelivered", record.origin)
        raise


class EventConsumer:
    """A member of consumer group `group_id` that hands decoded events to a handler."""

    def __init__(
        self,
        settings: KafkaSettings,
        group_id: str,
        topics: list[str],
        codec: EventCodec,
        **config: Any,
    ) -> None:
        self.kafka = Consumer(
            settings.client(**{"group.id": group_id, **CONSUMER_DEFAULTS, **config})
        )
        # Kept from the rebalance callbacks: asking the client from another thread while it
        # consumes is not safe.
        self.assignment: frozenset[tuple[str, int]] = frozenset()
        self.kafka.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke)
        self.decoder = RecordDecoder(codec, EventProducer(settings, codec))
        self._stop: StopCondition | None = None

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assignment = frozenset((tp.topic, tp.partition) for tp in partitions)
        log.info("assigned %s", _describe(partitions))

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assignment = frozenset()
        log.info("revoked %s", _describe(partitions))

    def stop(self) -> None:
        """Ask a running loop to finish the current record and return (thread-safe)."""
        if self._stop is not None:
            self._stop.requested.set()

    def run(
        self,
        handler: Callable[[Record], None],
        *,
        max_messages: int | None = None,
        timeout: float | None = None,
        batch_size: int = 500,
    ) -> LoopStats:
        """Consume until stopped, `max_messages` records were processed, or `timeout` seconds.

        A group rebalance waits until every member polls again, i.e. until the current batch is
        handled: services with slow handlers should use a small `batch_size`.
        """

        def each(messages: list[Message], stats: LoopStats) -> None:
            for index, message in enumerate(messages):
                self._process(message, handler, stats)
                if self._stop is not None and self._stop.requested.is_set():
                    self._rewind(messages[index + 1 :])
                    break

        return self._loop(each, max_messages, timeout, batch_size)

    def run_batches(
        self,
        handler: Callable[[list[Record]], None],
        *,
        max_messages: int | None = None,
        timeout: float | None = None,
        batch_size: int = 500,
    ) -> LoopStats:
        """Like `run`, but hands each polled batch to `handler` at once (for concurrent work).

        The batch's offsets are stored after the handler returned for the whole batch.
        """
        return self._loop(
            lambda messages, stats: self._process_batch(messages, handler, stats),
            max_messages,
            timeout,
            batch_size,
        )

    def _loop(
        self,
        process: Callable[[list[Message], LoopStats], None],
        max_messages: int | None,
        timeout: float | None,
        batch_size: int,
    ) -> LoopStats:
        stats = LoopStats()
        self._stop = until = StopCondition(max_messages, timeout)
        with stop_on_signals(self.stop):
            while not until.reached(stats):
                messages = next_batch(self.kafka, until.batch_limit(stats, batch_size))
                if messages:
                    process(messages, stats)
        return stats

    def _rewind(self, unprocessed: list[Message]) -> None:
        """Seek back to records polled but not handled, so a later run still handles them."""
        first: dict[tuple[str, int], int] = {}
        for message in unprocessed:
            where = (message.topic() or "", message.partition() or 0)
            offset = message.offset() or 0
            first[where] = min(first.get(where, offset), offset)
        for (topic, partition), offset in first.items():
            self.kafka.seek(TopicPartition(topic, partition, offset))

    def _process(
        self, message: Message, handler: Callable[[Record], None], stats: LoopStats
    ) -> None:
        if raise_if_fatal(message):
            return
        record = self.decoder.decode(message)
        if record is None:
            # The dead letter must be durable before the offset moves past the original.
            self.decoder.dead_letters.flush()
            stats.dead_lettered += 1
        else:
            _call(handler, record)
            stats.handled += 1
        self.kafka.store_offsets(message=message)

    def _process_batch(
        self, messages: list[Message], handler: Callable[[list[Record]], None], stats: LoopStats
    ) -> None:
        records = self.decoder.decode_all(messages, stats)
        self.decoder.dead_letters.flush()
        if records:
            handler(records)
        stats.handled += len(records)
        for message in messages:
            self.kafka.store_offsets(message=message)

    def close(self) -> None:
        """Commit stored offsets, leave the group and deliver pending dead letters."""
        self.kafka.close()
        self.decoder.dead_letters.close()

    def __enter__(self) -> EventConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
