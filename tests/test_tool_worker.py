"""Tool workers over Kafka: shared load, no call unanswered after a kill, idempotent answers."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest

from asearcher.consumers.tools.result_store import ResultStore
from asearcher.consumers.tools.tool_worker import ToolWorker
from asearcher.consumers.tools.toolbox import Toolbox, build_backends, load_tool_config
from asearcher.producers.rollout.tool_router import KafkaToolClient
from asearcher.streams.io.consumer import EventConsumer
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.events import ToolCallRequested, ToolResultReady
from tests.conftest import worker_command
from tests.support.waiting import wait_for

FAST_GROUP = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


@pytest.fixture
def tool_topics(make_topic):
    return make_topic(like="tool.calls", partitions=4), make_topic(like="tool.results")


def send_calls(settings, codec, topic: str, calls: list[ToolCallRequested]) -> None:
    with EventProducer(settings, codec) as producer:
        for call in calls:
            producer.send(topic, call)


def search_calls(count: int, prefix: str) -> list[ToolCallRequested]:
    return [
        ToolCallRequested(
            call_id=f"{prefix}-{i}",
            trajectory_id=f"{prefix}-t{i}",
            tool="search",
            arguments={"query": f"city {i}"},
        )  # fmt: skip
        for i in range(count)
    ]


class ResultCollector:
    """Reads tool.results on a thread until told to stop."""

    def __init__(self, settings, codec, topic: str) -> None:
        self.results: list[ToolResultReady] = []
        self.consumer = EventConsumer(settings, f"collect-{time.time_ns()}", [topic], codec)
        self.thread = threading.Thread(
            target=lambda: self.consumer.run(lambda r: self.results.append(r.event), timeout=120),
            daemon=True,
        )
        self.thread.start()

    def close(self) -> None:
        self.consumer.stop()
        self.thread.join(30)
        self.consumer.close()


@contextmanager
def running_workers(env, topics, index_dir: str, store: str, searches: dict[str, str]):
    """Tool worker processes named by `searches` (name -> search backend), all in one group.

    Yields them once each has joined the group and owns partitions; stops them after.
    """
    group = f"tools-{time.time_ns()}"
    workers = {
        name: subprocess.Popen(
            worker_command("tool_worker.py", *topics, group, index_dir, store, name, search),
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for name, search in searches.items()
    }
    try:
        for worker in workers.values():
            assert worker.stdout.readline().strip() == "serving"
        time.sleep(8)  # every worker joined the group and owns partitions
        yield workers
    finally:
        for worker in workers.values():
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in workers.values():
            worker.wait(30)


@pytest.mark.slow
def test_a_worker_killed_mid_call_leaves_no_call_unanswered(
    settings, codec, tool_topics, world_index, worker_env, tmp_path: Path
) -> None:
    collector = ResultCollector(settings, codec, tool_topics[1])
    searches = {"victim": "tests.workers.slow_search:SlowSearch", "survivor": "local"}
    index_dir, store = str(world_index[1].directory), (tmp_path / "results").as_uri()
    calls = search_calls(40, "kill")
    try:
        with running_workers(worker_env, tool_topics, index_dir, store, searches) as workers:
            send_calls(settings, codec, tool_topics[0], calls)
            wait_for("the survivor's first answer", lambda: collector.results, 60, every=0.1)
            workers["victim"].send_signal(signal.SIGKILL)  # mid-call: its searches take 30 s
            wanted = {c.call_id for c in calls}
            wait_for(
                "every answer",
                lambda: {r.call_id for r in collector.results} >= wanted,
                90,
                every=0.1,
            )
    finally:
        collector.close()
    # The victim never finished a call, so the survivor answered the victim's partitions too.
    assert {r.worker for r in collector.results} == {"survivor"}
    assert all(r.error is None for r in collector.results)
    assert workers["survivor"].returncode == 0


@pytest.mark.slow
def test_two_workers_in_one_group_both_answer_calls(
    settings, codec, tool_topics, world_index, worker_env, tmp_path: Path
) -> None:
    collector = ResultCollector(settings, codec, tool_topics[1])
    index_dir, store = str(world_index[1].directory), (tmp_path / "results").as_uri()
    calls = search_calls(60, "share")
    try:
        both = {"a": "local", "b": "local"}
        with running_workers(worker_env, tool_topics, index_dir, store, both) as workers:
            send_calls(settings, codec, tool_topics[0], calls)
            wanted = {c.call_id for c in calls}
            wait_for(
                "every answer",
                lambda: {r.call_id for r in collector.results} >= wanted,
                90,
                every=0.1,
            )
    finally:
        collector.close()
    assert {r.worker for r in collector.results} == {"a", "b"}
    assert sorted(r.call_id for r in collector.results) == sorted(wanted)  # each answered once
    assert all(w.returncode == 0 for w in workers.values())


def test_a_redelivered_call_id_gets_the_identical_result(
    settings, codec, tool_topics, world_index, tmp_path: Path
) -> None:
    calls_topic, results_topic = tool_topics
    config = load_tool_config(None, index_dir=str(world_index[1].directory))
    worker = ToolWorker(
        settings, codec, Toolbox(*build_backends(config), config),
        ResultStore((tmp_path / "results").as_uri()), group_id=f"idem-{time.time_ns()}",
        calls_topic=calls_topic, results_topic=results_topic, name="w1",
    )  # fmt: skip
    call = search_calls(1, "again")[0]
    url = {"url": "file:///etc/passwd"}
    bad = ToolCallRequested(call_id="bad", trajectory_id="t", tool="browse", arguments=url)
    send_calls(settings, codec, calls_topic, [call, call, bad])
    try:
        stats = worker.run(max_messages=3, timeout=60)
    finally:
        worker.close()
    assert stats.handled == 3
    collector = ResultCollector(settings, codec, results_topic)
    wait_for("three results", lambda: len(collector.results) >= 3, 30, every=0.1)
    collector.close()
    # Handled concurrently: results come in any order.
    results = sorted(collector.results, key=lambda r: r.call_id == "bad")
    first, second, refused = results
    assert first == second and first.error is None and first.text.startswith("[1] ")
    assert refused.call_id == "bad" and "no page at file:///etc/passwd" in refused.error


def test_runs_sharing_the_topics_each_answer_only_their_own_pool_s_calls(
    settings, codec, tool_topics, world_index, tmp_path: Path
) -> None:
    """Two runs' tool workers (own groups, so each reads every call) on one pair of topics:
    a client's calls reach only its run's workers; a call of no live pool waits and times out."""
    calls_topic, results_topic = tool_topics
    workers = []
    for pool in ("red", "blue"):
        config = load_tool_config(None, index_dir=str(world_index[1].directory), pool=pool)
        workers.append(ToolWorker(
            settings, codec, Toolbox(*build_backends(config), config),
            ResultStore((tmp_path / pool).as_uri()), group_id=f"{pool}-{time.time_ns()}",
            calls_topic=calls_topic, results_topic=results_topic, name=pool, **FAST_GROUP,
        ))  # fmt: skip
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for thread in threads:
        thread.start()

    async def ask(pool: str, call: ToolCallRequested) -> ToolResultReady:
        with EventProducer(settings, codec) as producer:
            client = KafkaToolClient(settings, codec, producer, calls_topic=calls_topic,
                                     results_topic=results_topic, pool=pool)  # fmt: skip
            client.start()
            try:
                return await client.call(call)
            finally:
                client.stop()

    red, blue, green = (msgspec.structs.replace(c, timeout_s=30.0) for c in search_calls(3, "p"))
    try:
        answers = {pool: asyncio.run(ask(pool, call))
                   for pool, call in (("red", red), ("blue", blue))}  # fmt: skip
        unanswered = asyncio.run(ask("green", msgspec.structs.replace(green, timeout_s=8.0)))
    finally:
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(30)
        for worker in workers:
            worker.close()
    assert {pool: a.worker for pool, a in answers.items()} == {"red": "red", "blue": "blue"}
    assert all(a.error is None and a.text.startswith("[1] ") for a in answers.values())
    assert unanswered.error == "search timed out: no result within 8 s"
    # Each worker read all three calls and passed over the two of other pools.
    assert [w.foreign_calls for w in workers] == [2, 2]
