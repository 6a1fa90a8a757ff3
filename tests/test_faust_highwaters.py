"""A restarted stream processor learns where its changelogs end from the broker, also before
its consumer fetched anything (streams/service/faust_highwaters.py)."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import Producer

from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.service import faust_app, faust_highwaters

COMMITTED, OPEN = 3, 2


def write_committed_then_open(settings: KafkaSettings, topic: str) -> Producer:
    """`COMMITTED` records in a committed transaction, then `OPEN` more in one left open (as
    a processor killed mid-transaction leaves them); the producer, to abort it afterwards."""
    producer = Producer(settings.client(**{"transactional.id": f"hw-{uuid.uuid4().hex[:8]}"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(COMMITTED):
        producer.produce(topic, key=b"k", value=f"committed {i}".encode(), partition=0)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(OPEN):
        producer.produce(topic, key=b"k", value=f"open {i}".encode(), partition=0)
    producer.flush(30)
    return producer


async def highwaters_read(settings: KafkaSettings, topic: str) -> tuple[object, object]:
    """faust's own reading and the fixed one, by a read_committed consumer (as under
    exactly-once) just assigned the partition, before any fetch."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers, isolation_level="read_committed",
        enable_auto_commit=False,
    )  # fmt: skip
    await consumer.start()
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    # What faust's consumer thread offers the two readings: its aiokafka consumer, in a transaction.
    thread = SimpleNamespace(
        _ensure_consumer=lambda: consumer, consumer=SimpleNamespace(in_transaction=True)
    )
    try:
        faust_reading = await faust_highwaters._faust_highwaters(thread, [partition])
        fixed_reading = await faust_highwaters._highwaters_from_broker(thread, [partition])
    finally:
        await consumer.stop()
    return faust_reading[partition], fixed_reading[partition]


def test_the_highwater_is_the_brokers_last_stable_offset_before_any_fetch(
    settings: KafkaSettings, make_topic
) -> None:
    assert faust_app.faust_highwaters.installed()
    topic = make_topic(partitions=1)
    producer = write_committed_then_open(settings, topic)
    try:
        faust_reading, fixed_reading = asyncio.run(highwaters_read(settings, topic))
    finally:
        producer.abort_transaction(30)
    # faust's own: nothing cached yet, which its recovery takes for an empty changelog.
    assert faust_reading is None
    # The broker's: past the committed records and their commit marker, short of the open ones.
    assert fixed_reading == COMMITTED + 1
