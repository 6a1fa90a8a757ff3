"""The one producer every service uses: idempotent, compressed, typed, with delivery reports."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.service.log import get_logger
from asearcher.streams.service.watchdog import exit_if_stuck
from asearcher.streams.wire.codec import EventCodec, Headers
from asearcher.streams.wire.events import Event
from asearcher.streams.wire.topics import record_key

log = get_logger(__name__)
# What librdkafka reports for the records an aborted transaction drops.
_ABORTED = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)

PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "compression.type": "zstd",
    "linger.ms": 5,
}

# For request/response paths (tool calls): send at once instead of waiting to fill a batch.
LOW_LATENCY: dict[str, Any] = {"linger.ms": 0, "socket.nagle.disable": True}
# librdkafka's transaction calls wait forever by default, and a broker killed mid-transaction
# can leave them waiting after it is back (measured: a trainer blocked for good in
# send_offsets_to_transaction). Bounded, the call raises and the service exits; where the
# library ignores the bound, a watchdog exits the process (`watchdog.py`). Either way the
# restart resolves the transaction by fencing: nothing is lost or counted twice.
TRANSACTION_CALL_TIMEOUT_S = 30.0
STUCK_AFTER_S = 2 * TRANSACTION_CALL_TIMEOUT_S


class DeliveryError(Exception):
    """At least one record was not acknowledged by the cluster."""


class EventProducer:
    """Sends events with keys from the topic spec; `flush()` raises if any delivery failed."""

    def __init__(
        self,
        settings: KafkaSettings,
        codec: EventCodec,
        *,
        transactional_id: str | None = None,
        **config: Any,
    ) -> None:
        overrides = {**PRODUCER_DEFAULTS, **config}
        if transactional_id:
            overrides["transactional.id"] = transactional_id
        self.codec = codec
        self.kafka = Producer(settings.client(**overrides))
        self.delivered = 0
        self._failures: list[str] = []

    def send(
        self, topic: str, event: Event, *, key: str | None = None, headers: Headers | None = None
    ) -> None:
        """Queue `event` for `topic`; the key defaults to the one the topic specs derive."""
        value, event_headers = self.codec.encode(event)
        key = key if key is not None else record_key(topic, event)
        self.send_raw(topic, value, key=key, headers=event_headers + list(headers or []))

    def send_raw(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: str | bytes | None = None,
        headers: Headers | None = None,
    ) -> None:
        """Queue already-encoded bytes (dead letters, re-drives)."""
        while True:
            try:
                self.kafka.produce(
                    topic, value=value, key=key, headers=headers, on_delivery=self._on_delivery
                )
                break
            except BufferError:
                # The local queue is full: serve delivery reports until there is room.
                self.kafka.poll(0.1)
        self.kafka.poll(0)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """What is sent inside goes out in one transaction, committed at the end or aborted if
        anything raises (a transactional producer only). Raises when the commit fails or takes
        longer than `TRANSACTION_CALL_TIMEOUT_S`."""
        self.kafka.begin_transaction()
        try:
            yield
            with exit_if_stuck("commit_transaction", STUCK_AFTER_S):
                self.kafka.commit_transaction(TRANSACTION_CALL_TIMEOUT_S)
            self.raise_failures()
        except BaseException:
            try:
                with exit_if_stuck("abort_transaction", STUCK_AFTER_S):
                    self.kafka.abort_transaction(TRANSACTION_CALL_TIMEOUT_S)
            except KafkaException as exc:
                log.error("could not abort the transaction: %s", exc)
            raise

    def send_offsets(self, offsets: list[TopicPartition], group_metadata: Any) -> None:
        """Make consumed `offsets` part of the open transaction, bounded like the commit."""
        with exit_if_stuck("send_offsets_to_transaction", STUCK_AFTER_S):
            self.kafka.send_offsets_to_transaction(
                offsets, group_metadata, TRANSACTION_CALL_TIMEOUT_S
            )

    def flush(self, timeout: float = 60.0) -> None:
        """Wait for every queued record; raise `DeliveryError` naming the first failure."""
        remaining = self.kafka.flush(timeout)
        if remaining:
            raise DeliveryError(f"{remaining} records still undelivered after {timeout:.0f}s")
        self.raise_failures()

    def raise_failures(self) -> None:
        """Raise `DeliveryError` if a delivery report said a record was lost."""
        if self._failures:
            first, count = self._failures[0], len(self._failures)
            self._failures.clear()
            raise DeliveryError(f"{count} records failed; first: {first}")

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.delivered += 1
            return
        if err.code() in _ABORTED:
            # Dropped by an aborted transaction, which its caller knows of: reported later, at
            # the next poll, it must not fail the next transaction.
            return
        failure = f"{msg.topic()}[{msg.partition()}]: {err.str()}"
        log.error("delivery failed: %s", failure)
        self._failures.append(failure)

    def close(self, timeout: float = 60.0) -> None:
        """Deliver what is queued."""
        self.flush(timeout)

    def __enter__(self) -> EventProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
