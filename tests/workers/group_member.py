"""A consumer-group member in its own process, so tests can SIGKILL or SIGTERM it.

Usage: group_member.py TOPIC GROUP OUT_FILE DELAY_S
Appends `partition event_id` per handled record to OUT_FILE; stops on SIGTERM.
"""

from __future__ import annotations

import os
import sys
import time

from asearcher.streams.cluster.settings import kafka_settings
from asearcher.streams.io.consumer import EventConsumer
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.records import Record


def main(topic: str, group: str, out_file: str, delay_s: str) -> None:
    settings = kafka_settings()
    out = open(out_file, "a", buffering=1)  # noqa: SIM115 - closed by process exit

    def handle(record: Record) -> None:
        time.sleep(float(delay_s))
        out.write(f"{record.partition} {record.event.event_id}\n")

    consumer = EventConsumer(
        settings, group, [topic], EventCodec(),
        **{"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
    )  # fmt: skip
    # A slow handler takes one record per poll, so rebalances complete without waiting for it.
    stats = consumer.run(handle, batch_size=1)
    consumer.close()
    print(f"stopped after {stats.handled} records", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:])
