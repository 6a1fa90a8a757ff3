"""The local cluster of three KRaft nodes (`stream up --brokers 3`): every topic replicated three
times with two copies in sync per write, a node lost without losing a write, and a run that
trains through the loss of its `trajectories` leader and a rolling restart of every node."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from asearcher.streams.cluster.admin import (
    cluster_status,
    ensure_topics,
    leading_node,
    under_replicated_partitions,
)
from asearcher.streams.cluster.local_broker import BrokerError, LocalBroker, port_open
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.service.run_status import latest_heartbeats
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.topics import TOPICS, TRAJECTORIES
from tests.conftest import free_port_pair
from tests.support.runs import EXPERT_RUN, Run, docs_hosts, run_trajectories, versions
from tests.support.waiting import wait_for

NODES = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    local = LocalBroker(
        tmp_path_factory.mktemp("cluster-home"), port=free_port_pair(2 * NODES), brokers=NODES
    )
    try:
        local.up()
        ensure_topics(local.admin_settings())
        yield local
    finally:
        local.down(purge=True)


def _topic_config(settings: KafkaSettings, topic: str, key: str) -> str:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = AdminClient(settings.client())  # held: a dropped client never completes its futures
    [future] = admin.describe_configs([resource]).values()
    return future.result()[key].value


@pytest.mark.kafka  # starts a cluster of its own
def test_three_nodes_hold_every_topic_three_times_with_two_copies_per_write(cluster) -> None:
    settings = cluster.admin_settings()
    status = cluster_status(settings)
    assert status.brokers == NODES and sorted(status.broker_addresses) == [1, 2, 3]
    assert status.bootstrap_servers.count(",") == NODES - 1
    placed = {topic.name: topic for topic in status.topics}
    for spec in TOPICS:
        assert placed[spec.name].replicas == 3, spec.name
        assert placed[spec.name].partitions == spec.partitions
        assert _topic_config(settings, spec.name, "min.insync.replicas") == "2", spec.name
    # Leadership is spread: no node leads every partition of the widest topic.
    assert len(placed[TRAJECTORIES].leaders) == NODES
    assert status.under_replicated == 0


@pytest.mark.kafka
def test_created_topics_are_known_with_leaders_to_every_node_once_ensure_topics_returns(
    cluster,
) -> None:
    settings = cluster.admin_settings()
    specs = [msgspec.structs.replace(spec, name=f"fresh-{uuid.uuid4().hex[:8]}-{spec.name}")
             for spec in TOPICS[:4]]  # fmt: skip
    assert sorted(ensure_topics(settings, specs)) == sorted(spec.name for spec in specs)
    for address in settings.bootstrap_servers.split(","):
        # One node asked alone, at once: none may still be learning of the new topics.
        known = (
            AdminClient(settings.client(**{"bootstrap.servers": address}))
            .list_topics(timeout=10)
            .topics
        )
        for spec in specs:
            partitions = known[spec.name].partitions.values()
            assert len(partitions) == spec.partitions and all(p.leader > 0 for p in partitions)


@pytest.mark.kafka
def test_a_node_lost_keeps_every_write_and_comes_back_in_sync(cluster) -> None:
    settings = cluster.admin_settings()
    leader = leading_node(settings, TRAJECTORIES)
    assert leader in (1, 2, 3)
    assert cluster.kill_node(leader) is not None
    try:
        producer = Producer(settings.client(**{"transactional.id": "cluster-test"}))
        producer.init_transactions(60)
        producer.begin_transaction()
        for partition in range(8):
            producer.produce(TRAJECTORIES, b"written with a node down", partition=partition)
        producer.commit_transaction(60)  # acks=all: two of three copies suffice
        status = cluster_status(settings)
        assert status.brokers == NODES - 1
        trajectories = next(t for t in status.topics if t.name == TRAJECTORIES)
        assert trajectories.under_replicated == 8 and -1 not in trajectories.leaders
        assert leader not in trajectories.leaders
    finally:
        cluster.start_node(leader)
    wait_for("every partition in sync again", lambda: under_replicated_partitions(settings) == 0,
             120)  # fmt: skip
    assert set(cluster.pids()) == {1, 2, 3}


@pytest.mark.kafka
def test_a_cluster_keeps_its_size_and_refuses_another(cluster) -> None:
    again = LocalBroker(cluster.home)  # what `stream up` without --brokers builds
    assert again.brokers == NODES and again.bootstrap_servers == cluster.bootstrap_servers
    with pytest.raises(BrokerError, match="formatted with 3 broker"):
        LocalBroker(cluster.home, brokers=1).up()


class _LastNodeFails(LocalBroker):
    """A cluster whose last node exits at once, as one whose port was taken would."""

    def _start(self, libs, node, cluster_id):
        if node.node_id == self.brokers:
            return node, subprocess.Popen(["false"])
        return super()._start(libs, node, cluster_id)


@pytest.mark.kafka  # starts nodes of its own
def test_a_node_that_cannot_start_takes_the_others_down_with_it(tmp_path: Path) -> None:
    """Left running, the nodes that did start would wait for their quorum forever (a rehearsal
    leaked two that way)."""
    local = _LastNodeFails(tmp_path / "home", port=free_port_pair(2 * NODES), brokers=NODES)
    with pytest.raises(BrokerError, match=f"node {NODES} exited during start-up"):
        local.up()
    assert local.pids() == {}
    assert not any(port_open(node.port) for node in local.nodes)


@pytest.mark.slow
@pytest.mark.whole_run  # a whole topology: one at a time (tests/conftest.py)
@pytest.mark.timeout(1200)
def test_a_run_trains_through_a_leader_kill_and_a_rolling_restart(tmp_path: Path) -> None:
    port = free_port_pair(2 * NODES)
    run = Run(tmp_path / "home", None, EXPERT_RUN)
    bootstrap = LocalBroker(tmp_path / "addresses", port=port, brokers=NODES).bootstrap_servers
    settings, codec = KafkaSettings(bootstrap_servers=bootstrap), EventCodec()
    report_file = tmp_path / "chaos.json"
    try:
        up = run.cli("stream", "up", "-c", str(run.config), "--port", str(port), "--brokers",
                     str(NODES), timeout=600)  # fmt: skip
        assert "3 nodes, replication 3" in up
        wait_for("2 weight versions", lambda: len(versions(settings, codec, run.name)) >= 2, 300)
        out = run.cli(
            "stream", "chaos", "--run", run.name, "--seconds", "60", "--every", "1e9",
            "--broker-restarts", "0", "--leader-kills", "1", "--rolling-restarts", "1",
            "--node-down", "10", "--baseline", "15", "--settle", "30", "--sample-every", "5",
            "--out", str(report_file), check=False, timeout=900,
        )  # fmt: skip
        report = json.loads(report_file.read_text())
        targets = [f["target"] for f in report["faults"]]
        assert targets == ["broker-1 (leader)", "brokers (rolling restart)"] or (
            len(targets) == 2 and "(leader)" in targets[0] and "rolling" in targets[1]
        ), out
        for fault in report["faults"]:
            assert fault["recovered_s"] is not None, out  # back, every partition in sync
        assert "next step after s" in out
        ledger = report["ledger"]
        assert ledger["violations"] == [] and ledger["trained"] > 0, out
        # The run trains on: a version after the faults, within minutes rather than the settle
        # window (a rehearsal under load saw the trainer's offset send hang in the rolling
        # restart, librdkafka #5456, until its watchdog restarted it 60 s later).
        wait_for("a version after the faults",
                 lambda: max(versions(settings, codec, run.name)) > ledger["newest_version"],
                 240)  # fmt: skip
        sampled = set(report["resources"]["samples"][0]["memory_mb"])
        assert {"broker-1", "broker-2", "broker-3"} <= sampled, sampled
        status = run.cli("stream", "status", "--run", run.name)
        assert "3 (1 at 127.0.0.1" in status, status
        assert "every guarantee holds" in run.cli("stream", "audit", "--run", run.name)
    finally:
        run.cli("stream", "down", check=False)


def _two_host_run(bucket: str) -> str:
    """The expert run with two producers, its stores on S3, placed on two hosts."""
    stores = f'store = "s3://{bucket}/weights"\nclaims = "s3://{bucket}/claims"\n'
    return stores + EXPERT_RUN.replace("[rollout]\n", "[rollout]\nreplicas = 2\n") + docs_hosts()


@pytest.mark.slow
@pytest.mark.whole_run
@pytest.mark.timeout(1500)
def test_a_run_spread_over_two_hosts_trains_on_the_cluster_with_shared_s3_stores(
    tmp_path: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two homes stand for two machines: the learner runs the trainer, tools, feeder and
    processors, the actors the rollout producers and the evaluator; both use one three-node
    cluster and one S3 weight and claim store, from one run config, as docs/cluster.md says."""
    import boto3

    for key, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
        ("AWS_ENDPOINT_URL", s3_endpoint),
    ):
        monkeypatch.setenv(key, value)  # what each machine's environment holds  # fmt: skip
    bucket = f"run-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket=bucket)
    port = free_port_pair(2 * NODES)
    brokers = Run(tmp_path / "kafka-host", None, EXPERT_RUN)
    bootstrap = LocalBroker(tmp_path / "addresses", port=port, brokers=NODES).bootstrap_servers
    learner = Run(tmp_path / "learner", bootstrap, _two_host_run(bucket))
    actors = Run(tmp_path / "actors", bootstrap, _two_host_run(bucket), name=learner.name)
    settings, codec = KafkaSettings(bootstrap_servers=bootstrap), EventCodec()
    try:
        brokers.cli("stream", "up", "--broker-only", "--brokers", str(NODES), "--port", str(port))
        learner.cli("stream", "up", "-c", str(learner.config), "--host", "learner", timeout=600)
        actors.cli("stream", "up", "-c", str(actors.config), "--host", "actors", timeout=600)
        assert set(learner.pids()) == {"tools-0", "trainer", "feeder", "eval-processor", "metrics"}
        assert set(actors.pids()) == {"rollout-0", "rollout-1", "evaluator-0"}
        wait_for("3 weight versions", lambda: len(versions(settings, codec, learner.name)) >= 3,
                 420)  # fmt: skip
        assert run_trajectories(settings, codec, learner.name)
        beats = latest_heartbeats(settings, codec)
        for producer in (f"{learner.name}-rollout-0", f"{learner.name}-rollout-1"):
            assert beats[producer].counters["groups"] > 0, beats[producer]  # both hosts' share
        listed = s3.list_objects_v2(Bucket=bucket, Prefix="weights/").get("KeyCount", 0)
        assert listed > 0  # the trainer's versions, loaded by the actors' producers from there
        learner.down()
        actors.down()
        audit = learner.call("stream", "audit", "--run", learner.name)
        assert audit.returncode == 0 and "every guarantee holds" in audit.stdout, audit.stdout
    finally:
        for run in (actors, learner):
            run.down()
        brokers.cli("stream", "down", check=False)


def test_each_fault_is_timed_to_the_first_step_after_it() -> None:
    from asearcher.cli.jobs.chaos import next_step_after

    steps = [(100.0, 16), (130.5, 16), (190.0, 16)]
    assert next_step_after(steps, 120.0) == 10.5
    assert next_step_after(steps, 130.5) == 59.5  # a step at the fault's instant came before it
    assert next_step_after(steps, 200.0) is None  # nothing trained after it


def test_cluster_faults_are_spread_evenly_leader_kills_first() -> None:
    from asearcher.cli.jobs.chaos import ChaosPlan

    plan = ChaosPlan(seconds=400, leader_kills=2, rolling_restarts=1, broker_restarts=1)
    assert plan.cluster_faults() == [
        (80.0, "leader"), (160.0, "leader"), (240.0, "rolling"), (320.0, "broker")
    ]  # fmt: skip


def test_leader_kills_need_a_local_cluster_of_three(tmp_path: Path) -> None:
    from asearcher.cli.jobs.chaos import Chaos, ChaosPlan
    from asearcher.streams.service.supervisor import RunSupervisor

    plan = ChaosPlan(leader_kills=1, broker_restarts=0)
    single = LocalBroker(tmp_path / "home", port=free_port_pair())
    with pytest.raises(ValueError, match="need a local cluster of 3 nodes"):
        Chaos(RunSupervisor(tmp_path / "run"), single, plan)
