"""Child-process roles of the search and tool benchmarks: index builds, searches, tool workers.

Like `roles.py`, each role is a top-level function of keyword arguments returning a dict of
measurements, so a spawned process (`harness.Children.start`) can import it by name. Building
and searching run in children so `ru_maxrss` (the peak resident memory of the process) is the
figure of that work alone.
"""

from __future__ import annotations

import asyncio
import resource
import threading
import uuid
from collections.abc import Callable
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, ConsumerGroupDescription
from harness import clock, wait_for_assignment

from asearcher.consumers.tools.local_index import LocalIndex, build_index
from asearcher.consumers.tools.result_store import ResultStore
from asearcher.consumers.tools.tool_worker import ToolWorker
from asearcher.consumers.tools.toolbox import Toolbox, build_backends, load_tool_config
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.consumer import EventConsumer
from asearcher.streams.io.producer import LOW_LATENCY, EventProducer
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import ToolCallRequested, ToolResultReady
from asearcher.streams.wire.records import Record


def max_rss_mb() -> float:
    """The peak resident memory of this process so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------------------------------
# Index build and search


class OverBudget(Exception):
    """The dense stage would take longer than its budget: stop it after the part just saved."""


def build(
    *, corpus: str, out: str, dense: bool, dense_budget_s: float | None = None
) -> dict[str, Any]:
    """`build_index` with the time of each progress report; the dense stage may be cut short.

    With `dense_budget_s`, the dense stage stops (after a saved part, which a later build would
    reuse) as soon as its projected duration, at the rate so far, exceeds the budget.
    """
    baseline_mb = max_rss_mb()
    events: list[tuple[str, int, int, float]] = []
    started = clock()

    def progress(stage: str, done: int, total: int) -> None:
        now = clock() - started
        events.append((stage, done, total, now))
        if stage != "dense" or dense_budget_s is None or done >= total:
            return
        begun = max((e[3] for e in events if e[0] != "dense"), default=0.0)
        elapsed = now - begun
        if elapsed + (total - done) * elapsed / done > dense_budget_s:
            raise OverBudget

    completed = True
    try:
        manifest = build_index(Path(corpus), Path(out), dense=dense, progress=progress)
        pages = manifest.pages
    except OverBudget:
        completed = False
        pages = max(e[2] for e in events)
    return {
        "completed": completed,
        "pages": pages,
        "seconds": clock() - started,
        "events": events,
        "baseline_rss_mb": baseline_mb,
        "peak_rss_mb": max_rss_mb(),
    }


def search(
    *, index_dir: str, modes: list[str], k: int, warmup: list[str], queries: list[str]
) -> dict[str, Any]:
    """Per mode: the first query (which loads the index or model), a warm-up, then `queries`
    one after another, each timed around `LocalIndex.search` (ranking, page reads, snippets)."""
    index = LocalIndex(Path(index_dir))
    results: dict[str, Any] = {}
    for mode in modes:
        began = clock()
        index.search(warmup[0], k, mode)  # type: ignore[arg-type]
        first_query_s = clock() - began
        for query in warmup[1:]:
            index.search(query, k, mode)  # type: ignore[arg-type]
        seconds, urls = [], []
        for query in queries:
            began = clock()
            hits = index.search(query, k, mode)  # type: ignore[arg-type]
            seconds.append(clock() - began)
            urls.append([hit.url for hit in hits])
        results[mode] = {"first_query_s": first_query_s, "seconds": seconds, "urls": urls}
    # The ranking alone, without reading the five pages and cutting their snippets.
    rank_seconds = []
    for query in queries:
        began = clock()
        index.bm25(query, k)
        rank_seconds.append(clock() - began)
    return {"modes": results, "bm25_rank_only_seconds": rank_seconds, "peak_rss_mb": max_rss_mb()}


# ---------------------------------------------------------------------------------------------
# Tool workers over Kafka


def tool_worker(
    *,
    settings: KafkaSettings,
    index_dir: str,
    results_url: str,
    group: str,
    calls_topic: str,
    results_topic: str,
    worker_name: str,
    max_concurrency: int,
    ready: MpEvent,
    done: MpEvent,
    timeout: float,
) -> dict[str, Any]:
    """The project's `ToolWorker` (BM25 search) serving until `done` is set."""
    config = load_tool_config(
        None, index_dir=index_dir, search_mode="bm25", max_concurrency=max_concurrency
    )
    toolbox = Toolbox(*build_backends(config), config)
    # Load the BM25 index now, not on the first measured call.
    text, error = asyncio.run(toolbox.call("search", {"query": "warm up the index"}))
    if error is not None:
        raise RuntimeError(f"warm-up search failed: {error}")
    worker = ToolWorker(
        settings, EventCodec(), toolbox, ResultStore(results_url), group_id=group,
        calls_topic=calls_topic, results_topic=results_topic, name=worker_name,
    )  # fmt: skip
    threading.Thread(target=lambda: (done.wait(), worker.stop()), daemon=True).start()
    ready.set()
    try:
        stats = worker.run(timeout=timeout)
    finally:
        worker.close()
    return {"handled": stats.handled, "dead_lettered": stats.dead_lettered, "rss_mb": max_rss_mb()}


def group_settled(
    admin: AdminClient, group: str, members: int, topic: str, partitions: int
) -> bool:
    """True when `group` is stable with `members` members sharing every partition of `topic`."""
    future = admin.describe_consumer_groups([group], request_timeout=10)[group]
    description: ConsumerGroupDescription = future.result()
    if description.state.name != "STABLE" or len(description.members) != members:
        return False
    owned = [
        tp.partition
        for member in description.members
        if member.assignment is not None
        for tp in member.assignment.topic_partitions
        if tp.topic == topic
    ]
    return sorted(owned) == list(range(partitions))


def search_calls(prefix: str, queries: list[str], count: int) -> list[ToolCallRequested]:
    """`count` search calls cycling through `queries`, spread over 256 trajectories (keys)."""
    return [
        ToolCallRequested(
            call_id=f"{prefix}-{index}",
            trajectory_id=f"trajectory-{index % 256}",
            tool="search",
            arguments={"query": queries[index % len(queries)]},
        )
        for index in range(count)
    ]


def load_generator(
    *,
    settings: KafkaSettings,
    calls_topic: str,
    warmup_topic: str,
    queries: list[str],
    run_id: str,
    warmup_calls: int,
    count: int,
    ready: MpEvent,
    warm: MpEvent,
    go: MpEvent,
) -> dict[str, Any]:
    """Send `warmup_calls` calls on `warm`, then `count` calls as fast as possible on `go`."""
    warmups = search_calls(f"warm-{run_id}", queries[::-1], warmup_calls)
    calls = search_calls(f"call-{run_id}", queries, count)
    with EventProducer(settings, EventCodec(), **LOW_LATENCY) as producer:
        producer.kafka.list_topics(calls_topic, timeout=30)
        # The first delivery waits for the idempotent producer id: take that out of the timing.
        producer.send(warmup_topic, warmups[0])
        producer.flush()
        ready.set()
        warm.wait()
        for call in warmups:
            producer.send(calls_topic, call)
        producer.flush()
        go.wait()
        sent: dict[str, float] = {}
        started = clock()
        for call in calls:
            sent[call.call_id] = clock()
            producer.send(calls_topic, call)
        queued = clock()
        producer.flush()
        flushed = clock()
    return {"sent": sent, "started": started, "queued": queued, "flushed": flushed}


class Collector:
    """A handler keeping every result by call id with its arrival time; it stops the consumer
    once each awaited call id has a result (unless it is draining for late duplicates).

    The consumer runs with batch_size=1: `EventConsumer.stop()` drops the rest of a polled batch
    for the consumer's next `run`, and a late duplicate must not be lost that way.
    """

    def __init__(self, consumer: EventConsumer) -> None:
        self.consumer = consumer
        self.awaited: set[str] = set()
        self.missing: set[str] = set()
        self.arrivals: dict[str, list[float]] = {}
        self.results: dict[str, ToolResultReady] = {}
        self.unexpected = 0
        self.draining = False

    def expect(self, call_ids: set[str]) -> None:
        self.awaited = set(call_ids)
        self.missing = set(call_ids) - set(self.arrivals)

    def __call__(self, record: Record) -> None:
        now = clock()
        result = record.event
        if not isinstance(result, ToolResultReady):
            self.unexpected += 1
            return
        self.arrivals.setdefault(result.call_id, []).append(now)
        self.results.setdefault(result.call_id, result)
        self.missing.discard(result.call_id)
        if not self.missing and not self.draining:
            self.consumer.stop()

    def collect(self, call_ids: set[str], timeout: float, check: Callable[[], None]) -> None:
        """Consume until every id in `call_ids` has a result, or raise after `timeout`;
        `check` runs every second (to fail fast when a worker process died)."""
        self.expect(call_ids)
        deadline = clock() + timeout
        while self.missing and clock() < deadline:
            self.consumer.run(self, timeout=1.0, batch_size=1)
            check()
        if self.missing:
            raise TimeoutError(f"{len(self.missing)} calls unanswered after {timeout:.0f}s")

    def drain(self, seconds: float) -> None:
        """Keep consuming for `seconds` to catch duplicates that arrive late."""
        self.draining = True
        self.consumer.run(self, timeout=seconds, batch_size=1)
        self.draining = False


def results_consumer(settings: KafkaSettings, results_topic: str) -> EventConsumer:
    consumer = EventConsumer(
        settings, f"bench-collector-{uuid.uuid4().hex[:8]}", [results_topic], EventCodec()
    )
    wait_for_assignment(consumer.kafka)
    return consumer
