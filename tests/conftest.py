"""Shared fixtures: one real local Kafka broker for the whole session, fresh topics per test."""

from __future__ import annotations

import os
import random
import socket
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from asearcher.streams.cluster.admin import ensure_topics
from asearcher.streams.cluster.local_broker import BrokerError, LocalBroker
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.storage.claimcheck import ClaimCheckStore
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.topics import TOPICS, TopicSpec, topic_spec
from tests import cpu_log

WORKERS = Path(__file__).parent / "workers"


def free_port_pair(count: int = 2) -> int:
    """A port p such that p .. p+count-1 are free (a broker's and its controller's listeners;
    a cluster of n nodes needs 2n). Drawn below the kernel's ephemeral range: a port in it can
    be taken, between this check and the broker's bind, by any client's outgoing connection
    (a rehearsal's three-node cluster lost its last controller port that way)."""
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10_000, low - count)
        if all(_bindable(port + i) for i in range(count)):
            return port
    raise RuntimeError(f"no {count} adjacent free ports below {low}")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# The torch.distributed world a launcher describes in the environment.
DISTRIBUTED_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_SESSION_WORLD = {name: os.environ.get(name) for name in DISTRIBUTED_VARIABLES}


@pytest.fixture(autouse=True)
def no_distributed_world_leaks() -> Iterator[None]:
    """An in-process trainer describes a one-process torch world in os.environ and keeps its
    port bound; a command a later test starts must not inherit that world (its own trainer
    would fail with EADDRINUSE on the port, as `learn`'s warm start once did in CI). After each
    test the variables are as the session found them."""
    yield
    for name, value in _SESSION_WORLD.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """The project's own local KRaft broker, started for this test session and purged after."""
    local = LocalBroker(tmp_path_factory.mktemp("kafka-home"), port=free_port_pair())
    try:
        local.up()
    except BrokerError as exc:
        pytest.fail(f"could not start the local Kafka broker for the tests: {exc}")
    try:
        yield local
    finally:
        local.down(purge=True)


@pytest.fixture(scope="session")
def settings(broker: LocalBroker) -> KafkaSettings:
    settings = KafkaSettings(bootstrap_servers=broker.bootstrap_servers)
    ensure_topics(settings, TOPICS)
    return settings


@pytest.fixture
def claims(tmp_path: Path) -> ClaimCheckStore:
    return ClaimCheckStore((tmp_path / "claims").as_uri(), threshold_bytes=64 * 1024)


@pytest.fixture
def codec(claims: ClaimCheckStore) -> EventCodec:
    return EventCodec(claims)


@pytest.fixture
def make_topic(settings: KafkaSettings) -> Callable[..., str]:
    """Create a fresh topic with the layout of a declared one (or 1 partition); return its name."""

    def make(like: str | None = None, partitions: int | None = None) -> str:
        base = topic_spec(like) if like else topic_spec(f"test-{uuid.uuid4().hex[:6]}")
        spec: TopicSpec = base.with_name(f"test-{uuid.uuid4().hex[:12]}")
        if partitions is not None:
            spec = TopicSpec(**{**_fields(spec), "partitions": partitions})
        ensure_topics(settings, [spec])
        return spec.name

    return make


def _fields(spec: TopicSpec) -> dict:
    return {name: getattr(spec, name) for name in spec.__struct_fields__}


def read_raw(settings: KafkaSettings, topic: str, isolation: str = "read_committed") -> list:
    """Every record of `topic` as raw confluent-kafka messages (no asearcher decoding)."""
    consumer = Consumer(
        settings.client(
            **{
                "group.id": f"raw-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "isolation.level": isolation,
                "enable.partition.eof": True,
            }
        )
    )
    metadata = consumer.list_topics(topic, timeout=30).topics[topic]
    partitions = [TopicPartition(topic, p, 0) for p in metadata.partitions]
    consumer.assign(partitions)
    pending, messages = {p.partition for p in partitions}, []
    while pending:
        message = consumer.poll(5.0)
        if message is None:
            break  # nothing for 5 s: the topic is drained
        if message.error():
            pending.discard(message.partition())  # end of this partition
        else:
            messages.append(message)
    consumer.close()
    return messages


def worker_command(script: str, *args: str) -> list[str]:
    """Run a helper process from tests/workers with this interpreter."""
    return [sys.executable, str(WORKERS / script), *args]


@pytest.fixture
def worker_env(broker: LocalBroker, tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ASEARCHER_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        # Workers import test plug-ins (tests.workers...) whatever directory pytest runs from.
        "PYTHONPATH": str(WORKERS.parents[1]),
    }


@pytest.fixture(scope="session")
def world_index(tmp_path_factory: pytest.TempPathFactory):
    """A 300-entity synthetic world, indexed with BM25 and dense retrieval."""
    from asearcher.consumers.tools.local_index import LocalIndex, build_index
    from asearcher.consumers.world.world import generate_world, write_world

    root = tmp_path_factory.mktemp("world")
    world = generate_world(seed=1, entities=300, questions=400)
    files = write_world(world, root)
    build_index(files["corpus"], root / "index", dense=True)
    return world, LocalIndex(root / "index")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A local S3 (moto) server, the way s3fs tests itself."""
    from moto.server import ThreadedMotoServer

    port = free_port_pair()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def readme_toml(containing: str) -> str:
    """The docs' TOML example that contains `containing` (documentation is tested)."""
    import re

    root = Path(__file__).parents[1]
    text = "".join(page.read_text() for page in [root / "README.md", *(root / "docs").glob("*.md")])
    [block] = [b for b in re.findall(r"```toml\n(.*?)```", text, re.DOTALL) if containing in b]
    return block


BROKER_FIXTURES = {"broker", "secure_broker"}  # fixtures that start a broker


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the ids, and before `-m`
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tiers, from what a test uses rather than by hand: `e2e` (marked slow), `kafka` (the
    session's broker among its fixtures), else `unit`; `pytest -m unit` is the fast tier."""
    for item in items:
        if any(item.get_closest_marker(m) for m in ("benchmark", "unit", "kafka", "e2e")):
            continue  # measured figures, or a tier given by hand (a broker started inline)
        if item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.e2e)
        elif BROKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kafka)
        else:
            item.add_marker(pytest.mark.unit)
    _xdist_groups(items)


def _xdist_groups(items: list[pytest.Item]) -> None:
    """Where each test runs under `-n 2 --dist loadgroup` (the README's test command).

    The suite waits on Kafka and on child processes for about half its time, so two workers
    fill each other's waits. Tests marked `whole_run` (a whole topology on both cores, timing
    its recoveries) run on one worker one after another, never two at once; every other module
    goes whole to whichever worker is free, so its module fixtures are built once."""
    for item in items:
        whole_run = item.get_closest_marker("whole_run") is not None
        group = "whole-runs" if whole_run else item.module.__name__
        item.add_marker(pytest.mark.xdist_group(group))


_CPU_LOG = cpu_log.from_env()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ASEARCHER_TEST_CPU_LOG set, log where the CPU went during each test."""
    if _CPU_LOG is not None:
        _CPU_LOG.start()
    yield
    if _CPU_LOG is not None:
        _CPU_LOG.finish(item.nodeid)
