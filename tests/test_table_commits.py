"""A stream processor's table entry commits with the offset of the event that wrote it.

faust sends a table's changelog record at once, into whichever transaction is open, so an
entry written while the committer was mid-commit of earlier offsets used to be committed with
them: a processor killed before an event's own commit restarted with the event's entry
written and its outputs lost (seen in the synthesis processor when it ran on faust).
`FaustEvents.set_with_commit` sends the record with the event's own commit; here another
agent's commits on the same transactional producer must not take it along.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.conftest import read_raw, worker_command
from tests.support.processors import FAUST_ENV, became

SLOW_S = 25.0
WAIT_S = 120.0


def wait_until(found: Callable[[], bool], what: str, log: Path, timeout_s: float = WAIT_S) -> None:
    if not became(found, timeout_s):
        raise AssertionError(f"timed out waiting for {what}; log:\n{log.read_text()[-3000:]}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_table_entry_commits_with_its_own_event_not_with_another_agents_commit(
    settings, make_topic, worker_env, tmp_path: Path
) -> None:
    slow_topic, fast_topic = make_topic(partitions=2), make_topic(partitions=2)
    app_id = f"tables-{uuid.uuid4().hex[:8]}"
    changelog = f"{app_id}-entries-changelog"
    log = tmp_path / "writer.log"

    def committed_keys() -> set[bytes]:
        return {m.key() for m in read_raw(settings, changelog, "read_committed")}

    producer = Producer(settings.client())

    def send(topic: str, key: bytes) -> None:
        producer.produce(topic, key=key, value=b"", partition=0)
        producer.flush(10)

    command = worker_command("table_writer.py", slow_topic, fast_topic, app_id,
                             str(tmp_path / "data"), str(SLOW_S))  # fmt: skip
    with log.open("wb") as output:
        worker = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT,
                                  env={**worker_env, **FAUST_ENV})  # fmt: skip
    try:
        send(fast_topic, b"before")  # proves the worker is up and committing
        wait_until(lambda: "wrote before" in log.read_text(), "the worker to start", log)
        wait_until(lambda: any(b"before" in k for k in committed_keys()), "a first commit", log)
        send(slow_topic, b"slow-entry")
        wait_until(lambda: "wrote slow-entry" in log.read_text(), "the slow entry", log)
        written = time.monotonic()
        send(fast_topic, b"fast-entry")
        wait_until(lambda: any(b"fast-entry" in k for k in committed_keys()), "the fast commit",
                   log, SLOW_S / 2)  # fmt: skip
        assert time.monotonic() - written < SLOW_S  # the slow event is still being processed
        assert not any(b"slow-entry" in k for k in committed_keys())
        wait_until(lambda: any(b"slow-entry" in k for k in committed_keys()), "the slow commit",
                   log)  # fmt: skip
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
