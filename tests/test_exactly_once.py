"""Consume-transform-produce: a processor SIGKILLed mid-batch still yields every output once."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from asearcher.streams.codec import EventCodec
from asearcher.streams.events import ToolCallRequested, ToolResultReady
from asearcher.streams.producer import EventProducer
from asearcher.streams.records import Outgoing
from asearcher.streams.transactional import TransactionalProcessor
from tests.conftest import read_raw, worker_command

INPUTS = 200


def call_ids_in(settings, codec, topic: str, isolation: str) -> list[str]:
    messages = read_raw(settings, topic, isolation)
    return [codec.decode(m.value(), m.headers(), (ToolResultReady,)).call_id for m in messages]


@pytest.mark.slow
def test_processor_killed_mid_batch_leaves_every_input_processed_exactly_once(
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
        assert line, "the processor exited before it was killed"
        transformed += line.startswith("transformed")
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)

    committed_before = call_ids_in(settings, codec, out_topic, "read_committed")
    assert 0 < len(committed_before) < 50  # some batches committed, the open one did not

    # The same transactional id fences the dead instance and aborts its open transaction.
    with TransactionalProcessor(
        settings, group, [in_topic], txn_id, EventCodec(),
        consumer_config={"group.instance.id": txn_id, "session.timeout.ms": 6000},
    ) as survivor:  # fmt: skip
        survivor.run(
            lambda r: [
                Outgoing(
                    out_topic, ToolResultReady(call_id=r.event.call_id, trajectory_id="t", tool="s")
                )
            ],
            max_messages=INPUTS - len(committed_before),
            timeout=120,
        )

    committed = call_ids_in(settings, codec, out_topic, "read_committed")
    assert sorted(committed) == sorted(f"c{i}" for i in range(INPUTS))  # each exactly once
    uncommitted = call_ids_in(settings, codec, out_topic, "read_uncommitted")
    assert len(uncommitted) > INPUTS  # the aborted batch's outputs exist, but only uncommitted
