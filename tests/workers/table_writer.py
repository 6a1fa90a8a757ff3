"""A faust app that writes table entries with `FaustEvents.set_with_commit`, in its own process.

Usage: table_writer.py SLOW_TOPIC FAST_TOPIC APP_ID DATADIR SLOW_S
Each record on either topic (both of 2 partitions) sets the entry `<its key>` of the table
`entries`. An agent on SLOW_TOPIC then waits SLOW_S seconds before it finishes the record, so
its offset stays uncommitted while the agent on FAST_TOPIC has records committed. It prints
`wrote <key>` once an entry is set; runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from faust.types import StreamT

from asearcher.streams.cluster.settings import kafka_settings
from asearcher.streams.service.faust_app import FaustEvents, make_app, raw_topic, run_worker
from asearcher.streams.wire.codec import EventCodec


def main(slow_topic: str, fast_topic: str, app_id: str, datadir: str, slow_s: str) -> int:
    settings = kafka_settings()
    app = make_app(app_id, settings, Path(datadir), stream_publish_on_commit=True, partitions=2)
    events = FaustEvents(app, EventCodec(), settings)
    table = app.Table("entries", key_type=str, value_type=str, default=None, partitions=2)

    async def write(stream: StreamT, pause_s: float) -> None:
        async for event in stream.events():
            key = event.message.key.decode()
            await events.set_with_commit(event, table, key, "set")
            print(f"wrote {key}", flush=True)
            await asyncio.sleep(pause_s)

    async def slow(stream: StreamT) -> None:
        await write(stream, float(slow_s))

    async def fast(stream: StreamT) -> None:
        await write(stream, 0.0)

    app.agent(raw_topic(app, slow_topic), name="slow")(slow)
    app.agent(raw_topic(app, fast_topic), name="fast")(fast)
    return run_worker(app)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
