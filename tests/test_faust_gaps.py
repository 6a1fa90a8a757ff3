"""faust's committer steps over transaction markers in one commit, and never over a record
still being processed (streams/service/faust_gaps.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from faust.types import TP

from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.service import faust_gaps
from asearcher.streams.service.faust_app import make_app

TOPIC_PARTITION = TP("eval.trajectories", 0)


def _consumer(tmp_path: Path):
    # No broker is contacted: the consumer is built, never started.
    settings = KafkaSettings(bootstrap_servers="127.0.0.1:1")
    return make_app("gaps", settings, tmp_path, replicas=1).consumer


async def _arrive(consumer, offsets: list[int], acked: set[int], read_from: int) -> None:
    """Records at `offsets` arrive as faust's fetch loop hands them on (noting what it skipped
    before each); those in `acked` are then acked."""
    last_read = read_from - 1
    for offset in offsets:
        if offset - last_read > 1 and last_read:
            await consumer._add_gap(TOPIC_PARTITION, last_read + 1, offset)
        last_read = offset
    for offset in sorted(acked):
        consumer._acked[TOPIC_PARTITION].append(offset)
        consumer._acked_index[TOPIC_PARTITION].add(offset)


def test_one_commit_steps_over_every_transaction_marker(tmp_path: Path) -> None:
    assert faust_gaps.installed()
    consumer = _consumer(tmp_path)
    consumer._committed_offset[TOPIC_PARTITION] = 10
    records = list(range(10, 50, 2))  # each in its own transaction: a marker after each
    asyncio.run(_arrive(consumer, records, set(records), read_from=10))
    # Unpatched, faust commits 13 here (one record), then a record or two per commit.
    assert consumer._new_offset(TOPIC_PARTITION) == records[-1] + 1
    assert list(consumer._acked[TOPIC_PARTITION]) == []


def test_a_record_still_in_flight_is_not_committed_over(tmp_path: Path) -> None:
    consumer = _consumer(tmp_path)
    consumer._committed_offset[TOPIC_PARTITION] = 10
    records = [10, 12, 14, 16, 18, 20]
    asyncio.run(_arrive(consumer, records, set(records) - {16}, read_from=10))
    assert consumer._new_offset(TOPIC_PARTITION) == 16  # the next to read is the one in flight
    consumer._committed_offset[TOPIC_PARTITION] = 16  # as faust's commit of 16 notes it
    asyncio.run(_arrive(consumer, [], {16}, read_from=21))
    assert consumer._new_offset(TOPIC_PARTITION) == 21
