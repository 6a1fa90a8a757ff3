"""Follow every partition of a topic in a background thread, outside any consumer group.

For readers that each need the whole topic rather than a share of it: a rollout producer
waiting for its tool results, a follower of the compacted `weights` topic. The start position is
resolved to explicit offsets before `start()` returns, so nothing written after it is missed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal

from confluent_kafka import Consumer, Message, TopicPartition

from asearcher.streams.cluster.admin import watermarks
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.consumer import (
    CONSUMER_DEFAULTS,
    LoopStats,
    RecordDecoder,
    next_batch,
    raise_if_fatal,
)
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.io.replay import bounded_reader, read_spans, topic_spans
from asearcher.streams.service.log import get_logger
from asearcher.streams.wire.codec import EventCodec, header_value
from asearcher.streams.wire.records import Record

log = get_logger(__name__)

StartAt = Literal["beginning", "end"]
BATCH = 500  # messages taken per poll at most
# What librdkafka may fetch ahead of the reader. Its defaults (64 MB queued, 50 MB a fetch) are
# for throughput; a follower reads whole topics of large records from their beginning, often
# in a busy process, and every restart would hold that much (bench_follow_memory.py).
PREFETCH_KB = 4096
LIBRDKAFKA_MESSAGE_MAX_BYTES = 1_000_000  # its default; fetch.max.bytes may not be below it


class _Follower:
    """Follows every partition of `topic` from `start_at` on, handing batches to `_handle`."""

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        start_at: StartAt,
        prefetch_kb: int | None = PREFETCH_KB,
    ) -> None:
        config: dict = {**CONSUMER_DEFAULTS, "enable.auto.commit": False}
        config.pop("enable.auto.offset.store", None)
        if prefetch_kb is not None:  # None: librdkafka's own (to compare against)
            # A fetch larger than one record still brings that record (KIP-74). A full queue
            # postpones the next fetch by fetch.queue.backoff.ms (1 s by default): a short
            # wait keeps a small queue from slowing the read down.
            config |= {"queued.max.messages.kbytes": prefetch_kb,
                       "fetch.max.bytes": max(prefetch_kb * 1024, LIBRDKAFKA_MESSAGE_MAX_BYTES),
                       "fetch.queue.backoff.ms": 20}  # fmt: skip
        # group.id is required by librdkafka even when partitions are assigned by hand.
        self.kafka = Consumer(settings.client(**{"group.id": f"tail-{topic}", **config}))
        self.topic, self.start_at = topic, start_at
        self.stats = LoopStats()
        self._stopping = threading.Event()
        self.caught_up = threading.Event()  # set once every record there at start was read
        self._targets: list[TopicPartition] = []
        self._thread = threading.Thread(target=self._loop, name=f"tail-{topic}", daemon=True)

    def start(self, timeout: float = 30.0) -> None:
        """Assign every partition at its start offset, then follow in the background (once)."""
        if self._thread.is_alive():
            return
        metadata = self.kafka.list_topics(self.topic, timeout=timeout).topics[self.topic]
        if metadata.error is not None:
            raise RuntimeError(f"cannot follow {self.topic}: {metadata.error.str()}")
        partitions = []
        for number in sorted(metadata.partitions):
            # Waits out a partition without a leader yet (seen in CI: a topic created moments ago).
            low, high = watermarks(self.kafka, TopicPartition(self.topic, number), timeout)
            offset = low if self.start_at == "beginning" else high
            partitions.append(TopicPartition(self.topic, number, offset))
            if high > offset:
                self._targets.append(TopicPartition(self.topic, number, high))
        self.kafka.assign(partitions)
        if not self._targets:
            self.caught_up.set()
        self._thread.start()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._handle(next_batch(self.kafka, BATCH))
            if not self.caught_up.is_set():
                self._check_caught_up()

    def _handle(self, messages: list[Message]) -> None:
        raise NotImplementedError

    def _check_caught_up(self) -> None:
        # Positions, not record offsets: transaction markers take offsets but are not records.
        positions = self.kafka.position(
            [TopicPartition(t.topic, t.partition) for t in self._targets]
        )
        if all(p.offset >= t.offset for p, t in zip(positions, self._targets, strict=True)):
            self.caught_up.set()

    def stop(self) -> None:
        """Stop following and close the consumer."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if not self._thread.is_alive():  # never close a consumer another thread still uses
            self.kafka.close()


class TopicTail(_Follower):
    """Calls `on_record` (in its own thread) for each record of `topic` from `start_at` on."""

    def __init__(
        self,
        settings: KafkaSettings,
        codec: EventCodec,
        topic: str,
        on_record: Callable[[Record], None],
        dead_letters: EventProducer,
        start_at: StartAt = "end",
        prefetch_kb: int | None = PREFETCH_KB,
    ) -> None:
        super().__init__(settings, topic, start_at, prefetch_kb)
        self.on_record = on_record
        self.decoder = RecordDecoder(codec, dead_letters)

    def _handle(self, messages: list[Message]) -> None:
        for record in self.decoder.decode_all(messages, self.stats):
            try:
                self.on_record(record)
            except Exception:  # a bad callback must not stop the tail for everyone
                log.exception("handling %s failed", record.origin)
            self.stats.handled += 1


class KeyTail(_Follower):
    """Calls `on_key(key, kind)` for each record of `topic`, never decoding a value.

    For followers that need only what the key says (which group a trajectory finished): reading
    a topic of large events from its beginning, decoding them would hold batches of them in
    memory for nothing (measured in `tests/benchmarks/bench_follow_memory.py`). `kind` is the
    record's kind header (None when it has none); records without a key are skipped.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        on_key: Callable[[str, str | None], None],
        start_at: StartAt = "end",
        prefetch_kb: int | None = PREFETCH_KB,
    ) -> None:
        super().__init__(settings, topic, start_at, prefetch_kb)
        self.on_key = on_key

    def _handle(self, messages: list[Message]) -> None:
        for message in messages:
            key = message.key()
            if raise_if_fatal(message) or key is None:
                continue
            try:
                self.on_key(key.decode("utf-8", "replace"), header_value(message.headers(), "kind"))
            except Exception:  # a bad callback must not stop the tail for everyone
                log.exception("handling %s[%s]@%s failed", self.topic, message.partition(),
                              message.offset())  # fmt: skip
            self.stats.handled += 1


def read_to_end(
    settings: KafkaSettings,
    codec: EventCodec,
    topic: str,
    *,
    dead_letters: EventProducer | None = None,
    timeout_s: float = 60.0,
) -> list[Record]:
    """Every committed record of `topic` from its beginning to its end now, in offset order per
    partition, outside any consumer group (a compacted topic's latest state, for instance).

    Raises RuntimeError (`ReadError`) when the topic cannot be read: callers must never mistake
    an unreadable topic for an empty one (a trainer would delete every version as unannounced),
    and TimeoutError after `timeout_s`. Undecodable records go to `dead_letters` (a fresh
    producer when None) before this returns.
    """
    consumer = bounded_reader(settings, f"read-{topic}")  # the group name ACLs grant
    try:
        messages = list(read_spans(consumer, topic_spans(consumer, topic), timeout_s=timeout_s))
    finally:
        consumer.close()
    letters = dead_letters or EventProducer(settings, codec)
    decoder = RecordDecoder(codec, letters)
    records = [record for m in messages if (record := decoder.decode(m)) is not None]
    letters.flush()  # what could not be decoded is set aside before going on without it
    return records
