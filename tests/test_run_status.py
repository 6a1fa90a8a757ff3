"""What `stream status` shows about a run: counts without markers, heartbeats, trainer, render."""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from confluent_kafka import TopicPartition
from rich.console import Console

from asearcher.cli.render import ProcessRow, run_tables, status_tables
from asearcher.streams.cluster.admin import (
    ClusterStatus,
    GroupStatus,
    TopicStatus,
    admin_client,
    end_offsets,
)
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.service.run_status import (
    TrainerSummary,
    latest_heartbeats,
    message_counts,
    read_topic_tail,
    trainer_summary,
)
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import (
    Event,
    ServiceStatus,
    StepStats,
    TrainerStepFinished,
    TrajectoriesDropped,
)


def status(instance: str, state: str = "running", **fields: object) -> ServiceStatus:
    return ServiceStatus(service="rollout", instance=instance, state=state, **fields)


def write_transactions(
    settings: KafkaSettings, codec: EventCodec, topic: str, sizes: list[int], abort: int = 0
) -> None:
    """One committed transaction of that many events per entry of `sizes`, then `abort` aborted."""
    producer = EventProducer(settings, codec, transactional_id=f"test-{uuid.uuid4().hex[:8]}")
    producer.kafka.init_transactions()
    for size, commit in [*((n, True) for n in sizes), *([(abort, False)] if abort else [])]:
        producer.kafka.begin_transaction()
        for n in range(size):
            producer.send(topic, status(f"i{n}"), key="k")
        producer.flush()
        if commit:
            producer.kafka.commit_transaction()
        else:
            producer.kafka.abort_transaction()
    producer.close()


def write(settings: KafkaSettings, codec: EventCodec, topic: str, events: list[Event]) -> None:
    producer = EventProducer(settings, codec)
    for event in events:
        producer.send(topic, event)
    producer.close()


def watermark_span(settings: KafkaSettings, topic: str) -> int:
    return sum(high - low for low, high in end_offsets(settings, topic, 1).values())


def test_message_counts_transactional_topic_exclude_markers_and_count_incrementally(
    settings: KafkaSettings, codec: EventCodec, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic, cache = make_topic(partitions=1), tmp_path / "counts.json"
    write_transactions(settings, codec, topic, [3, 2, 2], abort=4)
    assert watermark_span(settings, topic) == 7 + 3 + 4 + 1  # markers and aborted records
    assert message_counts(settings, [topic], cache) == {topic: 7}

    # Inflate the cached count: a call that only reads new records keeps the inflation.
    saved = msgspec.json.decode(cache.read_bytes())
    [key] = [k for k in saved if k.endswith(f"/{topic}/0")]
    assert saved[key]["offset"] == 15
    saved[key]["count"] += 100
    cache.write_bytes(msgspec.json.encode(saved))
    write_transactions(settings, codec, topic, [5])
    assert message_counts(settings, [topic], cache) == {topic: 112}
    assert message_counts(settings, [topic], None) == {topic: 12}


def test_message_counts_records_deleted_count_from_low_watermark(
    settings: KafkaSettings, codec: EventCodec, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic, cache = make_topic(partitions=1), tmp_path / "counts.json"
    write_transactions(settings, codec, topic, [3, 2, 2])
    assert message_counts(settings, [topic], cache) == {topic: 7}
    # The first transaction is offsets 0-2 and its marker 3: retention takes all four.
    admin = admin_client(settings)  # kept: a collected client never resolves its futures
    for future in admin.delete_records([TopicPartition(topic, 0, 4)]).values():
        future.result(timeout=30)
    assert message_counts(settings, [topic], cache) == {topic: 4}


def test_message_counts_open_transaction_counted_once_committed(
    settings: KafkaSettings, codec: EventCodec, make_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic, cache = make_topic(partitions=2), tmp_path / "counts.json"
    write_transactions(settings, codec, topic, [4])
    producer = EventProducer(settings, codec, transactional_id=f"test-{uuid.uuid4().hex[:8]}")
    producer.kafka.init_transactions()
    producer.kafka.begin_transaction()
    for n in range(3):
        producer.send(topic, status(f"open{n}"), key=f"k{n}")
    producer.flush()
    started = time.monotonic()
    assert message_counts(settings, [topic], cache) == {topic: 4}  # not waiting for the end
    assert time.monotonic() - started < 5
    producer.kafka.commit_transaction()
    producer.close()
    assert message_counts(settings, [topic], cache) == {topic: 7}


def test_message_counts_empty_and_missing_topics_return_promptly(
    settings: KafkaSettings, make_topic: Callable[..., str]
) -> None:
    empty, started = make_topic(partitions=3), time.monotonic()
    assert message_counts(settings, [empty, "no-such-topic"]) == {empty: 0}
    assert time.monotonic() - started < 5


def test_read_topic_tail_last_n_reads_only_the_newest_records(
    settings: KafkaSettings, codec: EventCodec, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(like="service.status")
    write(settings, codec, topic, [status(f"r{n}") for n in range(6)])
    assert [r.event.instance for r in read_topic_tail(settings, codec, topic, last_n=2)] == [
        "r4",
        "r5",
    ]
    assert len(read_topic_tail(settings, codec, topic)) == 6


def test_latest_heartbeats_several_per_instance_keep_the_newest(
    settings: KafkaSettings, codec: EventCodec, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(like="service.status")
    beats = [
        status("rollout-0", counters={"in_flight": 1}),
        status("rollout-1", "waiting", waiting_for="no requests"),
        status("rollout-0", "stopped", counters={"in_flight": 0}),
    ]
    write(settings, codec, topic, beats)
    newest = latest_heartbeats(settings, codec, topic)
    assert newest == {"rollout-0": beats[2], "rollout-1": beats[1]}


def step(n: int, reward: float, staleness: list[int], **drops: int) -> TrainerStepFinished:
    return TrainerStepFinished(
        version=n + 1, step=n, staleness_counts=staleness, idle_fraction=0.1 * n,
        stats=StepStats(reward_mean=reward, tokens=1000 * (n + 1), seconds=1.0), **drops,
    )  # fmt: skip


def test_trainer_summary_steps_and_drops_give_exact_means_and_sums(
    settings: KafkaSettings, codec: EventCodec, make_topic: Callable[..., str]
) -> None:
    topic = make_topic(like="trainer.metrics")
    assert trainer_summary(settings, codec, topic) is None  # an empty topic, promptly
    events: list[Event] = [
        step(0, 0.0, [9], dropped_flat_groups=1),
        step(1, 0.2, [4, 1], dropped_stale=3),
        TrajectoriesDropped(version=2, dropped_ids=["a", "b"], dropped_small_groups=2),
        step(2, 0.4, [2, 2, 1], duplicates=1),
        step(3, 0.6, [1]),
        TrajectoriesDropped(version=4, dropped_ids=["c"], dropped_flat_groups=1, duplicates=2),
        step(4, 0.8, []),
        step(5, 1.0, [0, 3], dropped_stale=4),
    ]
    write(settings, codec, topic, events)
    summary = trainer_summary(settings, codec, topic, recent=4)
    assert summary is not None
    assert summary.reward_mean == pytest.approx((0.2 + 0.4 + 0.6 + 0.8 + 1.0) / 5)
    assert msgspec.structs.replace(summary, reward_mean=None) == TrainerSummary(
        version=6, steps=6, tokens_per_s=6000.0, idle_fraction=0.5, recent_steps=4,
        staleness_counts=[3, 5, 1], dropped_flat_groups=2, dropped_small_groups=2,
        dropped_stale=7, duplicates=3, last_step_at=events[-1].created_at,
    )  # fmt: skip


def rendered(renderables: list) -> str:
    console = Console(record=True, width=160, file=io.StringIO())
    for renderable in renderables:
        console.print(renderable)
    return console.export_text()


def table_rows(text: str) -> list[list[str]]:
    """The cells of every table body row in rendered text."""
    return [
        [cell.strip() for cell in line.strip().strip("│").split("│")]
        for line in text.splitlines()
        if line.lstrip().startswith("│")
    ]


def test_run_tables_sample_run_shows_services_waits_histogram_and_drops() -> None:
    now = 1_000_000.0
    processes = [
        ProcessRow(name="trainer", state="running", pid=4242, uptime_s=192, restarts=0),
        ProcessRow(name="rollout-0", state="backoff", pid=0, uptime_s=5, restarts=3),
    ]
    heartbeats = {
        "rollout-0": ServiceStatus(
            service="rollout", instance="rollout-0", state="waiting", version=7,
            waiting_for="staleness bound: 16 groups started, capacity 16 at trainer v7",
            counters={"trajectories_per_s": 2.5, "in_flight": 12}, created_at=now - 3,
        ),
        "rollout-1": ServiceStatus(
            service="rollout", instance="rollout-1", version=7, created_at=now - 3,
            counters={"trajectories_per_s": 1.0, "in_flight": 2, "duplicates": 3},
        ),
        "feeder": ServiceStatus(
            service="feeder", instance="feeder", counters={"published": 40, "outstanding": 9},
            created_at=now - 95,
        ),
    }  # fmt: skip
    trainer = TrainerSummary(
        version=7, steps=6, reward_mean=0.425, tokens_per_s=1234.0, idle_fraction=0.25,
        recent_steps=6, staleness_counts=[120, 30, 0, 7], dropped_flat_groups=11,
        dropped_small_groups=2, dropped_stale=17, duplicates=1, last_step_at=now - 20,
    )  # fmt: skip
    text = rendered(run_tables(processes, heartbeats, trainer, dead_letters=5, now=now))
    assert "4242" in text and "3m12s" in text and "backoff" in text
    assert "2.50 traj/s, 12 in flight" in text and "40 published, 9 outstanding" in text
    assert "12 in flight," not in text and "2 in flight, 3 copies not played" in text
    assert "95s stale" in text
    assert "waiting rollout/rollout-0: staleness bound: 16 groups started" in text
    assert "0.425" in text and "1,234" in text and "25%" in text and "20s ago" in text
    histogram = [row for row in table_rows(text) if len(row) == 3]
    assert histogram == [["0", "120", "█" * 40], ["1", "30", "█" * 10], ["2", "0", ""],
                         ["3", "7", "██"]]  # fmt: skip
    assert (
        "drops: flat groups 11 · small groups 2 · stale samples 17 · duplicates 1 · invalid 5"
        in text
    )


def test_status_tables_counts_given_replace_watermark_counts() -> None:
    cluster = ClusterStatus(
        bootstrap_servers="b:9092", brokers=1, cluster_id="c",
        topics=[TopicStatus("trainer.metrics", 1, 15, leaders={1: 1}),
                TopicStatus("weights", 1, 4, leaders={1: 1})],
        groups=[GroupStatus("g", "stable", 1, {"weights": 2})],
    )  # fmt: skip
    text = rendered(status_tables(cluster, counts={"trainer.metrics": 7}))
    rows = {row[0]: row for row in table_rows(text)}
    assert rows["trainer.metrics"] == ["trainer.metrics", "1", "1", "1:1", "7"]
    assert rows["weights"] == ["weights", "1", "1", "1:1", "4"]


def test_status_shows_leaders_per_broker_and_partitions_short_of_a_copy() -> None:
    cluster = ClusterStatus(
        bootstrap_servers="b:1,b:3,b:5", brokers=2, cluster_id="c",
        topics=[TopicStatus("trajectories", 8, 40, replicas=3, leaders={-1: 1, 1: 4, 3: 3},
                            under_replicated=8),
                TopicStatus("weights", 1, 4, replicas=3, leaders={3: 1})],
        groups=[], broker_addresses={3: "b:5", 1: "b:1"},
    )  # fmt: skip
    text = rendered(status_tables(cluster))
    rows = {row[0]: row for row in table_rows(text)}
    assert rows["trajectories"] == ["trajectories", "8", "3 (8 under)", "1:4 3:3 1 offline", "40"]
    assert rows["weights"] == ["weights", "1", "3", "3:1", "4"]
    assert "2 (1 at b:1, 3 at b:5)" in text
    assert cluster.under_replicated == 8


def test_latest_evaluation_per_benchmark_is_the_newest_version(settings, make_topic) -> None:
    from asearcher.streams.service.run_status import latest_eval_results
    from asearcher.streams.wire.events import EvalResult

    topic, codec, model = make_topic(like="eval.results"), EventCodec(), f"m-{uuid.uuid4().hex}"

    def result(benchmark: str, version: int, f1: float, of: str = model) -> EvalResult:
        return EvalResult(eval_id=f"{of}-v{version}", model=of, benchmark=benchmark,
                          policy_version=version, questions=3, samples_per_question=2,
                          averages={"f1": f1}, best_of_k={"f1": f1})  # fmt: skip

    with EventProducer(settings, codec) as producer:
        for event in (result("world", 5, 0.4), result("world", 10, 0.6), result("nq", 5, 0.2),
                      result("world", 7, 0.5), result("world", 20, 0.9, of="other")):  # fmt: skip
            producer.send(topic, event)
    latest = latest_eval_results(settings, codec, model, topic=topic)
    assert [(r.benchmark, r.policy_version, r.averages["f1"]) for r in latest] == [
        ("nq", 5, 0.2), ("world", 10, 0.6),
    ]  # fmt: skip
    shown = io.StringIO()
    Console(file=shown, width=200).print(*run_tables(None, {}, None, 0, time.time(), latest))
    assert "latest evaluation per benchmark" in shown.getvalue() and "0.600" in shown.getvalue()
