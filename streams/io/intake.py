"""A consumer-group member for long work items that finish out of order, exactly once each.

The rollout producer takes a request, plays its group for minutes, and finishes groups in any
order. Each finished item's outputs and the partition's new commit point (see `done_marks.py`)
go out in one Kafka transaction, so readers with read_committed see every item's outputs once,
even when a member dies and another takes its partitions over.

Threading: `poll`, `set_paused` and `commit_point` belong to the thread that polls (rebalance
callbacks run there too); `commit` may run in a worker thread, one at a time.

A commit checks that its partitions are still ours and takes the group's generation in the same
step; the broker refuses the transaction's offsets once that generation has moved on. Taking
the generation later (when sending) let a commit that ran across a rebalance land in the new
generation after the partition's next owner had read the commit point before it: the item was
played twice and both copies committed (seen in CI).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from asearcher.streams.cluster.admin import committed_offsets
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.consumer import (
    CONSUMER_DEFAULTS,
    LoopStats,
    RecordDecoder,
    raise_if_fatal,
)
from asearcher.streams.io.done_marks import PartitionProgress
from asearcher.streams.io.played import PlayedRequests
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.service.log import get_logger
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import Event
from asearcher.streams.wire.records import Outgoing, Record

log = get_logger(__name__)

# What the broker answers a transaction's offsets sent under a generation that has moved on.
NOT_THE_OWNER = frozenset({
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError.FENCED_INSTANCE_ID,
    KafkaError.REBALANCE_IN_PROGRESS,
})  # fmt: skip
Revoked = Callable[[list[int]], None]
# Says why an event cannot be worked on (it goes to the dead-letter topic), or None.
Validate = Callable[[Event], str | None]


def static_member(prefix: str, instance: str | None) -> dict[str, str]:
    """Consumer settings for Kafka static membership under a stable instance name.

    A member restarted under the same `group.instance.id` takes its partitions back at once,
    without a rebalance and without waiting for the session timeout of its crashed
    predecessor. Without an instance name the member is dynamic (nothing to add).
    """
    return {"group.instance.id": f"{prefix}-{instance}"} if instance else {}


class OutOfOrderIntake:
    """Hands out records of `topic`; commits each one's outputs and offset in one transaction.

    A record commits only under the assignment that handed it out; `keeps_records` lifts that
    for a sole consumer that holds records across a rebalance and ignores copies fetched again.
    """

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
        played: PlayedRequests | None = None,
        keeps_records: bool = False,
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
        self.played = played  # None: every record is handed out, copies included
        # A sole consumer (the trainer) keeps what it holds across a rebalance and ignores the
        # copies fetched again; any other holder's records die with their assignment.
        self._keeps_records = keeps_records
        self._handed_out: dict[int, set[int]] = {}  # partition -> ids of records handed out
        self._paused = False
        self._closing = False
        self._state = threading.Lock()  # progress: the polling thread vs the committing one
        self._committing = threading.Lock()  # one transaction at a time
        self.kafka.subscribe([topic], on_assign=self._assigned, on_revoke=self._revoked)

    @staticmethod
    def transactional_id(prefix: str, instance: str | None) -> str:
        """A stable id per instance (restarting it fences its dead predecessor at once)."""
        return f"{prefix}-{instance or uuid.uuid4().hex[:12]}"

    def poll(self, max_records: int) -> list[Record]:
        """Up to `max_records` new records, without waiting; finished ones are skipped.

        Call it often, also while paused: polling serves rebalances and keeps this member in
        the group (a record that was already on its way when pausing is still returned).
        """
        messages = self.kafka.consume(max_records, 0) if max_records > 0 else []
        if not messages:
            message = self.kafka.poll(0)
            messages = [] if message is None else [message]
        records = []
        for message in messages:
            with self._state:
                record = self._accept(message)
            if record is not None:
                records.append(record)
        return records

    @property
    def paused(self) -> bool:
        """Whether fetching is stopped (`set_paused`)."""
        return self._paused

    def set_paused(self, paused: bool) -> None:
        """Stop or resume fetching (while busy, so records wait in Kafka, not in memory)."""
        if paused != self._paused:
            self._paused = paused
            self._apply_pause(list(self.progress))

    def _apply_pause(self, partitions: list[int]) -> None:
        # Explicit either way: a pause librdkafka kept across a rebalance must not linger.
        if partitions:
            where = [TopicPartition(self.topic, p) for p in partitions]
            (self.kafka.pause if self._paused else self.kafka.resume)(where)

    def commit(self, outputs: Iterable[Outgoing], done: list[Record], played: bool = False) -> bool:
        """Send `outputs` and mark `done` finished, atomically; False (nothing sent) if a
        partition of `done` is no longer ours, also when it moves while the transaction runs.
        Aborts and raises on any other failed transaction.
        `played`: `done` were played, so later copies of them are not (with `PlayedRequests`).

        Commits run one at a time, and the commit points are computed inside, from the
        progress of earlier successful commits only: a failed commit never marks anything done.
        """
        with self._committing:
            with self._state:
                if not all(self._ours(record) for record in done):
                    return False
                finished = self._by_partition(done)
                member = self.kafka.consumer_group_metadata()  # the generation that owns them
                points = {
                    partition: progress.commit_point(finished.get(partition, set()))
                    for partition, progress in self.progress.items()
                }
            offsets = [
                TopicPartition(self.topic, partition, offset, metadata=metadata)
                for partition, (offset, metadata) in sorted(points.items())
            ]
            if played and self.played is not None:
                outputs = [*outputs, *self.played.markers(done)]
            if not self._transaction(outputs, offsets, member):
                return False
            with self._state:
                for partition, (offset, _) in points.items():
                    if partition in self.progress:
                        self.progress[partition].advance(finished.get(partition, set()), offset)
                if self.played is not None:
                    self.played.settled(done, played)
                for record in done:
                    self._handed_out.get(record.partition, set()).discard(id(record))
        self.stats.handled += 1
        return True

    def _ours(self, record: Record) -> bool:
        """Whether `record` was handed out under its partition's current assignment. One kept
        from an earlier one must not commit: in between, another member may have played it
        (seen in CI: a revoked request kept waiting, started after the partition came back)."""
        handed_out = self._handed_out.get(record.partition)
        if handed_out is None or record.partition not in self.progress:
            return False
        return self._keeps_records or id(record) in handed_out

    @staticmethod
    def _by_partition(records: list[Record]) -> dict[int, set[int]]:
        grouped: dict[int, set[int]] = {}
        for record in records:
            grouped.setdefault(record.partition, set()).add(record.offset)
        return grouped

    def _transaction(
        self, outputs: Iterable[Outgoing], offsets: list[TopicPartition], member: object
    ) -> bool:
        """Commit `outputs` with `offsets` under `member`'s generation; False (aborted) if the
        broker says that generation no longer owns them."""
        try:
            with self.outputs.transaction():
                for out in outputs:
                    self.outputs.send(out.topic, out.event, key=out.key)
                self.outputs.send_offsets(offsets, member)
        except KafkaException as exc:
            error = exc.args[0]
            if not isinstance(error, KafkaError) or error.code() not in NOT_THE_OWNER:
                raise
            log.info("commit aborted: the partitions moved while it ran (%s)", error.str())
            return False
        return True

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
        if self.played is not None and self.played.is_copy(record):
            # Finished unplayed: the copy played (or playing) keeps its own offset open.
            log.warning("%s repeats a request already played or playing: not played again "
                        "(%d copies so far)", record.origin, self.played.duplicates)  # fmt: skip
            progress.finish(record.offset)
            return None
        # Live records have distinct ids: one kept from an earlier assignment never matches.
        self._handed_out[record.partition].add(id(record))
        return record

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._closing:  # an assignment served by close(): nothing will be worked on
            consumer.assign(partitions)
            return
        committed = committed_offsets(consumer, partitions)
        if self.played is not None:
            # After the committed offsets: those are stable only once the previous owner's
            # transactions are settled, its markers with them.
            self.played.load(tp.partition for tp in partitions)
        with self._state:
            for tp in committed:
                self.progress[tp.partition] = PartitionProgress(tp.offset, tp.metadata)
                self._handed_out[tp.partition] = set()
                done = len(self.progress[tp.partition].done)
                log.info("assigned %s[%d] from offset %d (%d done above it)", tp.topic,
                         tp.partition, tp.offset, done)  # fmt: skip
        consumer.assign(partitions)
        self._apply_pause([tp.partition for tp in partitions])

    def _revoked(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Never wait here for a commit under way: the broker keeps a transaction's offsets
        # waiting while the group rebalances, and the rebalance waits for this callback (tried:
        # the transaction hung until it timed out). The generation taken with a commit's check
        # is what keeps a late one out.
        numbers = [tp.partition for tp in partitions]
        with self._state:
            for number in numbers:
                self.progress.pop(number, None)
                self._handed_out.pop(number, None)
            if self.played is not None:
                self.played.forget(numbers)
        log.info("revoked %s partitions %s", self.topic, numbers)
        if self._on_revoked is not None:
            self._on_revoked(numbers)

    def close(self) -> None:
        """Leave the group (unfinished records go to other members) and flush dead letters."""
        self._closing = True
        self.kafka.poll(0)  # serve a pending assignment while the client can still answer
        self.kafka.close()
        self.decoder.dead_letters.close()
        self.outputs.close()
