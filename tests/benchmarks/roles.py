"""What the benchmark child processes run: a producer, a consumer and a tool responder.

Each role is a top-level function of keyword arguments returning a dict of measurements, so a
spawned process can import it by name (`harness.Children.start`).
"""

from __future__ import annotations

import random
import uuid
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

import msgspec
from harness import clock, wait_for_assignment

from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.consumer import EventConsumer
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.codec import EventCodec, WireFormat
from asearcher.streams.wire.events import (
    Event,
    GenerationStep,
    ToolCallRequested,
    ToolResultReady,
    TrajectoryFinished,
)
from asearcher.streams.wire.packed import as_list
from asearcher.streams.wire.records import Record
from tests.support import samples

TokenEvent = GenerationStep | TrajectoryFinished
KINDS: dict[str, type[TokenEvent]] = {
    "GenerationStep": GenerationStep,
    "TrajectoryFinished": TrajectoryFinished,
}
TOOL_TEXT = "[1] Avalon Inc. was founded in 1987 by J. Doe, who was born in Avalon. " * 14


def event_pool(kind: str, tokens: int, distinct: int, seed: int = 7) -> list[Event]:
    """`distinct` events of `kind` with `tokens` tokens each, cycled through by the producer."""
    rng = random.Random(seed)
    if kind == "GenerationStep":
        return [samples.generation_step(rng, tokens=tokens) for _ in range(distinct)]
    return [samples.trajectory(rng, tokens=tokens) for _ in range(distinct)]


class PlainArrayCodec(EventCodec):
    """Writes number arrays as plain arrays, as before packing (schema version 1's layout)."""

    def __init__(self, wire_format: WireFormat) -> None:
        super().__init__(wire_format=wire_format)
        encoder = msgspec.msgpack.Encoder if wire_format == "msgpack" else msgspec.json.Encoder
        self._encoder = encoder(enc_hook=as_list)


def encoded_bytes(sizes: list[int], count: int) -> int:
    """Total value bytes of `count` events cycling through events of `sizes` bytes."""
    rounds, rest = divmod(count, len(sizes))
    return rounds * sum(sizes) + sum(sizes[:rest])


def produce(
    *,
    settings: KafkaSettings,
    topic: str,
    wire_format: WireFormat,
    kind: str,
    tokens: int,
    distinct: int,
    count: int,
    producer_config: dict[str, Any],
    warmup_topic: str,
    ready: MpEvent,
    go: MpEvent,
    packed: bool = True,
) -> dict[str, Any]:
    """Send `count` events (encoded in the loop by the codec) as fast as the producer takes them;
    number arrays packed, or as plain arrays (`packed=False`)."""
    pool = event_pool(kind, tokens, distinct)
    codec = EventCodec(wire_format=wire_format) if packed else PlainArrayCodec(wire_format)
    sizes = [len(codec.encode(event)[0]) for event in pool]
    with EventProducer(settings, codec, **producer_config) as producer:
        producer.kafka.list_topics(topic, timeout=30)
        # The first delivery waits for the idempotent producer id: take that wait out of the timing.
        producer.send(warmup_topic, pool[0])
        producer.flush()
        warmup_deliveries = producer.delivered
        ready.set()
        go.wait()
        started = clock()
        for index in range(count):
            producer.send(topic, pool[index % distinct])
        queued = clock()
        producer.flush()
        flushed = clock()
        delivered = producer.delivered - warmup_deliveries
    return {
        "started": started,
        "queued": queued,
        "flushed": flushed,
        "delivered": delivered,
        "bytes": encoded_bytes(sizes, count),
        "max_event_bytes": max(sizes),
    }


class Tally:
    """A handler that counts typed events, checks their shape and notes first and last arrival."""

    def __init__(self, kind: type[TokenEvent], tokens: int) -> None:
        self.kind = kind
        self.tokens = tokens
        self.count = 0
        self.malformed = 0
        self.first = 0.0
        self.last = 0.0

    def __call__(self, record: Record) -> None:
        event = record.event
        if not isinstance(event, self.kind) or len(event.token_ids) != self.tokens:
            self.malformed += 1
        self.last = clock()
        if not self.count:
            self.first = self.last
        self.count += 1


def consume(
    *,
    settings: KafkaSettings,
    topic: str,
    kind: str,
    tokens: int,
    count: int,
    ready: MpEvent,
    timeout: float,
) -> dict[str, Any]:
    """Run the project's consume loop until `count` events were handled (or `timeout`)."""
    tally = Tally(KINDS[kind], tokens)
    group = f"bench-{uuid.uuid4().hex[:8]}"
    with EventConsumer(settings, group, [topic], EventCodec()) as consumer:
        wait_for_assignment(consumer.kafka)
        ready.set()
        stats = consumer.run(tally, max_messages=count, timeout=timeout)
    return {
        "handled": stats.handled,
        "dead_lettered": stats.dead_lettered,
        "malformed": tally.malformed,
        "first": tally.first,
        "last": tally.last,
    }


def respond(
    *,
    settings: KafkaSettings,
    requests: str,
    replies: str,
    producer_config: dict[str, Any],
    consumer_config: dict[str, Any],
    count: int,
    batch_size: int,
    ready: MpEvent,
    timeout: float,
) -> dict[str, Any]:
    """A tool service: answer each `ToolCallRequested` on `requests` with a `ToolResultReady`."""
    codec = EventCodec()
    group = f"bench-tools-{uuid.uuid4().hex[:8]}"
    with (
        EventProducer(settings, codec, **producer_config) as producer,
        EventConsumer(settings, group, [requests], codec, **consumer_config) as consumer,
    ):
        producer.kafka.list_topics(replies, timeout=30)
        wait_for_assignment(consumer.kafka)
        ready.set()

        def answer(record: Record) -> None:
            call = record.event
            if not isinstance(call, ToolCallRequested):
                raise TypeError(f"expected a ToolCallRequested, got {call.kind()}")
            reply = ToolResultReady(
                call_id=call.call_id,
                trajectory_id=call.trajectory_id,
                tool=call.tool,
                text=TOOL_TEXT,
            )
            producer.send(replies, reply)

        stats = consumer.run(answer, max_messages=count, timeout=timeout, batch_size=batch_size)
    return {"handled": stats.handled, "dead_lettered": stats.dead_lettered}
