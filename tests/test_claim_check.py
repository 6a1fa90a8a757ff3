"""Events too large for a Kafka message travel through the claim check and come back equal."""

from __future__ import annotations

import random
import time
from pathlib import Path

import boto3
import msgspec
import pytest

from asearcher.streams.io.consumer import EventConsumer
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.storage.claimcheck import ClaimCheckError, ClaimCheckStore
from asearcher.streams.wire.codec import EventCodec, EventDecodeError, header_value
from asearcher.streams.wire.events import ClaimCheck, TrajectoryFinished
from asearcher.streams.wire.topics import MAX_MESSAGE_BYTES
from tests.conftest import read_raw
from tests.support.samples import trajectory


@pytest.fixture
def s3_store(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> ClaimCheckStore:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    bucket = f"claims-{time.time_ns()}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    options = {"client_kwargs": {"endpoint_url": s3_endpoint}}
    return ClaimCheckStore(f"s3://{bucket}/big", storage_options=options)


def big_trajectory() -> TrajectoryFinished:
    # ~150k tokens: well over the 1 MiB message limit even as MessagePack.
    return trajectory(random.Random(3), tokens=150_000, answer="Avalon", reward=1.0)


def round_trip(settings, topic: str, codec: EventCodec, event) -> tuple[object, list]:
    with EventProducer(settings, codec) as producer:
        producer.send(topic, event)
    [raw] = read_raw(settings, topic)
    with EventConsumer(settings, f"cc-{time.time_ns()}", [topic], codec) as consumer:
        received = []
        consumer.run(lambda r: received.append(r.event), max_messages=1, timeout=30)
    return received[0], raw


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_payload_over_the_message_limit_goes_through_the_claim_check_and_back(
    settings, make_topic, claims, request, backend
) -> None:
    store = claims if backend == "file" else request.getfixturevalue("s3_store")
    codec, event = EventCodec(store), big_trajectory()
    assert len(codec._encoder.encode(event)) > MAX_MESSAGE_BYTES
    received, raw = round_trip(settings, make_topic(), codec, event)
    assert received == event
    assert len(raw.value()) < 2048  # only the reference travelled
    reference = msgspec.msgpack.decode(raw.value(), type=ClaimCheck)
    assert reference.uri.startswith(f"{backend}://")
    assert header_value(raw.headers(), "claim-check") == reference.uri
    assert header_value(raw.headers(), "kind") == "TrajectoryFinished"


def test_small_events_travel_inline(settings, make_topic, claims) -> None:
    event = trajectory(random.Random(4), tokens=100)
    received, raw = round_trip(settings, make_topic(), EventCodec(claims), event)
    assert received == event
    assert header_value(raw.headers(), "claim-check") is None


def test_a_tampered_claimed_payload_is_dead_lettered_not_trusted(
    settings, make_topic, claims
) -> None:
    topic, codec = make_topic(), EventCodec(claims)
    with EventProducer(settings, codec) as producer:
        producer.send(topic, big_trajectory())
    [raw] = read_raw(settings, topic)
    reference = msgspec.msgpack.decode(raw.value(), type=ClaimCheck)
    path = reference.uri.removeprefix("file://")
    with open(path, "r+b") as stored:
        stored.write(b"\x00")
    with EventConsumer(settings, f"tamper-{time.time_ns()}", [topic], codec) as consumer:
        stats = consumer.run(lambda r: None, max_messages=1, timeout=30)
    assert stats.dead_lettered == 1 and stats.handled == 0


def test_commands_resolve_a_run_s_claim_checks_from_the_run_s_own_store(
    settings, make_topic, tmp_path
) -> None:
    """A run's services write claim checks into <home>/runs/<name>/claims; replay (and every
    command reading with the CLI's codec: audit, sft, evaluation) finds them there."""
    import json

    from typer.testing import CliRunner

    from asearcher.cli.app import app
    from asearcher.streams.cluster.settings import reading_claim_store

    home = tmp_path / "home"
    run_claims = ClaimCheckStore((home / "runs" / "r1" / "claims").as_uri(), threshold_bytes=1024)
    topic = make_topic(like="trajectories")
    event = trajectory(random.Random(4), tokens=2_000, answer="Avalon", reward=1.0)
    with EventProducer(settings, EventCodec(run_claims)) as producer:
        producer.send(topic, event)
    [raw] = read_raw(settings, topic)
    reference = header_value(raw.headers(), "claim-check")
    assert reference is not None and reference.startswith(run_claims.base_url)

    # The default store alone refuses it; the store the CLI reads with resolves it.
    types = (TrajectoryFinished,)
    default_only = EventCodec(ClaimCheckStore((home / "claims").as_uri()))
    with pytest.raises(EventDecodeError, match="outside the claims store"):
        default_only.decode(raw.value(), raw.headers(), types)
    assert EventCodec(reading_claim_store(None, home)).decode(raw.value(), raw.headers(), types)
    cluster = ["--bootstrap-servers", settings.bootstrap_servers, "--home", str(home)]
    runner = CliRunner()
    listed = runner.invoke(app, ["replay", topic, *cluster], terminal_width=200)
    assert listed.exit_code == 0, listed.output
    assert "TrajectoryFinished" in listed.output and "DeadLetter" not in listed.output
    out = tmp_path / "export.jsonl"
    exported = runner.invoke(app, ["replay", topic, "--export", out.as_uri(), *cluster])
    assert exported.exit_code == 0, exported.output
    [line] = out.read_text().splitlines()
    assert json.loads(line)["event"]["answer"] == "Avalon"


def test_a_run_whose_config_names_a_shared_claims_store_is_read_from_it(tmp_path: Path) -> None:
    """A run over several hosts keeps its claim checks in the store its config names (S3 in
    practice); every command reading with the CLI's codec finds them through the saved config."""
    from asearcher.cli.run.config import RunConfig, paths, write_run_config
    from asearcher.cli.wiring import ClusterOptions

    home, shared = tmp_path / "home", (tmp_path / "shared-claims").as_uri()
    config = RunConfig(name="spread", claims=shared)
    where = paths(config, home)
    assert where.claims == shared
    write_run_config(config, where)
    store = ClaimCheckStore(shared, threshold_bytes=1024)
    payload = b"x" * 4096
    check = store.put(payload, "application/msgpack", "TrajectoryFinished")
    claims = ClusterOptions(None, None, str(home)).codec().claims
    assert claims is not None and claims.get(check) == payload
    with pytest.raises(ClaimCheckError):  # the home's own store alone does not hold it
        ClaimCheckStore((home / "claims").as_uri()).get(check)
