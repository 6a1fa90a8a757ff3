"""Tool calls through Kafka under load: 1, 2 and 4 tool worker processes side by side.

Each worker is a spawned process running the project's `ToolWorker` (BM25 search over the
index of a 10k-entity synthetic world, built once; `max_concurrency` 16) in one consumer group
over a fresh 8-partition calls topic. A load-generator process sends CALLS search calls as fast
as the producer takes them (after a warm-up burst whose results are awaited); this process
collects the results with an `EventConsumer`. Every run gets fresh topics, a fresh group and a
fresh result store, so no answer comes from the store of an earlier run.

Figures: calls/s from the first send to the last result; per-call latency from its send to its
result reaching the collector (a burst, so it is mostly queueing: the p50 is about half the
run); the in-worker call time (`ToolResultReady.latency_s`). Each configuration runs ROUNDS
times, the second round in reverse order. Correctness: every call answered exactly once, by call
id, without an error. The broker, load generator, collector and workers share two cores, which
caps scaling beyond two workers.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tool_roles
from confluent_kafka.admin import AdminClient
from harness import Children, clock, percentile, show_table, write_results

from asearcher.consumers.tools.local_index import build_index
from asearcher.consumers.world.world import generate_world, write_world
from asearcher.streams.cluster.settings import KafkaSettings

pytestmark = pytest.mark.benchmark

SEED = 0
ENTITIES = 10_000
QUESTIONS = 2_000
CALLS = 2_000
WARMUP_CALLS = 64
WORKER_COUNTS = (1, 2, 4)
ROUNDS = 3
PARTITIONS = 8
MAX_CONCURRENCY = 16
DRAIN_S = 2.0
GROUP_SETTLE_TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def tool_index(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], float]:
    """A BM25 index of a 10k-page world, its questions (the search queries), build seconds."""
    root = tmp_path_factory.mktemp("tool-world")
    world = generate_world(seed=SEED, entities=ENTITIES, questions=QUESTIONS)
    files = write_world(world, root)
    began = clock()
    build_index(files["corpus"], root / "index", dense=False)
    return root / "index", [q.question for q in world.questions], clock() - began


def wait_for_group(admin: AdminClient, group: str, members: int, topic: str) -> float:
    """Seconds until `group` settled with `members` members owning all calls partitions."""
    began = clock()
    while not tool_roles.group_settled(admin, group, members, topic, PARTITIONS):
        if clock() - began > GROUP_SETTLE_TIMEOUT_S:
            raise TimeoutError(f"group {group} not settled with {members} members")
        time.sleep(0.25)
    return clock() - began


def run_once(
    settings: KafkaSettings,
    make_topic: Callable[..., str],
    admin: AdminClient,
    index_dir: Path,
    queries: list[str],
    workers: int,
    store_root: Path,
) -> dict[str, Any]:
    """One run: `workers` tool workers, one load generator, this process collecting."""
    run_id = uuid.uuid4().hex[:8]
    calls_topic = make_topic(like="tool.calls", partitions=PARTITIONS)
    results_topic = make_topic(like="tool.results")
    warmup_topic = make_topic(like="tool.calls", partitions=1)
    group = f"bench-tool-workers-{run_id}"
    names = [f"worker-{index}" for index in range(workers)]
    with Children() as children:
        done = children.event()
        readies = {name: children.event() for name in names}
        for name in names:
            children.start(
                name, tool_roles.tool_worker, settings=settings, index_dir=str(index_dir),
                results_url=(store_root / run_id).as_uri(), group=group,
                calls_topic=calls_topic, results_topic=results_topic, worker_name=name,
                max_concurrency=MAX_CONCURRENCY, ready=readies[name], done=done, timeout=900.0,
            )  # fmt: skip
        loader_ready, warm, go = children.event(), children.event(), children.event()
        children.start(
            "load", tool_roles.load_generator, settings=settings, calls_topic=calls_topic,
            warmup_topic=warmup_topic, queries=queries, run_id=run_id,
            warmup_calls=WARMUP_CALLS, count=CALLS, ready=loader_ready, warm=warm, go=go,
        )  # fmt: skip

        def check() -> None:
            dead = [name for name in names if not children.processes[name].is_alive()]
            if dead:
                raise RuntimeError(f"tool workers {dead} exited during the run")

        consumer = tool_roles.results_consumer(settings, results_topic)
        try:
            children.wait([*readies.values(), loader_ready], timeout=180.0)
            settle_s = wait_for_group(admin, group, workers, calls_topic)
            collector = tool_roles.Collector(consumer)
            warm.set()
            warm_ids = {f"warm-{run_id}-{index}" for index in range(WARMUP_CALLS)}
            collector.collect(warm_ids, timeout=120.0, check=check)
            go.set()
            call_ids = {f"call-{run_id}-{index}" for index in range(CALLS)}
            collector.collect(call_ids, timeout=600.0, check=check)
            collector.drain(DRAIN_S)
        finally:
            done.set()
            consumer.close()
        reports = children.gather(timeout=120.0)
    return summarise(workers, collector, call_ids, reports, names, settle_s)


def summarise(
    workers: int,
    collector: tool_roles.Collector,
    call_ids: set[str],
    reports: dict[str, dict[str, Any]],
    names: list[str],
    settle_s: float,
) -> dict[str, Any]:
    load = reports["load"]
    sent: dict[str, float] = load["sent"]
    assert set(sent) == call_ids
    arrivals = {call_id: collector.arrivals[call_id] for call_id in call_ids}
    results = [collector.results[call_id] for call_id in call_ids]
    latencies = sorted((arrivals[c][0] - sent[c]) * 1000 for c in call_ids)
    service = sorted(result.latency_s * 1000 for result in results)
    last = max(times[0] for times in arrivals.values())
    elapsed = last - load["started"]
    return {
        "workers": workers,
        "calls": len(call_ids),
        "answered": sum(1 for times in arrivals.values() if times),
        "answered_more_than_once": sum(1 for times in arrivals.values() if len(times) > 1),
        "duplicate_results": sum(len(times) - 1 for times in arrivals.values()),
        "results_on_topic": sum(len(times) for times in collector.arrivals.values()),
        "unexpected_events": collector.unexpected,
        "errors": sum(1 for result in results if result.error is not None),
        "empty_texts": sum(1 for result in results if not result.text),
        "first_error": next((r.error for r in results if r.error is not None), None),
        "calls_per_worker": dict(sorted(Counter(result.worker for result in results).items())),
        "handled_per_worker_incl_warmup": {name: reports[name]["handled"] for name in names},
        "dead_lettered": sum(reports[name]["dead_lettered"] for name in names),
        "worker_peak_rss_mb": max(reports[name]["rss_mb"] for name in names),
        "group_settle_s": settle_s,
        "send_seconds": load["queued"] - load["started"],
        "seconds": elapsed,
        "calls_per_s": len(call_ids) / elapsed,
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "p99_ms": percentile(latencies, 99),
        "max_ms": latencies[-1],
        "in_worker_call_p50_ms": percentile(service, 50),
        "in_worker_call_p99_ms": percentile(service, 99),
    }


@pytest.mark.timeout(1800)
def test_tool_workers(
    settings: KafkaSettings,
    make_topic: Callable[..., str],
    tool_index: tuple[Path, list[str], float],
    tmp_path: Path,
) -> None:
    index_dir, queries, build_s = tool_index
    admin = AdminClient(settings.client())
    runs = []
    for round_number in range(ROUNDS):
        order = WORKER_COUNTS if round_number % 2 == 0 else WORKER_COUNTS[::-1]
        for workers in order:
            result = run_once(settings, make_topic, admin, index_dir, queries, workers, tmp_path)
            runs.append({"round": round_number + 1, **result})
    for run in runs:
        assert run["answered"] == run["calls"] == CALLS, run
        assert run["duplicate_results"] == 0, f"calls answered more than once: {run}"
        assert run["errors"] == 0 and run["empty_texts"] == 0, run["first_error"]
        assert run["unexpected_events"] == 0 and run["dead_lettered"] == 0
        assert sum(run["calls_per_worker"].values()) == CALLS
    best = {
        workers: max((r for r in runs if r["workers"] == workers), key=lambda r: r["calls_per_s"])
        for workers in WORKER_COUNTS
    }
    report(runs, best)
    write_results(
        "tools",
        {
            "world": {"seed": SEED, "entities": ENTITIES, "index": "bm25", "build_s": build_s},
            "calls": CALLS,
            "warmup_calls": WARMUP_CALLS,
            "calls_partitions": PARTITIONS,
            "max_concurrency": MAX_CONCURRENCY,
            "rounds": ROUNDS,
            "best_by_workers": {str(w): r for w, r in best.items()},
            "runs": runs,
            "notes": [
                "The machine has 2 cores, shared by the broker, the load generator, the "
                "collector and every worker: scaling beyond 2 workers is CPU-bound here and "
                "says little about a larger machine.",
                "Latency is per call from its send to its result reaching the collector; the "
                "calls are sent as one burst, so it is dominated by queueing behind earlier calls.",
                "in_worker_call is ToolResultReady.latency_s: the toolbox call inside the worker, "
                "including the wait for LocalIndex's lock behind concurrent calls of its batch.",
            ],
        },
    )


def report(runs: list[dict[str, Any]], best: dict[int, dict[str, Any]]) -> None:
    rows = [
        (
            run["workers"], run["round"], run["calls"], f"{run['seconds']:.2f}",
            f"{run['calls_per_s']:.0f}",
            *(f"{run[key]:.0f}" for key in ("p50_ms", "p95_ms", "p99_ms", "max_ms")),
            f"{run['in_worker_call_p50_ms']:.1f}", f"{run['in_worker_call_p99_ms']:.1f}",
            " ".join(str(count) for count in run["calls_per_worker"].values()),
            f"{run['group_settle_s']:.1f}",
        )
        for run in sorted(runs, key=lambda r: (r["workers"], r["round"]))
    ]  # fmt: skip
    columns = (
        "workers", "round", "calls", "seconds", "calls/s", "p50 ms", "p95 ms", "p99 ms",
        "max ms", "in-worker p50 ms", "in-worker p99 ms", "calls per worker", "group settle s",
    )  # fmt: skip
    show_table(
        f"Search tool calls through Kafka: {CALLS} calls in one burst, BM25 over "
        f"{ENTITIES // 1000}k pages",
        columns,
        rows,
    )
    one = best[WORKER_COUNTS[0]]["calls_per_s"]
    scaling = ", ".join(f"{w}: {best[w]['calls_per_s'] / one:.2f}x" for w in WORKER_COUNTS)
    print(f"best calls/s relative to 1 worker: {scaling} (2 cores: no scaling expected past 2)")
    print("every call answered exactly once, without errors")
