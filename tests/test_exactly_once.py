"""Consume-transform-produce through `OutOfOrderIntake`, the class the rollout producers and the
trainer read with: a member SIGKILLed mid-transaction still yields every output exactly once."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from asearcher.streams.io.intake import OutOfOrderIntake, static_member
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import ToolCallRequested, ToolResultReady
from asearcher.streams.wire.records import Outgoing, Record
from tests.conftest import read_raw, worker_command

INPUTS = 200


def call_ids_in(settings, codec, topic: str, isolation: str) -> list[str]:
    messages = read_raw(settings, topic, isolation)
    return [codec.decode(m.value(), m.headers(), (ToolResultReady,)).call_id for m in messages]


def echo(out_topic: str, record: Record) -> Outgoing:
    call = record.event
    return Outgoing(out_topic, ToolResultReady(call_id=call.call_id, trajectory_id="t", tool="s"))


def echo_until(intake: OutOfOrderIntake, out_topic: str, wanted: int, timeout: float) -> int:
    """Commit the echo of every record polled, batch by batch, until `wanted` records."""
    done, deadline = 0, time.monotonic() + timeout
    while done < wanted and time.monotonic() < deadline:
        records = intake.poll(50)
        if records:
            assert intake.commit([echo(out_topic, r) for r in records], records)
            done += len(records)
        else:
            time.sleep(0.05)
    return done


@pytest.mark.slow
def test_intake_killed_mid_transaction_leaves_every_input_processed_exactly_once(
    settings, codec, make_topic, worker_env
) -> None:
    in_topic, out_topic = make_topic(partitions=2), make_topic(partitions=2)
    group, txn_id = f"eos-{time.time_ns()}", f"eos-worker-{time.time_ns()}"
    with EventProducer(settings, codec) as producer:
        for i in range(INPUTS):
            producer.send(
                in_topic, ToolCallRequested(call_id=f"c{i}", trajectory_id=f"t{i}", tool="s")
            )

    victim = subprocess.Popen(
        worker_command("transactional_echo.py", in_topic, out_topic, group, txn_id, "0.02"),
        env=worker_env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    transformed = 0
    # 50 is mid-batch for batches of 20: the third transaction is open with outputs in it.
    while transformed < 50:
        line = victim.stdout.readline()
        assert line, "the worker exited before it was killed"
        transformed += line.startswith("transformed")
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)

    committed_before = call_ids_in(settings, codec, out_topic, "read_committed")
    assert 0 < len(committed_before) < 50  # some batches committed, the open one did not

    # Its restart under the same ids fences the dead instance, aborts its open transaction and
    # takes its partitions back at once; it redoes exactly the inputs not committed.
    survivor = OutOfOrderIntake(
        settings, EventCodec(), group, in_topic, txn_id,
        **{**static_member("echo", txn_id), "session.timeout.ms": 6000},
    )  # fmt: skip
    try:
        remaining = INPUTS - len(committed_before)
        assert echo_until(survivor, out_topic, remaining, timeout=120) == remaining
        assert echo_until(survivor, out_topic, 1, timeout=3) == 0  # and nothing twice
    finally:
        survivor.close()

    committed = call_ids_in(settings, codec, out_topic, "read_committed")
    assert sorted(committed) == sorted(f"c{i}" for i in range(INPUTS))  # each exactly once
    uncommitted = call_ids_in(settings, codec, out_topic, "read_uncommitted")
    assert len(uncommitted) > INPUTS  # the aborted batch's outputs exist, but only uncommitted
