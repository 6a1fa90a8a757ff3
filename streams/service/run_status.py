"""What a run is doing, read from its topics: heartbeats, trainer metrics, message counts.

`stream status` reads here the newest heartbeat of every instance (`service.status`), a summary of
the trainer's steps and drops (`trainer.metrics`) and the number of data records per topic. All
reads assign partitions directly with `read_committed`, outside any consumer group, and never
commit, so they leave every group's offsets and lag untouched.

Message counts exclude what the watermarks include: the markers transactional producers write
and the records of aborted transactions. Counting means reading, so counts are kept per
partition in a small JSON cache and a later call only reads the records written since.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import msgspec
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from asearcher.streams.cluster.admin import ADMIN_TIMEOUT_S, watermarks
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.consumer import next_batch, raise_if_fatal
from asearcher.streams.service.log import get_logger
from asearcher.streams.wire.codec import EventCodec, EventDecodeError
from asearcher.streams.wire.events import (
    EvalResult,
    Event,
    ServiceStatus,
    TrainerStepFinished,
    TrajectoriesDropped,
)
from asearcher.streams.wire.records import Record
from asearcher.streams.wire.topics import EVAL_RESULTS, SERVICE_STATUS, TRAINER_METRICS, topic_spec

log = get_logger(__name__)

# The group `cluster_status` leaves out of its listing; nothing here joins or commits with it.
STATUS_GROUP = "asearcher-status"
# A partition with no progress for this long is given up (a broker gone quiet mid-read).
IDLE_S = 5.0
REWARD_WINDOW = 5  # the reward mean is over this many most recent steps

Where = tuple[str, int]  # (topic, partition)
Span = tuple[int, int]  # [start, end) offsets


def _reader(settings: KafkaSettings) -> Consumer:
    return Consumer(
        settings.client(
            **{
                "group.id": STATUS_GROUP,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
            }
        )
    )


def _watermarks(consumer: Consumer, topic: str, partitions: Iterable[int]) -> dict[int, Span]:
    return {p: watermarks(consumer, TopicPartition(topic, p)) for p in sorted(partitions)}


def _drain(
    consumer: Consumer, spans: dict[Where, Span], reached: dict[Where, int]
) -> Iterator[Message]:
    """The committed data records of every span, each partition from its start to its end.

    A partition ends at its end-of-partition notice (in read_committed mode: the last stable
    offset) or once its position passed the end taken at the start; `reached` receives the offset
    read up to, so that exactly the records before it were yielded.
    """
    if not spans:
        return
    consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _) in spans.items()])
    open_ = dict(spans)
    last_progress = time.monotonic()
    while open_:
        for message in next_batch(consumer, 1000):
            where = (message.topic() or "", message.partition() or 0)
            if where not in open_:
                continue  # prefetched after its partition ended: read next time
            last_progress = time.monotonic()
            if message.error() is None:
                yield message
            elif message.error().code() == KafkaError._PARTITION_EOF:
                reached[where] = message.offset()
                del open_[where]
            else:
                raise_if_fatal(message)
        if open_:
            idle = time.monotonic() - last_progress > IDLE_S
            _close_passed(consumer, open_, reached, give_up=idle)


def _close_passed(
    consumer: Consumer, open_: dict[Where, Span], reached: dict[Where, int], give_up: bool
) -> None:
    # Markers take offsets too, so a position past the end means nothing is left to read.
    positions = consumer.position([TopicPartition(t, p) for t, p in open_])
    for tp in positions:
        where, (start, end) = (tp.topic, tp.partition), open_[(tp.topic, tp.partition)]
        if tp.offset >= end or give_up:
            if give_up and tp.offset < end:
                log.warning("gave up reading %s[%d] at %d of %d", *where, tp.offset, end)
            reached[where] = tp.offset if tp.offset >= start else start
            del open_[where]


def read_topic_tail(
    settings: KafkaSettings, codec: EventCodec, topic: str, last_n: int | None = None
) -> list[Record]:
    """The committed records of `topic`, in offset order within each partition.

    With `last_n`, only the last `last_n` offsets of each partition are read (markers take
    offsets too, so that may be fewer records). Undecodable records are skipped: status reads
    send nothing anywhere.
    """
    consumer = _reader(settings)
    try:
        metadata = consumer.list_topics(topic, timeout=ADMIN_TIMEOUT_S).topics[topic]
        if metadata.error is not None:
            raise ValueError(f"topic {topic!r} cannot be read: {metadata.error.str()}")
        spans = {}
        for partition, (low, high) in _watermarks(consumer, topic, metadata.partitions).items():
            start = low if last_n is None else max(low, high - last_n)
            if start < high:  # an empty partition is done without a fetch
                spans[(topic, partition)] = (start, high)
        kinds = topic_spec(topic).event_types
        records = [_decoded(codec, message, kinds) for message in _drain(consumer, spans, {})]
        return [record for record in records if record is not None]
    finally:
        consumer.close()


def _decoded(codec: EventCodec, message: Message, kinds: tuple[type[Event], ...]) -> Record | None:
    try:
        return Record.of(message, codec.decode(message.value(), message.headers(), kinds))
    except EventDecodeError as exc:
        where = f"{message.topic()}[{message.partition()}]@{message.offset()}"
        log.debug("skipping %s: %s", where, exc)
        return None


def latest_heartbeats(
    settings: KafkaSettings, codec: EventCodec, topic: str = SERVICE_STATUS
) -> dict[str, ServiceStatus]:
    """The newest heartbeat of every instance, by instance name.

    Newest means last in the log, the one compaction keeps, so a restarted instance on a host
    whose clock is behind still shows its current state.
    """
    newest: dict[str, ServiceStatus] = {}
    for record in read_topic_tail(settings, codec, topic):
        if isinstance(record.event, ServiceStatus):
            newest[record.event.instance] = record.event
    return newest


def latest_eval_results(
    settings: KafkaSettings, codec: EventCodec, model: str | None = None, topic: str = EVAL_RESULTS
) -> list[EvalResult]:
    """The newest evaluation of each (model, benchmark), by weight version then time; only
    `model`'s when given."""
    newest: dict[tuple[str, str], EvalResult] = {}
    for record in read_topic_tail(settings, codec, topic):
        result = record.event
        if not isinstance(result, EvalResult) or (model is not None and result.model != model):
            continue
        key = (result.model, result.benchmark)
        held = newest.get(key)
        order = (result.policy_version, result.created_at)
        if held is None or order >= (held.policy_version, held.created_at):
            newest[key] = result
    return [newest[key] for key in sorted(newest)]


class TrainerSummary(msgspec.Struct, kw_only=True):
    """What the trainer has done, from its step and drop events."""

    version: int = -1  # the newest policy version on the topic
    steps: int = 0  # optimiser steps seen
    reward_mean: float | None = None  # mean of the last REWARD_WINDOW steps' reward means
    tokens_per_s: float = 0.0  # of the last step
    idle_fraction: float = 0.0  # of the last step
    recent_steps: int = 0  # how many steps `staleness_counts` covers
    # staleness_counts[k]: samples trained in the recent steps whose oldest token was k old.
    staleness_counts: list[int] = []
    # Totals over every step and drop event on the topic:
    dropped_flat_groups: int = 0
    dropped_small_groups: int = 0
    dropped_stale: int = 0
    duplicates: int = 0
    last_step_at: float | None = None  # creation time (unix) of the last step event


def summarize_trainer(events: Iterable[Event], recent: int = 20) -> TrainerSummary | None:
    """The summary of trainer metric events in log order; None when there are none."""
    summary, steps, seen = TrainerSummary(), [], False
    for event in events:
        if not isinstance(event, TrainerStepFinished | TrajectoriesDropped):
            continue
        seen = True
        summary.version = max(summary.version, event.version)
        summary.dropped_flat_groups += event.dropped_flat_groups
        summary.dropped_small_groups += event.dropped_small_groups
        summary.dropped_stale += event.dropped_stale
        summary.duplicates += event.duplicates
        if isinstance(event, TrainerStepFinished):
            steps.append(event)
    if not seen:
        return None
    if steps:
        _add_steps(summary, steps, recent)
    return summary


def _add_steps(summary: TrainerSummary, steps: list[TrainerStepFinished], recent: int) -> None:
    last, window = steps[-1], steps[-REWARD_WINDOW:]
    summary.steps = len(steps)
    summary.reward_mean = sum(step.stats.reward_mean for step in window) / len(window)
    summary.tokens_per_s, summary.idle_fraction = last.stats.tokens_per_s, last.idle_fraction
    summary.last_step_at = last.created_at
    recent_steps = steps[-recent:] if recent > 0 else []
    summary.recent_steps = len(recent_steps)
    summary.staleness_counts = _summed([step.staleness_counts for step in recent_steps])


def _summed(histograms: list[list[int]]) -> list[int]:
    total = [0] * max((len(h) for h in histograms), default=0)
    for histogram in histograms:
        for k, count in enumerate(histogram):
            total[k] += count
    return total


def trainer_summary(
    settings: KafkaSettings,
    codec: EventCodec,
    topic: str = TRAINER_METRICS,
    recent: int = 20,
    model: str | None = None,
) -> TrainerSummary | None:
    """The trainer's summary from `topic` (only `model`'s events if given); None when it holds
    no step or drop yet.

    The staleness histogram sums the last `recent` steps; drop totals cover the whole topic.
    """
    events = (r.event for r in read_topic_tail(settings, codec, topic))
    if model is not None:
        events = (e for e in events if getattr(e, "model", None) == model)
    return summarize_trainer(events, recent)


class _Counted(msgspec.Struct):
    """A partition's committed data records in [low, offset), as last counted."""

    low: int
    offset: int
    count: int


def _load_counts(cache: Path | None) -> dict[str, _Counted]:
    if cache is None or not cache.exists():
        return {}
    try:
        return msgspec.json.decode(cache.read_bytes(), type=dict[str, _Counted])
    except (OSError, msgspec.DecodeError) as exc:
        log.warning("recounting: the message count cache %s is unreadable (%s)", cache, exc)
        return {}


def _save_counts(cache: Path | None, counted: dict[str, _Counted]) -> None:
    if cache is None:
        return
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    partial.write_bytes(msgspec.json.encode(counted))
    partial.replace(cache)  # atomic: a concurrent `--watch` never reads half a file


def _still_valid(counted: _Counted | None, low: int, high: int) -> bool:
    # A moved low watermark means retention deleted records, some of them perhaps counted; an
    # offset past the end means the topic was deleted and created again.
    return counted is not None and counted.low == low and low <= counted.offset <= high


def message_counts(
    settings: KafkaSettings, topics: list[str], cache: Path | None = None
) -> dict[str, int]:
    """The number of committed data records in each existing topic of `topics`.

    Transaction markers and aborted records are not counted. With `cache`, counts are kept per
    (cluster, topic, partition) and only records written since the last call are read. On a
    compacted topic this counts records written since its low watermark, not those compaction
    kept.
    """
    consumer = _reader(settings)
    try:
        metadata = consumer.list_topics(timeout=ADMIN_TIMEOUT_S)
        saved = _load_counts(cache)
        counted, spans, keys = {}, {}, {}
        for topic in topics:
            if topic not in metadata.topics or metadata.topics[topic].error is not None:
                continue
            partitions = metadata.topics[topic].partitions
            for partition, (low, high) in _watermarks(consumer, topic, partitions).items():
                key = keys[(topic, partition)] = f"{metadata.cluster_id}/{topic}/{partition}"
                entry = saved.get(key)
                if not _still_valid(entry, low, high):
                    entry = _Counted(low=low, offset=low, count=0)
                counted[key] = entry
                if entry.offset < high:
                    spans[(topic, partition)] = (entry.offset, high)
        _count_new(consumer, spans, {where: counted[key] for where, key in keys.items()})
        _save_counts(cache, {**saved, **counted})
    finally:
        consumer.close()
    totals = {topic: 0 for topic, _ in keys}
    for (topic, _), key in keys.items():
        totals[topic] += counted[key].count
    return totals


def _count_new(
    consumer: Consumer, spans: dict[Where, Span], counted: dict[Where, _Counted]
) -> None:
    reached: dict[Where, int] = {}
    for message in _drain(consumer, spans, reached):
        counted[(message.topic() or "", message.partition() or 0)].count += 1
    for where, offset in reached.items():
        counted[where].offset = offset
