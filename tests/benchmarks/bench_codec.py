"""Codec speed and size on a 100k-token trajectory: the project codec against the stdlib.

`EventCodec` (msgspec) in msgpack and in json, and the standard library: `json.dumps` of
`msgspec.to_builtins` (compact separators) and `json.loads` rebuilt with `msgspec.convert`.
Batches of each operation alternate between codecs for several rounds; the median per-op time
is reported (garbage collection off inside a batch, as `timeit` does).
"""

from __future__ import annotations

import gc
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
from harness import show_table, write_results

from asearcher.streams.wire.codec import EventCodec, WireFormat
from asearcher.streams.wire.events import Event, TrajectoryFinished
from asearcher.streams.wire.topics import MAX_MESSAGE_BYTES
from tests.support import samples

pytestmark = pytest.mark.benchmark

TOKENS = 100_000
ROUNDS = 7
BATCH_SECONDS = 0.2
BASELINE = "msgspec msgpack"


@dataclass(frozen=True)
class Codec:
    name: str
    encode: Callable[[Event], bytes]
    decode: Callable[[bytes], Event]


def project_codec(name: str, wire_format: WireFormat) -> Codec:
    codec = EventCodec(wire_format=wire_format)
    headers = [("content-type", codec.content_type.encode())]
    kinds = (TrajectoryFinished,)
    return Codec(
        name,
        encode=lambda event: codec.encode(event)[0],
        decode=lambda value: codec.decode(value, headers, kinds),
    )


def stdlib_codec() -> Codec:
    return Codec(
        "stdlib json",
        encode=lambda event: json.dumps(msgspec.to_builtins(event), separators=(",", ":")).encode(),
        decode=lambda value: msgspec.convert(json.loads(value), TrajectoryFinished),
    )


CODECS = (
    project_codec(BASELINE, "msgpack"),
    project_codec("msgspec json", "json"),
    stdlib_codec(),
)


def zstd_compressor() -> Callable[[bytes], bytes] | None:
    """zstd at level 3 (librdkafka's default) if a zstd module is installed, else None."""
    try:
        import zstandard

        return zstandard.ZstdCompressor(level=3).compress
    except ImportError:
        pass
    try:
        from compression import zstd  # type: ignore[import-not-found]

        return lambda data: zstd.compress(data, level=3)
    except ImportError:
        return None


def time_batch(operation: Callable[[], object], count: int) -> float:
    """Seconds per call over `count` calls."""
    gc.disable()
    try:
        started = time.perf_counter()
        for _ in range(count):
            operation()
        return (time.perf_counter() - started) / count
    finally:
        gc.enable()


def batch_size(operation: Callable[[], object]) -> int:
    """How many calls take about `BATCH_SECONDS`."""
    return max(1, round(BATCH_SECONDS / time_batch(operation, 3)))


def operations(codec: Codec, event: Event) -> dict[str, Callable[[], object]]:
    encoded = codec.encode(event)
    return {
        "encode": lambda: codec.encode(event),
        "decode": lambda: codec.decode(encoded),
        "roundtrip": lambda: codec.decode(codec.encode(event)),
    }


def timings(event: Event) -> dict[str, dict[str, dict[str, float]]]:
    """Median and best µs per op for every codec and operation, measured in alternating rounds."""
    ops = {codec.name: operations(codec, event) for codec in CODECS}
    sizes = {(name, op): batch_size(fn) for name, by_op in ops.items() for op, fn in by_op.items()}
    samples_us: dict[tuple[str, str], list[float]] = {key: [] for key in sizes}
    for _ in range(ROUNDS):
        for (name, op), count in sizes.items():
            samples_us[name, op].append(time_batch(ops[name][op], count) * 1e6)
    return {
        name: {
            op: {
                "median_us": statistics.median(samples_us[name, op]),
                "best_us": min(samples_us[name, op]),
                "calls_per_batch": sizes[name, op],
            }
            for op in by_op
        }
        for name, by_op in ops.items()
    }


def sizes(event: Event, compress: Callable[[bytes], bytes] | None) -> dict[str, dict[str, Any]]:
    result = {}
    for codec in CODECS:
        encoded = codec.encode(event)
        assert codec.decode(encoded) == event, f"{codec.name} does not round-trip"
        result[codec.name] = {
            "bytes": len(encoded),
            "zstd_bytes": len(compress(encoded)) if compress else None,
            "fits_in_one_message": len(encoded) <= MAX_MESSAGE_BYTES,
        }
    return result


def ratios(times: dict[str, Any], size: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each codec against msgspec msgpack: how many times slower, how many times larger."""
    base_times, base_size = times[BASELINE], size[BASELINE]
    return {
        name: {
            **{
                f"{op}_time": times[name][op]["median_us"] / base_times[op]["median_us"]
                for op in times[name]
            },
            "size": size[name]["bytes"] / base_size["bytes"],
        }
        for name in times
    }


def report(times: dict[str, Any], size: dict[str, Any], ratio: dict[str, Any]) -> None:
    def kib(value: int | None) -> str:
        return "n/a (no zstd module)" if value is None else f"{value / 1024:,.0f}"

    rows = [
        (
            name,
            *(f"{times[name][op]['median_us']:,.0f}" for op in ("encode", "decode", "roundtrip")),
            f"{ratio[name]['roundtrip_time']:.2f}x", kib(size[name]["bytes"]),
            kib(size[name]["zstd_bytes"]), f"{ratio[name]['size']:.2f}x",
        )
        for name in times
    ]  # fmt: skip
    columns = (
        "codec", "encode µs", "decode µs", "encode+decode µs", "time vs msgpack", "KiB",
        "zstd KiB", "size vs msgpack",
    )  # fmt: skip
    title = f"Codec on one TrajectoryFinished of {TOKENS:,} tokens (median of {ROUNDS} rounds)"
    show_table(title, columns, rows)


@pytest.mark.timeout(600)
def test_codec() -> None:
    event = samples.trajectory(random.Random(11), tokens=TOKENS)
    size = sizes(event, zstd_compressor())
    times = timings(event)
    ratio = ratios(times, size)
    report(times, size, ratio)
    write_results(
        "codec",
        {
            "event": {"kind": event.kind(), "tokens": TOKENS},
            "rounds": ROUNDS,
            "batch_seconds": BATCH_SECONDS,
            "stdlib_json": "json.dumps(msgspec.to_builtins(e), separators=(',', ':')); "
            "msgspec.convert(json.loads(b), TrajectoryFinished)",
            "times": times,
            "sizes": size,
            "ratios_vs_msgspec_msgpack": ratio,
        },
    )
