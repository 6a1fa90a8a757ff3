"""A consume-transform-produce processor in its own process, so a test can SIGKILL it mid-batch.

Usage: transactional_echo.py IN_TOPIC OUT_TOPIC GROUP TRANSACTIONAL_ID DELAY_S
For every ToolCallRequested it produces one ToolResultReady with the same call id, printing
`transformed <call_id>` once the output is queued inside the open transaction.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

from asearcher.streams.codec import EventCodec
from asearcher.streams.events import ToolResultReady
from asearcher.streams.records import Outgoing, Record
from asearcher.streams.settings import kafka_settings
from asearcher.streams.transactional import TransactionalProcessor


def main(in_topic: str, out_topic: str, group: str, transactional_id: str, delay_s: str) -> None:
    processor = TransactionalProcessor(
        kafka_settings(), group, [in_topic], transactional_id, EventCodec(),
        consumer_config={"group.instance.id": transactional_id, "session.timeout.ms": 6000},
        producer_config={"transaction.timeout.ms": 10000, "linger.ms": 0},
    )  # fmt: skip

    def echo(record: Record) -> Iterator[Outgoing]:
        call = record.event
        yield Outgoing(
            out_topic,
            ToolResultReady(
                call_id=call.call_id, trajectory_id=call.trajectory_id, tool=call.tool, text="ok"
            ),
        )
        processor.producer.kafka.poll(0)  # hand the record to the broker before pausing
        print(f"transformed {call.call_id}", flush=True)
        time.sleep(float(delay_s))

    stats = processor.run(echo, batch_size=20)
    processor.close()
    print(f"stopped after {stats.handled} records", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
