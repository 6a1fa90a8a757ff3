"""An `OutOfOrderIntake` member in its own process, so a test can SIGKILL it mid-transaction.

Usage: transactional_echo.py IN_TOPIC OUT_TOPIC GROUP TRANSACTIONAL_ID DELAY_S
It takes batches of BATCH ToolCallRequested records and commits, per batch, one ToolResultReady
per call (same call id) together with the batch's offsets in one transaction, as the rollout
producer and the trainer do. It prints `transformed <call_id>` once an output is queued inside
the open transaction, and runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

from asearcher.streams.cluster.settings import kafka_settings
from asearcher.streams.io.intake import OutOfOrderIntake, static_member
from asearcher.streams.service.lifecycle import stop_on_signals
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import ToolResultReady
from asearcher.streams.wire.records import Outgoing, Record

BATCH = 20


def echo(
    intake: OutOfOrderIntake, out_topic: str, batch: list[Record], delay_s: float
) -> Iterator[Outgoing]:
    """The outputs of `batch`, made lazily: `commit` sends each inside its open transaction."""
    for record in batch:
        call = record.event
        result = ToolResultReady(
            call_id=call.call_id, trajectory_id=call.trajectory_id, tool=call.tool, text="ok"
        )
        yield Outgoing(out_topic, result)
        intake.outputs.kafka.poll(0)  # hand the output to the broker before pausing
        print(f"transformed {call.call_id}", flush=True)
        time.sleep(delay_s)


def full_batch(intake: OutOfOrderIntake, wait_s: float = 2.0) -> list[Record]:
    """Up to BATCH records; full ones while the input has them, so batches are predictable."""
    records: list[Record] = []
    deadline = time.monotonic() + wait_s
    while len(records) < BATCH and time.monotonic() < deadline:
        records += intake.poll(BATCH - len(records))
        if len(records) < BATCH:
            time.sleep(0.02)
    return records


def main(in_topic: str, out_topic: str, group: str, transactional_id: str, delay_s: str) -> None:
    intake = OutOfOrderIntake(
        kafka_settings(), EventCodec(), group, in_topic, transactional_id,
        **{**static_member("echo", transactional_id), "session.timeout.ms": 6000},
    )  # fmt: skip
    stopping, batches = [], 0
    with stop_on_signals(lambda: stopping.append(True)):
        while not stopping:
            batch = full_batch(intake)
            if batch:
                intake.commit(echo(intake, out_topic, batch, float(delay_s)), batch)
                batches += 1
    intake.close()
    print(f"stopped after {batches} batches", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
