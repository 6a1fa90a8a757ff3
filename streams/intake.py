"""A consumer-group member for long work items that finish out of order, exactly once each.

The rollout producer takes a request, plays its group for minutes, and finishes groups in any
order. Each finished item's outputs and the partition's new commit point (see `progress.py`)
go out in one Kafka transaction, so readers with read_committed see every item's outputs once,
even when a member dies and another takes its partitions over.

Threading: `poll`, `set_paused` and `commit_point` belong to the thread that polls (rebalance
callbacks run there too); `commit` may run in a worker thread, one at a time.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from asearcher.streams.codec import EventCodec
from asearcher.streams.consumer import (
    CONSUMER_DEFAULTS,
    LoopStats,
    RecordDecoder,
    raise_if_fatal,
)
from asearcher.streams.events import Event
from asearcher.streams.log import get_logger
from asearcher.streams.producer import EventProducer
from asearcher.streams.progress import PartitionProgress
from asearcher.streams.records import Outgoing, Record
from asearcher.streams.settings import KafkaSettings

log = get_logger(__name__)

Revoked = Callable[[list[int]], None]
# Says why an event cannot be worked on (it goes to the dead-letter topic), or None.
Validate = Callable[[Event], str | None]


class CommitPoint:
    """What one transaction commits for the input: offsets with their metadata."""

    def __init__(self, offsets: list[TopicPartition], group_metadata: Any) -> None:
        self.offsets = offsets
        self.group_metadata = group_metadata


class OutOfOrderIntake:
    """Hands out records of `topic`; commits each one's outputs and offset in one transaction."""

    def __init__(
        self,
        settings: KafkaSettings,
        codec: EventCodec,
        group_id: str,
        topic: str,
        transactional_id: str,
        *,
        on_revoked: Revoked | None = None,
        validate: Validate | None = None,
        **consumer_config: Any,
    ) -> None:
        config = {**CONSUMER_DEFAULTS, "enable.auto.commit": False, **consumer_config}
        config.pop("enable.auto.offset.store", None)
        self.topic = topic
        self.kafka = Consumer(settings.client(**{"group.id": group_id, **config}))
        self.outputs = EventProducer(settings, codec, transactional_id=transactional_id)
        self.outputs.kafka.init_transactions()
        # Dead letters are not part of any item's transaction: they go out at once.
        self.decoder = RecordDecoder(codec, EventProducer(settings, codec))
        self.stats = LoopStats()
        self.progress: dict[int, PartitionProgress] = {}
        self._on_revoked = on_revoked
        self._validate = validate
        self._paused = False
        self.kafka.subscribe([topic], on_assign=self._assigned, on_revoke=self._revoked)

    @staticmethod
    def transactional_id(prefix: str, instance: str | None) -> str:
        """A stable id per instance (restarting it fences its dead predecessor at once)."""
        return f"{prefix}-{instance or uuid.uuid4().hex[:12]}"

    def poll(self, max_records: int) -> list[Record]:
        """Up to `max_records` new records, without waiting; finished ones are skipped."""
        if self._paused:
            self.kafka.poll(0)  # serves rebalances and keeps the membership alive
            return []
        records = []
        for message in self.kafka.consume(max_records, 0):
            record = self._accept(message)
            if record is not None:
                records.append(record)
        return records

    def set_paused(self, paused: bool) -> None:
        """Stop or resume fetching (while busy, so records wait in Kafka, not in memory)."""
        if paused != self._paused:
            self._paused = paused
            partitions = [TopicPartition(self.topic, p) for p in self.progress]
            if partitions:
                (self.kafka.pause if paused else self.kafka.resume)(partitions)

    def owns(self, record: Record) -> bool:
        """Whether this member still owns `record`'s partition."""
        return record.partition in self.progress

    def commit_point(self, record: Record) -> CommitPoint | None:
        """Mark `record` done; the offsets to commit with its outputs (None if revoked)."""
        if record.partition not in self.progress:
            return None
        return self.commit_points([record])

    def commit_points(self, done: list[Record]) -> CommitPoint:
        """Mark `done` records (of partitions still owned) done; the offsets of every owned
        partition to commit with their outputs."""
        for record in done:
            progress = self.progress.get(record.partition)
            if progress is not None:
                progress.finish(record.offset)
        offsets = []
        for partition, progress in sorted(self.progress.items()):
            offset, metadata = progress.commit_point()
            offsets.append(TopicPartition(self.topic, partition, offset, metadata=metadata))
        return CommitPoint(offsets, self.kafka.consumer_group_metadata())

    def commit(self, outputs: Iterable[Outgoing], point: CommitPoint) -> None:
        """Send `outputs` and commit `point` atomically; abort and raise on failure."""
        producer = self.outputs.kafka
        producer.begin_transaction()
        try:
            for out in outputs:
                self.outputs.send(out.topic, out.event, key=out.key)
            producer.send_offsets_to_transaction(point.offsets, point.group_metadata)
            producer.commit_transaction()
            self.outputs.raise_failures()
        except BaseException:
            try:
                producer.abort_transaction()
            except KafkaException as exc:
                log.error("could not abort transaction: %s", exc)
            raise
        self.stats.handled += 1

    def _accept(self, message: Message) -> Record | None:
        if raise_if_fatal(message):
            return None
        progress = self.progress.get(message.partition() or 0)
        if progress is None or not progress.receive(message.offset() or 0):
            return None  # finished before a takeover, or no longer ours
        record = self.decoder.decode(message)
        reason = None if record is None or self._validate is None else self._validate(record.event)
        if reason is not None:
            self.decoder.set_aside(message, reason, "InvalidRequest")
        if record is None or reason is not None:
            # Set aside for good: the dead letter is durable before the offset can pass it.
            self.decoder.dead_letters.flush()
            self.stats.dead_lettered += 1
            progress.finish(message.offset() or 0)
            return None
        return record

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        committed = consumer.committed(partitions, timeout=30)
        for tp in committed:
            self.progress[tp.partition] = PartitionProgress(tp.offset, tp.metadata)
            done = sorted(self.progress[tp.partition].done)
            log.info("assigned %s[%d] from offset %d (done above: %s)", tp.topic, tp.partition,
                     tp.offset, done or "none")  # fmt: skip
        if self._paused:
            consumer.pause(partitions)

    def _revoked(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = [tp.partition for tp in partitions]
        for number in numbers:
            self.progress.pop(number, None)
        log.info("revoked %s partitions %s", self.topic, numbers)
        if self._on_revoked is not None:
            self._on_revoked(numbers)

    def close(self) -> None:
        """Leave the group (unfinished records go to other members) and flush dead letters."""
        self.kafka.close()
        self.decoder.dead_letters.close()
        self.outputs.close()
