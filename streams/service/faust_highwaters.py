"""A fix for how faust-streaming (0.15.3) learns where a changelog ends, installed for every app.

To rebuild a table, faust's recovery reads each changelog partition up to its highwater. Under
exactly-once processing it takes that highwater from the last stable offset its aiokafka
consumer cached from the last fetch of the partition; right after an assignment no fetch has
come back yet, the cache holds None, and faust reads it as an empty changelog. The restarted
processor then starts with empty tables and answers nothing about the evaluations it was
gathering (robinhood/faust#658, robinhood/aiokafka#7); whether a fetch came first is a race,
lost on a loaded machine (seen in CI: a killed evaluation processor restarted with highwater
-1 on the changelog partition that held its tally, and never published the result).

The fix asks the broker: a ListOffsets request at the consumer's isolation level, which under
exactly-once (read_committed) answers the last stable offset, and otherwise the end offset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.types import TP

_faust_highwaters = AIOKafkaConsumerThread._highwaters


async def _highwaters_from_broker(
    self: AIOKafkaConsumerThread, partitions: list[TP]
) -> Mapping[TP, int]:
    consumer = self._ensure_consumer()
    return cast(Mapping[TP, int], await consumer.end_offsets(partitions))


def install() -> None:
    """Make every faust consumer ask the broker where its changelogs end (idempotent)."""
    AIOKafkaConsumerThread._highwaters = _highwaters_from_broker  # type: ignore[method-assign]


def installed() -> bool:
    """Whether `install` is in effect."""
    return AIOKafkaConsumerThread._highwaters is _highwaters_from_broker
