"""Access control on the local broker (`stream up --secure`): SASL/SCRAM logins and ACLs.

One secure broker of this module's own, in a temporary home: the admin creates the topics and
every principal's rights, then each service principal tries what it may and may not do.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from asearcher.cli.run import topology
from asearcher.streams.cluster import acl
from asearcher.streams.cluster.admin import cluster_status, ensure_topics
from asearcher.streams.cluster.local_broker import BrokerError, LocalBroker
from asearcher.streams.cluster.settings import BROKER_FILE, KafkaSettings
from asearcher.streams.io.intake import OutOfOrderIntake
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.io.tail import read_to_end
from asearcher.streams.service.supervisor import Program
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import EvalResult, RolloutRequested, WeightsPublished
from asearcher.streams.wire.records import Outgoing, Record
from asearcher.streams.wire.topics import EVAL_RESULTS, ROLLOUT_REQUESTS, TRAJECTORIES, WEIGHTS
from tests.conftest import free_port_pair
from tests.support.rollout import events_of
from tests.support.runs import EXPERT_RUN, Run, versions
from tests.support.samples import trajectory
from tests.support.waiting import wait_for

GROUPS = acl.ServiceGroups(trainer=("acl-trainer",), rollout=("acl-rollout",), tools=("acl-tools",))


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    broker = LocalBroker(tmp_path_factory.mktemp("secure-home"), port=free_port_pair(), secure=True)
    try:
        broker.up()
    except BrokerError as exc:
        pytest.fail(f"could not start the secure local broker: {exc}")
    try:
        ensure_topics(broker.admin_settings())
        acl.provision(broker.admin_settings(), GROUPS)
        yield broker
    finally:
        broker.down(purge=True)


def as_(broker: LocalBroker, principal: str) -> KafkaSettings:
    return acl.as_principal(broker.admin_settings(), broker.home, principal)


def delivery_errors(
    settings: KafkaSettings, topic: str, value: bytes, idempotent: bool = True
) -> list[KafkaError | None]:
    """Produce one record with a bare client; the delivery report's error (None: delivered)."""
    reports: list[KafkaError | None] = []
    producer = Producer(settings.client(**{"enable.idempotence": idempotent}))
    producer.produce(topic, value=value, key=b"k", on_delivery=lambda err, _: reports.append(err))
    producer.flush(30)
    return reports


def poll_until(intake: OutOfOrderIntake, wanted: int, timeout_s: float = 30.0) -> list[Record]:
    records: list[Record] = []
    deadline = time.monotonic() + timeout_s
    while len(records) < wanted and time.monotonic() < deadline:
        records += intake.poll(10)
        time.sleep(0.05)
    return records


def test_rollout_principal_publishing_weights_is_refused_on_delivery(secure_broker) -> None:
    [error] = delivery_errors(as_(secure_broker, acl.ROLLOUT), WEIGHTS, b"not a policy")
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_trainer_principal_publishes_weights_in_its_transaction(secure_broker) -> None:
    codec, trainer = EventCodec(), as_(secure_broker, acl.TRAINER)
    with EventProducer(as_(secure_broker, acl.ROLLOUT), codec) as rollout:
        rollout.send(TRAJECTORIES, trajectory(random.Random(0), tokens=16, group_id="g-acl"))
    # The trainer's real path: read in its group, publish and commit offsets in one transaction.
    intake = OutOfOrderIntake(trainer, codec, "acl-trainer", TRAJECTORIES, "trainer-acl")
    try:
        records = poll_until(intake, 1)
        published = WeightsPublished(model="acl", version=1, uri="file:///w", sha256="0", step=1)
        assert intake.commit([Outgoing(WEIGHTS, published)], records)
    finally:
        intake.kafka.close()
    # It reads the weights topic back to resume from the last announced version.
    # (Read again while the broker is busy: a SASL handshake may time out on a loaded machine.)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        announced = [r.event for r in read_to_end(trainer, codec, WEIGHTS, timeout_s=30)]
        if published in announced:
            break
    assert published in announced


def test_feeder_requests_reach_the_rollout_group_transactionally(secure_broker) -> None:
    codec = EventCodec()
    with EventProducer(as_(secure_broker, acl.FEEDER), codec, transactional_id="feeder-acl") as f:
        f.kafka.init_transactions()
        f.kafka.begin_transaction()
        f.send(ROLLOUT_REQUESTS, RolloutRequested(question_id="q", group_id="g-req", question="?"))
        f.kafka.commit_transaction()
    rollout = as_(secure_broker, acl.ROLLOUT)
    intake = OutOfOrderIntake(rollout, codec, "acl-rollout", ROLLOUT_REQUESTS, "rollout-acl")
    try:
        records = poll_until(intake, 1)
        step = trajectory(random.Random(1), tokens=8, group_id="g-req")
        assert intake.commit([Outgoing(TRAJECTORIES, step)], records)
    finally:
        intake.kafka.close()


def test_a_service_principal_cannot_grant_itself_rights(secure_broker) -> None:
    with pytest.raises(KafkaException, match="creating ACL") as refused:
        acl.provision(as_(secure_broker, acl.ROLLOUT), GROUPS)
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_tool_worker_principal_cannot_read_trajectories(secure_broker) -> None:
    tools = as_(secure_broker, acl.TOOLS)
    consumer = Consumer(tools.client(**{"group.id": "acl-tools", "enable.auto.commit": False}))
    try:
        # Its own group would let it join: the topic is what it may not read.
        consumer.subscribe([TRAJECTORIES])
        deadline, error = time.monotonic() + 20, None
        while error is None and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            assert message is None or message.error() is not None, "tools read a trajectory"
            error = message.error() if message is not None else None
        assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        consumer.close()


def client_error(config: dict[str, str], timeout_s: float = 10.0) -> KafkaError | None:
    """The first error a client reports while it tries to reach the cluster."""
    errors: list[KafkaError] = []
    producer = Producer({**config, "error_cb": errors.append})
    deadline = time.monotonic() + timeout_s
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    return errors[0] if errors else None


def test_unauthenticated_and_wrong_password_clients_are_refused(secure_broker) -> None:
    anonymous = AdminClient({"bootstrap.servers": secure_broker.bootstrap_servers})
    with pytest.raises(KafkaException):
        anonymous.list_topics(timeout=3)
    intruder = acl.client_options(acl.TRAINER, "not-the-password")
    error = client_error({"bootstrap.servers": secure_broker.bootstrap_servers, **intruder})
    assert error is not None and error.code() == KafkaError._AUTHENTICATION


def test_reader_sees_topics_and_groups_but_writes_nothing(secure_broker) -> None:
    reader = as_(secure_broker, acl.READER)
    status = cluster_status(reader)
    assert {t.name for t in status.topics} >= {TRAJECTORIES, WEIGHTS}
    assert "acl-rollout" in {g.group_id for g in status.groups}
    # Not idempotent: without any WRITE right its producer id would already be refused.
    [error] = delivery_errors(reader, TRAJECTORIES, b"x", idempotent=False)
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_secrets_stay_in_owner_only_files_out_of_config_and_logs(secure_broker) -> None:
    home = secure_broker.home
    record = json.loads((home / BROKER_FILE).read_text())
    assert record["secure"] is True
    for principal in (acl.ADMIN, *acl.SERVICE_PRINCIPALS):
        assert acl.credentials_file(home, principal).stat().st_mode & 0o777 == 0o600
    assert (secure_broker.dir / "server.properties").stat().st_mode & 0o777 == 0o600
    passwords = acl.ensure_credentials(home, acl.SERVICE_PRINCIPALS)
    logs = "".join(p.read_text(errors="replace") for p in secure_broker.logs_dir.iterdir())
    config = (secure_broker.dir / "server.properties").read_text()
    for password in [*passwords.values(), acl.ensure_credentials(home, [acl.ADMIN])["admin"]]:
        assert password not in logs and password not in json.dumps(record)
    assert not any(password in config for password in passwords.values())


def test_local_clients_log_in_as_admin_unless_a_credentials_file_is_named(tmp_path) -> None:
    assert acl.credential_options(tmp_path, environ={}) == {}
    (tmp_path / BROKER_FILE).write_text(json.dumps({"secure": True}))
    acl.ensure_credentials(tmp_path, [acl.ADMIN, acl.TOOLS])
    assert acl.credential_options(tmp_path, environ={})["sasl.username"] == acl.ADMIN
    named = {acl.ENV_CREDENTIALS: str(acl.credentials_file(tmp_path, acl.TOOLS))}
    options = acl.credential_options(tmp_path, environ=named)
    assert options["sasl.username"] == acl.TOOLS
    assert options["security.protocol"] == "SASL_PLAINTEXT"


def test_each_program_gets_its_own_credentials_path_and_no_inherited_login(
    tmp_path, monkeypatch
) -> None:
    (tmp_path / BROKER_FILE).write_text(json.dumps({"secure": True}))
    monkeypatch.setenv("ASEARCHER_KAFKA_SASL_PASSWORD", "operator-secret")
    admin = KafkaSettings(bootstrap_servers="127.0.0.1:1", client_config={
        **acl.client_options(acl.ADMIN, "admin-secret"), "linger.ms": "5"})  # fmt: skip
    env = topology.service_env(admin, tmp_path, "file:///claims")
    assert "admin-secret" not in env.values() and "operator-secret" not in env.values()
    assert env["ASEARCHER_KAFKA_LINGER_MS"] == "5"
    names = ["tools-0", "trainer", "rollout-0", "rollout-1", "feeder"]
    programs = [Program(name=name, command=["python", "-m", "x"]) for name in names]
    secured = topology.with_credentials(programs, tmp_path)
    principals = ["tools", "trainer", "rollout", "rollout", "feeder"]
    for program, principal in zip(secured, principals, strict=True):
        path = acl.credentials_file(tmp_path, principal)
        assert program.command[1:] == [f"{acl.ENV_CREDENTIALS}={path}", "python", "-m", "x"]


def test_secure_is_refused_for_a_broker_formatted_without_it(tmp_path: Path) -> None:
    (tmp_path / "kafka" / "data").mkdir(parents=True)
    (tmp_path / "kafka" / "data" / "meta.properties").write_text("cluster.id=x\n")
    (tmp_path / BROKER_FILE).write_text(json.dumps({"port": 1, "secure": False}))
    with pytest.raises(BrokerError, match="--purge"):
        LocalBroker(tmp_path, secure=True).up()


def test_a_restarted_broker_stays_secure_without_the_flag(secure_broker) -> None:
    secure_broker.down()
    again = LocalBroker(secure_broker.home)  # what `stream up` without --secure builds
    assert again.secure
    assert again.up()
    [error] = delivery_errors(as_(again, acl.FEEDER), WEIGHTS, b"not a policy")
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert delivery_errors(as_(again, acl.TRAINER), WEIGHTS, b"a policy") == [None]


@pytest.mark.slow
@pytest.mark.whole_run  # a whole topology: one at a time (tests/conftest.py)
@pytest.mark.timeout(900)
def test_a_secure_run_trains_and_evaluates_every_service_as_its_own_principal(
    tmp_path: Path,
) -> None:
    """`stream up --secure` of a run with evaluators and both processors: each logs in as its
    own principal with least rights, and the run trains, evaluates and audits clean."""
    port = free_port_pair()
    run = Run(tmp_path / "home", None, EXPERT_RUN)
    try:
        run.cli("stream", "up", "-c", str(run.config), "--port", str(port), "--secure",
                timeout=600)  # fmt: skip
        admin = LocalBroker(run.home).admin_settings()
        codec = EventCodec()
        wait_for("2 weight versions", lambda: len(versions(admin, codec, run.name)) >= 2, 300)
        wait_for("an evaluation result",
                 lambda: any(isinstance(e, EvalResult) and e.model == run.name
                             for e in events_of(admin, codec, EVAL_RESULTS)), 300)  # fmt: skip
        conf = run.supervisor.conf.read_text()
        for program, principal in (("evaluator-0", acl.ROLLOUT), ("eval-processor", acl.PROCESSOR),
                                   ("metrics", acl.PROCESSOR)):  # fmt: skip
            assert f"{principal}.properties" in _program_command(conf, program), program
        assert "every guarantee holds" in run.cli("stream", "audit", "--run", run.name)
    finally:
        run.cli("stream", "down", check=False)


def _program_command(supervisord_conf: str, program: str) -> str:
    """The command line of `program` in a supervisord config."""
    section = supervisord_conf.split(f"[program:{program}]", 1)[1].split("\n[", 1)[0]
    return next(line for line in section.splitlines() if line.startswith("command="))
