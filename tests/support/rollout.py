"""Shared pieces of the rollout tests: topics, a tool worker thread, reading events back."""

from __future__ import annotations

import threading
import time
import uuid

from asearcher.consumers.tools.result_store import ResultStore
from asearcher.consumers.tools.tool_worker import ToolWorker
from asearcher.consumers.tools.toolbox import Toolbox, build_backends, load_tool_config
from asearcher.producers.rollout.service import RolloutTopics
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.codec import EventDecodeError
from asearcher.streams.wire.events import EVENT_TYPES, Event, RolloutRequested, SamplingSettings
from tests.conftest import read_raw

FAST_GROUP = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


def fresh_topics(make_topic) -> RolloutTopics:
    """A private copy of every topic a rollout producer touches."""
    return RolloutTopics(
        requests=make_topic(like="rollout.requests", partitions=2),
        steps=make_topic(like="rollout.steps"),
        tool_calls=make_topic(like="tool.calls", partitions=2),
        tool_results=make_topic(like="tool.results"),
        trajectories=make_topic(like="trajectories"),
        weights=make_topic(like="weights"),
        played=make_topic(like="requests.played"),
    )


def events_of(settings, codec, topic: str, skip_undecodable: bool = True) -> list[Event]:
    """Every committed event of `topic`, partition by partition in offset order (records nothing
    can decode, e.g. left by the fuzz run on the shared topics, are skipped)."""
    kinds = tuple(t for t in EVENT_TYPES)
    events = []
    for message in read_raw(settings, topic):
        try:
            events.append(codec.decode(message.value(), message.headers(), kinds))
        except EventDecodeError:
            if not skip_undecodable:
                raise
    return events


def send_requests(settings, codec, topic: str, questions, group_size: int, **sampling) -> list:
    requests = [
        RolloutRequested(
            question_id=q.id,
            group_id=f"g-{uuid.uuid4().hex[:8]}",
            question=q.question,
            gold_answers=q.answers,
            group_size=group_size,
            sampling=SamplingSettings(**sampling),
        )
        for q in questions
    ]
    with EventProducer(settings, codec) as producer:
        for request in requests:
            producer.send(topic, request)
    return requests


class ToolWorkerThread:
    """A real tool worker (BM25 over the test world) answering in a background thread."""

    def __init__(
        self, settings, codec, topics: RolloutTopics, index_dir, store_url: str, pool: str = ""
    ) -> None:
        config = load_tool_config(None, index_dir=str(index_dir), search_mode="bm25", pool=pool)
        self.worker = ToolWorker(
            settings, codec, Toolbox(*build_backends(config), config), ResultStore(store_url),
            group_id=f"tools-{uuid.uuid4().hex[:6]}", calls_topic=topics.tool_calls,
            results_topic=topics.tool_results, **FAST_GROUP,
        )  # fmt: skip
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def __enter__(self) -> ToolWorkerThread:
        self.thread.start()
        time.sleep(1)
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.stop()
        self.thread.join(30)
        self.worker.close()


def group_offsets(settings, group: str, topic: str | None = None) -> dict[int, int]:
    """The consumer group's committed offset of each partition (of `topic`, if named) that
    has one."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(settings.client())
    [future] = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
    return {
        tp.partition: tp.offset
        for tp in future.result(timeout=30).topic_partitions
        if tp.offset >= 0 and topic in (None, tp.topic)
    }
