"""Cluster administration: create the declared topics, and report topics and consumer lag."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, TopicMetadata

from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.service.log import get_logger
from asearcher.streams.wire.topics import TOPICS, TopicSpec

log = get_logger(__name__)
ADMIN_TIMEOUT_S = 30.0
NODE_TIMEOUT_S = 5.0  # one node's answer, when every node is asked


def admin_client(settings: KafkaSettings) -> AdminClient:
    return AdminClient(settings.client())


def cluster_size(settings: KafkaSettings) -> int:
    """How many brokers the cluster's metadata names now."""
    return max(1, len(admin_client(settings).list_topics(timeout=ADMIN_TIMEOUT_S).brokers))


def under_replicated_partitions(settings: KafkaSettings) -> int:
    """Partitions of every topic, Kafka's own included, with fewer in-sync copies than
    replicas (or no leader): 0 once a restarted broker has caught up."""
    metadata = admin_client(settings).list_topics(timeout=ADMIN_TIMEOUT_S)
    return sum(
        partition.leader < 0 or len(partition.isrs) < len(partition.replicas)
        for topic in metadata.topics.values()
        for partition in topic.partitions.values()
    )


def leading_node(settings: KafkaSettings, topic: str) -> int:
    """The broker that leads the most partitions of `topic` (-1 if none has a leader)."""
    metadata = admin_client(settings).list_topics(topic, timeout=ADMIN_TIMEOUT_S)
    leaders = topic_placement(metadata.topics[topic]).leaders
    leading = {node: n for node, n in leaders.items() if node >= 0}
    return max(leading, key=lambda node: (leading[node], -node)) if leading else -1


def ensure_topics(settings: KafkaSettings, specs: Iterable[TopicSpec] = TOPICS) -> list[str]:
    """Create the topics in `specs` that do not exist yet; return the names created."""
    admin = admin_client(settings)
    metadata = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
    brokers = max(1, len(metadata.brokers))
    missing = [spec for spec in specs if spec.name not in metadata.topics]
    if not missing:
        return []
    new_topics = [
        NewTopic(
            spec.name,
            num_partitions=spec.partitions,
            replication_factor=spec.replicas_on(brokers),
            config=spec.broker_config(brokers),
        )
        for spec in missing
    ]
    created = []
    for name, future in admin.create_topics(new_topics, request_timeout=ADMIN_TIMEOUT_S).items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    wait_for_leaders(settings, [spec.name for spec in missing])
    return created


def wait_for_leaders(
    settings: KafkaSettings, names: list[str], timeout: float = ADMIN_TIMEOUT_S
) -> None:
    """Block until every partition of `names` has a leader in the metadata of every node that
    answers, so the topics are usable at once whichever node a client asks: in a cluster, a
    node learns of a new topic from the controller a moment after its creation returns (seconds
    on a loaded machine, where a test read the topics from a node that did not know them)."""
    deadline = time.monotonic() + timeout
    nodes = _node_clients(settings)
    while time.monotonic() < deadline:
        answers = _answers(nodes)
        if answers and all(_leaders_known(topics, names) for topics in answers):
            return
        time.sleep(0.2)
    raise TimeoutError(f"topics {names} have no partition leaders after {timeout:.0f}s")


def _leaders_known(topics: dict[str, TopicMetadata], names: list[str]) -> bool:
    return all(
        name in topics
        and topics[name].partitions
        and all(p.leader >= 0 for p in topics[name].partitions.values())
        for name in names
    )


def _node_clients(settings: KafkaSettings) -> list[AdminClient]:
    """One client per node of the cluster, each asking that node (or one client, alone)."""
    client = admin_client(settings)
    brokers = client.list_topics(timeout=ADMIN_TIMEOUT_S).brokers
    if len(brokers) <= 1:
        return [client]
    # A client with one bootstrap address asks that node: it knows no other yet.
    return [AdminClient(settings.client(**{"bootstrap.servers": f"{b.host}:{b.port}"}))
            for b in brokers.values()]  # fmt: skip


def _answers(nodes: list[AdminClient]) -> list[dict[str, TopicMetadata]]:
    """The topics as each node knows them now; a node that does not answer is left out (an
    advertised address this host cannot reach)."""
    answers = []
    for node in nodes:
        try:
            answers.append(node.list_topics(timeout=NODE_TIMEOUT_S).topics)
        except KafkaException:
            continue
    return answers


def delete_topics(settings: KafkaSettings, names: list[str]) -> None:
    """Delete topics (tests and `replay --to-topic` clean-ups)."""
    admin = admin_client(settings)  # held: a dropped client never completes its futures
    for future in admin.delete_topics(names, request_timeout=ADMIN_TIMEOUT_S).values():
        future.result()


@dataclass(frozen=True, slots=True)
class TopicStatus:
    name: str
    partitions: int
    messages: int
    replicas: int = 1
    # Partitions led by each broker id; -1 counts partitions without a leader (offline).
    leaders: dict[int, int] = field(default_factory=dict)
    # Partitions with fewer in-sync replicas than replicas (a copy is down or catching up).
    under_replicated: int = 0


@dataclass(slots=True)
class GroupStatus:
    group_id: str
    state: str
    members: int
    lag_by_topic: dict[str, int] = field(default_factory=dict)

    @property
    def lag(self) -> int:
        return sum(self.lag_by_topic.values())


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    bootstrap_servers: str
    brokers: int
    cluster_id: str | None
    topics: list[TopicStatus]
    groups: list[GroupStatus]
    # The brokers the cluster's metadata names now, by node id, with their addresses.
    broker_addresses: dict[int, str] = field(default_factory=dict)

    @property
    def under_replicated(self) -> int:
        return sum(topic.under_replicated for topic in self.topics)


def stable_members(settings: KafkaSettings, group_id: str) -> int:
    """The members of `group_id` once it is stable (its partitions assigned); 0 while it is
    empty, rebalancing or unknown."""
    admin = admin_client(settings)  # held: a dropped client never completes its futures
    described = admin.describe_consumer_groups([group_id], request_timeout=ADMIN_TIMEOUT_S)
    try:
        description = described[group_id].result()
    except KafkaException:  # no coordinator yet, for instance: not joined, ask again
        return 0
    if str(description.state.name).lower() != "stable":
        return 0
    return len(description.members or [])


def end_offsets(settings: KafkaSettings, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    """Low and high watermark of every partition of `topic`."""
    consumer = Consumer(
        settings.client(**{"group.id": "asearcher-status", "enable.auto.commit": False})
    )
    try:
        return {p: watermarks(consumer, TopicPartition(topic, p)) for p in range(partitions)}
    finally:
        consumer.close()


def committed_offsets(
    consumer: Consumer, partitions: list[TopicPartition], patience_s: float = 180.0
) -> list[TopicPartition]:
    """Committed offsets with their metadata, retrying while they are not readable yet: a
    dead member's open transaction (until the broker aborts it), a coordinator still moving."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return consumer.committed(partitions, timeout=30)
        except KafkaException as exc:
            # A consumer being closed will never answer: retrying would hold its close up.
            if time.monotonic() >= deadline or exc.args[0].code() == KafkaError._DESTROY:
                raise
            log.warning("committed offsets not readable yet (%s); retrying", exc)
            time.sleep(0.5)


# Errors of a partition whose leader is still being elected, or that the client's metadata
# does not hold yet (a topic created moments ago).
_NOT_READY = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._TIMED_OUT,
)


def watermarks(
    consumer: Consumer, where: TopicPartition, patience_s: float = 30.0
) -> tuple[int, int]:
    """Low and high watermark, waiting out a leader that a new topic (or a partition whose
    broker just failed) does not have yet, and other retriable errors; the last
    KafkaException once `patience_s` has passed or on any other error."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return consumer.get_watermark_offsets(where, timeout=ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not isinstance(error, KafkaError) or time.monotonic() >= deadline:
                raise
            if error.code() not in _NOT_READY and not error.retriable():
                raise
            time.sleep(0.2)


def skip_backlog(settings: KafkaSettings, group_id: str, topic: str) -> int:
    """Commit the end of every partition of `topic` for `group_id`, so the group starts after
    what is already there; returns how many records were skipped. The group must be empty; one
    that has committed before is left as it is (0)."""
    consumer = Consumer(settings.client(**{"group.id": group_id, "enable.auto.commit": False}))
    try:
        metadata = consumer.list_topics(topic, timeout=ADMIN_TIMEOUT_S).topics[topic]
        ends = []
        for number in metadata.partitions:
            where = TopicPartition(topic, number)
            ends.append((watermarks(consumer, where), number))
        committed = {
            tp.partition: tp.offset
            for tp in committed_offsets(consumer, [TopicPartition(topic, n) for _, n in ends])
        }
        if any(offset >= 0 for offset in committed.values()):
            return 0  # not a new group: its run started elsewhere (another host) and reads on
        offsets = [TopicPartition(topic, number, high) for (_, high), number in ends]
        consumer.commit(offsets=offsets, asynchronous=False)
        return sum(high - max(committed[n], low) for (low, high), n in ends)
    finally:
        consumer.close()


def cluster_status(settings: KafkaSettings, include_internal: bool = False) -> ClusterStatus:
    """Brokers, every topic with partitions and message counts, every group with its lag."""
    admin = admin_client(settings)
    metadata = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
    watermarks: dict[str, dict[int, tuple[int, int]]] = {}
    topics = []
    for name in sorted(metadata.topics):
        if name.startswith("__") and not include_internal:
            continue
        partitions = len(metadata.topics[name].partitions)
        watermarks[name] = end_offsets(settings, name, partitions)
        # Counts include transaction markers, so transactional topics read slightly high.
        messages = sum(high - low for low, high in watermarks[name].values())
        topics.append(topic_placement(metadata.topics[name], messages))
    groups = group_statuses(admin, watermarks)
    return ClusterStatus(
        bootstrap_servers=settings.bootstrap_servers,
        brokers=len(metadata.brokers),
        cluster_id=metadata.cluster_id,
        topics=topics,
        groups=groups,
        broker_addresses={
            node: f"{broker.host}:{broker.port}" for node, broker in metadata.brokers.items()
        },
    )


def topic_placement(topic: TopicMetadata, messages: int = 0) -> TopicStatus:
    """A topic's partitions, replicas, leaders per broker and under-replicated partitions, from
    its metadata."""
    partitions = topic.partitions.values()
    leaders: dict[int, int] = {}
    for partition in partitions:
        leaders[partition.leader] = leaders.get(partition.leader, 0) + 1
    return TopicStatus(
        name=topic.topic,
        partitions=len(partitions),
        messages=messages,
        replicas=max((len(p.replicas) for p in partitions), default=0),
        leaders=dict(sorted(leaders.items())),
        under_replicated=sum(len(p.isrs) < len(p.replicas) for p in partitions),
    )


def group_statuses(
    admin: AdminClient, watermarks: dict[str, dict[int, tuple[int, int]]]
) -> list[GroupStatus]:
    """Every consumer group with its state, member count and lag per topic."""
    listing = admin.list_consumer_groups(request_timeout=ADMIN_TIMEOUT_S).result()
    ids = sorted(g.group_id for g in listing.valid if g.group_id != "asearcher-status")
    if not ids:
        return []
    described = admin.describe_consumer_groups(ids, request_timeout=ADMIN_TIMEOUT_S)
    statuses = []
    for group_id in ids:
        description = described[group_id].result()
        status = GroupStatus(
            group_id, str(description.state.name).lower(), len(description.members)
        )
        request = [ConsumerGroupTopicPartitions(group_id)]
        offsets = admin.list_consumer_group_offsets(request, request_timeout=ADMIN_TIMEOUT_S)
        committed = {
            (tp.topic, tp.partition): tp.offset
            for tp in offsets[group_id].result().topic_partitions or []
        }
        status.lag_by_topic = _lag_by_topic(committed, watermarks)
        statuses.append(status)
    return statuses


def _lag_by_topic(
    committed: dict[tuple[str, int], int], watermarks: dict[str, dict[int, tuple[int, int]]]
) -> dict[str, int]:
    """Records not yet consumed, per topic the group has committed on; a partition the group has
    never committed on counts from its low watermark."""
    lag: dict[str, int] = {}
    for topic in sorted({topic for topic, _ in committed}):
        for partition, (low, high) in watermarks.get(topic, {}).items():
            offset = committed.get((topic, partition), -1)
            lag[topic] = lag.get(topic, 0) + high - (offset if offset >= 0 else low)
    return lag
