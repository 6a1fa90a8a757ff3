"""Request/response latency over Kafka on the tool-call path.

This process sends a `ToolCallRequested` to a request topic; a responder process consuming it
with `EventConsumer` sends a `ToolResultReady` to a reply topic, which this process consumes with
its own `EventConsumer` (`run(max_messages=1)`). One call is in flight at a time. The clock starts
before the request is encoded and stops when the decoded reply reaches the handler.

The client-settings variants run side by side in one session: the project's defaults, and the
producer's `LOW_LATENCY` settings meant for request/response paths.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import roles
from harness import Children, clock, percentile, show_table, wait_for_assignment, write_results

from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.consumer import CONSUMER_DEFAULTS, EventConsumer
from asearcher.streams.io.producer import LOW_LATENCY, PRODUCER_DEFAULTS, EventProducer
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import Event, ToolCallRequested, ToolResultReady
from asearcher.streams.wire.records import Record

pytestmark = pytest.mark.benchmark

WARMUP = 200
ROUND_TRIPS = 2_000
TARGET_P50_MS = 5.0
TARGET_P99_MS = 25.0
REPLY_TIMEOUT_S = 10.0
RUN_BATCH_DEFAULT = 500


@dataclass(frozen=True)
class Variant:
    name: str
    batch_size: int = 1
    producer: dict[str, Any] = field(default_factory=dict)
    consumer: dict[str, Any] = field(default_factory=dict)
    warmup: int = WARMUP
    round_trips: int = ROUND_TRIPS


LOW_LATENCY_CONSUMER = {"fetch.wait.max.ms": 5, "socket.nagle.disable": True}
VARIANTS = (
    Variant("project defaults", batch_size=RUN_BATCH_DEFAULT),
    Variant("LOW_LATENCY producer", batch_size=RUN_BATCH_DEFAULT, producer=LOW_LATENCY),
    Variant(
        "LOW_LATENCY producer, fetch.wait.max.ms=5",
        batch_size=RUN_BATCH_DEFAULT,
        producer=LOW_LATENCY,
        consumer=LOW_LATENCY_CONSUMER,
    ),
)


class Inbox:
    """A handler keeping the one reply it was given and when it arrived."""

    def __init__(self) -> None:
        self.event: Event | None = None
        self.arrived = 0.0

    def __call__(self, record: Record) -> None:
        self.arrived = clock()
        self.event = record.event


def round_trip(producer: EventProducer, replies: EventConsumer, topic: str, index: int) -> float:
    """Seconds from sending one tool call to handling its result."""
    call = ToolCallRequested(
        call_id=f"call-{index}",
        trajectory_id=f"trajectory-{index % 64}",
        tool="search",
        arguments={"query": f"who founded company {index}"},
    )
    inbox = Inbox()
    sent = clock()
    producer.send(topic, call)
    replies.run(inbox, max_messages=1, timeout=REPLY_TIMEOUT_S)
    reply = inbox.event
    if not isinstance(reply, ToolResultReady) or reply.call_id != call.call_id:
        raise AssertionError(f"call {call.call_id} got {reply!r} instead of its result")
    return inbox.arrived - sent


def measure(
    settings: KafkaSettings, make_topic: Callable[..., str], variant: Variant
) -> list[float]:
    """Round-trip seconds after the warm-up, over fresh request and reply topics."""
    requests, replies = make_topic(like="tool.calls"), make_topic(like="tool.results")
    total = variant.warmup + variant.round_trips
    codec = EventCodec()
    with Children() as children:
        ready = children.event()
        children.start(
            "responder", roles.respond, settings=settings, requests=requests, replies=replies,
            producer_config=variant.producer, consumer_config=variant.consumer, count=total,
            batch_size=variant.batch_size, ready=ready, timeout=300.0,
        )  # fmt: skip
        group = f"bench-agent-{uuid.uuid4().hex[:8]}"
        with (
            EventProducer(settings, codec, **variant.producer) as producer,
            EventConsumer(settings, group, [replies], codec, **variant.consumer) as inbox,
        ):
            producer.kafka.list_topics(requests, timeout=30)
            wait_for_assignment(inbox.kafka)
            children.wait([ready])
            seconds = [round_trip(producer, inbox, requests, index) for index in range(total)]
        report = children.gather(timeout=60.0)["responder"]
    assert report["handled"] == total and report["dead_lettered"] == 0
    return seconds[variant.warmup :]


def summary(variant: Variant, seconds: list[float]) -> dict[str, Any]:
    ordered = sorted(value * 1000 for value in seconds)
    p50, p99 = percentile(ordered, 50), percentile(ordered, 99)
    return {
        "variant": variant.name,
        "responder_run_batch_size": variant.batch_size,
        "warmup_round_trips": variant.warmup,
        "producer_config": {**PRODUCER_DEFAULTS, **variant.producer},
        "consumer_config": {**CONSUMER_DEFAULTS, **variant.consumer},
        "round_trips": len(ordered),
        "mean_ms": sum(ordered) / len(ordered),
        "p50_ms": p50,
        "p95_ms": percentile(ordered, 95),
        "p99_ms": p99,
        "max_ms": ordered[-1],
        "meets_p50_target": p50 <= TARGET_P50_MS,
        "meets_p99_target": p99 <= TARGET_P99_MS,
    }


def report(results: list[dict[str, Any]]) -> None:
    def settings_text(result: dict[str, Any]) -> str:
        producer, consumer = result["producer_config"], result["consumer_config"]
        return (
            f"batch={result['responder_run_batch_size']} linger={producer['linger.ms']} "
            f"fetch.wait={consumer.get('fetch.wait.max.ms', '500*')} "
            f"nagle={'off' if producer.get('socket.nagle.disable') else 'on'}"
        )

    rows = [
        (
            result["variant"], settings_text(result), result["round_trips"],
            *(f"{result[key]:.2f}" for key in ("p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms")),
            "yes" if result["meets_p50_target"] and result["meets_p99_target"] else "no",
        )
        for result in results
    ]  # fmt: skip
    columns = (
        "variant", "settings", "n", "p50 ms", "p95 ms", "p99 ms", "max ms", "mean ms",
        f"p50<={TARGET_P50_MS:g} & p99<={TARGET_P99_MS:g}",
    )  # fmt: skip
    show_table("Tool-call round trip: request -> responder process -> reply", columns, rows)
    print("batch = responder's EventConsumer.run batch_size; * librdkafka default")


@pytest.mark.timeout(900)
def test_roundtrip(settings: KafkaSettings, make_topic: Callable[..., str]) -> None:
    results = [summary(variant, measure(settings, make_topic, variant)) for variant in VARIANTS]
    report(results)
    write_results(
        "roundtrip",
        {
            "targets_ms": {"p50": TARGET_P50_MS, "p99": TARGET_P99_MS},
            "reply_text_chars": len(roles.TOOL_TEXT),
            "variants": results,
        },
    )
