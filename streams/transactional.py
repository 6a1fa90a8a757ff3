"""Consume-transform-produce with exactly-once results.

A batch of input records, the outputs computed from them and the input offsets are committed in
one Kafka transaction: readers with `isolation.level=read_committed` see every input's outputs
exactly once, even if a processor dies mid-batch. Restarting a processor under the same
`transactional_id` fences its dead predecessor and aborts its open transaction at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from asearcher.streams.codec import EventCodec
from asearcher.streams.consumer import (
    CONSUMER_DEFAULTS,
    LoopStats,
    RecordDecoder,
    StopCondition,
    next_batch,
)
from asearcher.streams.lifecycle import stop_on_signals
from asearcher.streams.log import get_logger
from asearcher.streams.producer import EventProducer
from asearcher.streams.records import Outgoing, Record
from asearcher.streams.settings import KafkaSettings

log = get_logger(__name__)

Transform = Callable[[Record], Iterable[Outgoing]]


class TransactionalProcessor:
    """Runs `transform` over input topics, committing outputs and offsets atomically."""

    def __init__(
        self,
        settings: KafkaSettings,
        group_id: str,
        input_topics: list[str],
        transactional_id: str,
        codec: EventCodec,
        *,
        consumer_config: dict[str, Any] | None = None,
        producer_config: dict[str, Any] | None = None,
    ) -> None:
        config = {**CONSUMER_DEFAULTS, "enable.auto.commit": False, **(consumer_config or {})}
        config.pop("enable.auto.offset.store", None)
        self.kafka = Consumer(settings.client(**{"group.id": group_id, **config}))
        self.producer = EventProducer(
            settings, codec, transactional_id=transactional_id, **(producer_config or {})
        )
        self.producer.kafka.init_transactions()
        self.kafka.subscribe(input_topics)
        # Dead letters go out in the same transaction as everything else.
        self.decoder = RecordDecoder(codec, self.producer)
        self._stop: StopCondition | None = None

    def stop(self) -> None:
        """Ask a running loop to finish the current batch and return (thread-safe)."""
        if self._stop is not None:
            self._stop.requested.set()

    def run(
        self,
        transform: Transform,
        *,
        max_messages: int | None = None,
        timeout: float | None = None,
        batch_size: int = 200,
    ) -> LoopStats:
        """Process batches until stopped, `max_messages` records, or `timeout` seconds."""
        stats = LoopStats()
        self._stop = until = StopCondition(max_messages, timeout)
        with stop_on_signals(self.stop):
            while not until.reached(stats):
                batch = next_batch(self.kafka, until.batch_limit(stats, batch_size))
                if batch:
                    self._process_batch(batch, transform, stats)
        return stats

    def _process_batch(self, batch: list, transform: Transform, stats: LoopStats) -> None:
        producer = self.producer.kafka
        producer.begin_transaction()
        batch_stats = LoopStats()
        try:
            for record in self.decoder.decode_all(batch, batch_stats):
                for out in transform(record):
                    self.producer.send(out.topic, out.event, key=out.key)
                batch_stats.handled += 1
            positions = self.kafka.position(self.kafka.assignment())
            producer.send_offsets_to_transaction(positions, self.kafka.consumer_group_metadata())
            producer.commit_transaction()
            self.producer.raise_failures()
        except BaseException:
            self._abort()
            raise
        stats.handled += batch_stats.handled
        stats.dead_lettered += batch_stats.dead_lettered

    def _abort(self) -> None:
        """Abort the open transaction and rewind to the committed offsets, so nothing is skipped."""
        try:
            self.producer.kafka.abort_transaction()
        except KafkaException as exc:
            log.error("could not abort transaction: %s", exc)
            return
        assignment = self.kafka.assignment()
        for tp in self.kafka.committed(assignment, timeout=10):
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            self.kafka.seek(TopicPartition(tp.topic, tp.partition, offset))

    def close(self) -> None:
        """Leave the group; committed transactions are already durable."""
        self.kafka.close()

    def __enter__(self) -> TransactionalProcessor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
