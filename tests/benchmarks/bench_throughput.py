"""Produce + consume throughput through the local broker, msgpack against json, in one run.

One producer process encodes and sends pre-built events; one consumer process decodes them into
typed events in the project's `EventConsumer` loop. The figure is end to end: from the first
send to the last event handled. MB are 10^6 bytes of record values before compression.

Every configuration runs twice, the second round in reverse order, and the better round is
reported, so a warming broker or a noisy neighbour does not decide a ratio. Besides the wire
formats, the small-event case also runs with lz4 and without compression (the producer default
is zstd) to show what compression costs on two cores, and with its token ids and log-probs as
plain arrays instead of packed ones (how `GenerationStep` was written before schema version 2).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import pytest
import roles
from harness import Children, show_table, write_results

from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.producer import PRODUCER_DEFAULTS
from asearcher.streams.wire.codec import EventCodec, WireFormat

pytestmark = pytest.mark.benchmark

TARGET_SMALL_EVENTS_PER_S = 50_000
LIBRDKAFKA_MESSAGE_MAX_BYTES = 1_000_000
ROUNDS = 2


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str
    tokens: int
    count: int
    distinct: int
    like_topic: str


SMALL = Scenario("small", "GenerationStep", 256, 100_000, 1_000, "rollout.steps")
BIG = Scenario("big", "TrajectoryFinished", 16_384, 2_000, 32, "trajectories")
# A ~250-byte event (the size of a tool call): what the bus itself carries when the payload is tiny.
TINY = Scenario("tiny", "GenerationStep", 8, 200_000, 1_000, "rollout.steps")


@dataclass(frozen=True)
class Config:
    scenario: Scenario
    wire_format: WireFormat
    compression: str = str(PRODUCER_DEFAULTS["compression.type"])
    packed: bool = True  # number arrays packed (schema version 2), or plain arrays as before

    @property
    def label(self) -> str:
        plain = "" if self.packed else "/plain"
        return f"{self.scenario.name}/{self.wire_format}/{self.compression}{plain}"


CONFIGS = (
    Config(SMALL, "msgpack"),
    Config(SMALL, "json"),
    Config(BIG, "msgpack"),
    Config(BIG, "json"),
    Config(SMALL, "msgpack", "lz4"),
    Config(SMALL, "msgpack", "none"),
    Config(TINY, "msgpack"),
    Config(SMALL, "msgpack", packed=False),
)


def largest_encoding(scenario: Scenario, wire_format: WireFormat) -> int:
    pool = roles.event_pool(scenario.kind, scenario.tokens, distinct=4, seed=random.randrange(99))
    codec = EventCodec(wire_format=wire_format)
    return max(len(codec.encode(event)[0]) for event in pool)


def run_once(
    settings: KafkaSettings, topic: str, warmup_topic: str, config: Config
) -> dict[str, Any]:
    """One producer and one consumer process over a fresh topic; their measurements combined."""
    scenario = config.scenario
    with Children() as children:
        consumer_ready, producer_ready, go = children.event(), children.event(), children.event()
        children.start(
            "consumer", roles.consume, settings=settings, topic=topic, kind=scenario.kind,
            tokens=scenario.tokens, count=scenario.count, ready=consumer_ready, timeout=240.0,
        )  # fmt: skip
        children.start(
            "producer", roles.produce, settings=settings, topic=topic,
            wire_format=config.wire_format, kind=scenario.kind, tokens=scenario.tokens,
            distinct=scenario.distinct, count=scenario.count,
            producer_config={"compression.type": config.compression}, warmup_topic=warmup_topic,
            ready=producer_ready, go=go, packed=config.packed,
        )  # fmt: skip
        children.wait([consumer_ready, producer_ready])
        go.set()
        reports = children.gather(timeout=300.0)
    return summarise(config, reports["producer"], reports["consumer"])


def summarise(config: Config, produced: dict[str, Any], consumed: dict[str, Any]) -> dict[str, Any]:
    count = config.scenario.count
    elapsed = consumed["last"] - produced["started"]
    return {
        "config": config.label,
        "event": config.scenario.kind,
        "tokens": config.scenario.tokens,
        "wire_format": config.wire_format,
        "compression": config.compression,
        "packed": config.packed,
        "events": count,
        "delivered": produced["delivered"],
        "handled": consumed["handled"],
        "dead_lettered": consumed["dead_lettered"],
        "malformed": consumed["malformed"],
        "bytes_per_event": produced["bytes"] / count,
        "max_event_bytes": produced["max_event_bytes"],
        "seconds": elapsed,
        "events_per_s": count / elapsed,
        "mb_per_s": produced["bytes"] / elapsed / 1e6,
        "produce_events_per_s": count / (produced["flushed"] - produced["started"]),
        "consume_events_per_s": count / (consumed["last"] - consumed["first"]),
    }


def run_rounds(
    settings: KafkaSettings, make_topic: Callable[..., str]
) -> dict[str, list[dict[str, Any]]]:
    """Every configuration `ROUNDS` times, alternating the order; results by config label."""
    warmup_topic = make_topic()
    rounds: dict[str, list[dict[str, Any]]] = {config.label: [] for config in CONFIGS}
    for index in range(ROUNDS):
        order = CONFIGS if index % 2 == 0 else tuple(reversed(CONFIGS))
        for config in order:
            topic = make_topic(like=config.scenario.like_topic)
            rounds[config.label].append(run_once(settings, topic, warmup_topic, config))
    return rounds


def best(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return {label: max(runs, key=lambda run: run["events_per_s"]) for label, runs in rounds.items()}


def ratios(best_runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """End-to-end events/s of one configuration over another, from the best rounds."""
    rate = {label: run["events_per_s"] for label, run in best_runs.items()}
    return {
        "small_msgpack_over_json": rate["small/msgpack/zstd"] / rate["small/json/zstd"],
        "big_msgpack_over_json": rate["big/msgpack/zstd"] / rate["big/json/zstd"],
        "small_msgpack_lz4_over_zstd": rate["small/msgpack/lz4"] / rate["small/msgpack/zstd"],
        "small_msgpack_none_over_zstd": rate["small/msgpack/none"] / rate["small/msgpack/zstd"],
        "tiny_over_small_msgpack": rate["tiny/msgpack/zstd"] / rate["small/msgpack/zstd"],
        "small_packed_over_plain": rate["small/msgpack/zstd"] / rate["small/msgpack/zstd/plain"],
    }


def report(rounds: dict[str, list[dict[str, Any]]], best_runs: dict[str, dict[str, Any]]) -> None:
    rows = [
        (
            run["event"], run["tokens"], run["wire_format"] + ("" if run["packed"] else ", plain"),
            run["compression"],
            f"{run['bytes_per_event']:,.0f}", f"{run['events']:,}", f"{run['seconds']:.2f}",
            f"{run['events_per_s']:,.0f}", f"{run['mb_per_s']:,.1f}",
            f"{run['produce_events_per_s']:,.0f}", f"{run['consume_events_per_s']:,.0f}",
            " / ".join(f"{r['events_per_s']:,.0f}" for r in rounds[label]),
        )
        for label, run in best_runs.items()
    ]  # fmt: skip
    columns = (
        "event", "tokens", "format", "compression", "bytes/event", "events", "seconds",
        "end-to-end ev/s", "MB/s", "produce ev/s", "consume ev/s", "ev/s per round",
    )  # fmt: skip
    show_table("Throughput: 1 producer process -> broker -> 1 consumer process", columns, rows)


def verdict(best_runs: dict[str, dict[str, Any]], ratio: dict[str, float]) -> str:
    ratios_text = ", ".join(f"{name} {value:.2f}x" for name, value in ratio.items())
    verdicts = []
    for label in ("small/msgpack/zstd", "tiny/msgpack/zstd"):
        rate = best_runs[label]["events_per_s"]
        met = "meets" if rate >= TARGET_SMALL_EVENTS_PER_S else "misses"
        verdicts.append(f"{label} {rate:,.0f} ({met})")
    return (
        f"target >= {TARGET_SMALL_EVENTS_PER_S:,} events/s with the producer defaults: "
        f"{'; '.join(verdicts)}; {ratios_text}"
    )


@pytest.mark.timeout(900)
def test_throughput(settings: KafkaSettings, make_topic: Callable[..., str]) -> None:
    for scenario in (SMALL, BIG, TINY):
        for wire_format in ("msgpack", "json"):
            assert largest_encoding(scenario, wire_format) < LIBRDKAFKA_MESSAGE_MAX_BYTES
    rounds = run_rounds(settings, make_topic)
    best_runs = best(rounds)
    ratio = ratios(best_runs)
    report(rounds, best_runs)
    print(verdict(best_runs, ratio))
    write_results(
        "throughput",
        {
            "scenarios": [asdict(SMALL), asdict(BIG), asdict(TINY)],
            "rounds": ROUNDS,
            "target_small_events_per_s": TARGET_SMALL_EVENTS_PER_S,
            "producer_config": {**PRODUCER_DEFAULTS, "compression.type": "per run"},
            "consumer_config": "EventConsumer defaults",
            "best": best_runs,
            "all_rounds": rounds,
            "ratios": ratio,
        },
    )
    for runs in rounds.values():
        for run in runs:
            assert run["handled"] == run["events"] == run["delivered"]
            assert run["dead_lettered"] == run["malformed"] == 0
