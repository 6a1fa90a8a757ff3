"""The `asearcher` command as a user runs it: stream up/down/status, errors, help."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asearcher.streams.cluster.settings import kafka_settings
from asearcher.streams.io.consumer import EventConsumer
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import EVENT_TYPES, RolloutRequested
from asearcher.streams.wire.topics import ROLLOUT_REQUESTS, TOPICS
from tests.conftest import free_port_pair

ASEARCHER = shutil.which("asearcher", path=str(Path(sys.executable).parent)) or "asearcher"


def cli(*args: str, home: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "ASEARCHER_HOME": str(home), "COLUMNS": "200"}
    env.pop("ASEARCHER_BOOTSTRAP_SERVERS", None)
    result = subprocess.run(
        [ASEARCHER, *args], env=env, capture_output=True, text=True, timeout=180, cwd="/"
    )
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def row(status_output: str, topic: str) -> list[str]:
    """The cells of `topic`'s row in the status tables."""
    for line in status_output.splitlines():
        cells = [c.strip() for c in line.replace("┃", "│").split("│") if c.strip()]
        if cells and cells[0] == topic:
            return cells
    raise AssertionError(f"{topic} not in status:\n{status_output}")


@pytest.mark.slow
def test_stream_up_twice_down_up_keeps_data_and_status_counts(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port_pair()
    try:
        assert (
            "started" in cli("stream", "up", "--broker-only", "--port", str(port), home=home).stdout
        )
        again = cli("stream", "up", "--broker-only", "--port", str(port), home=home).stdout
        assert "already up" in again and "all topics exist" in again

        settings = kafka_settings(home=home)
        assert settings.bootstrap_servers == f"127.0.0.1:{port}"
        codec = EventCodec()
        with EventProducer(settings, codec) as producer:
            for i in range(5):
                request = RolloutRequested(question_id=f"q{i}", group_id=f"g{i}", question="?")
                producer.send(ROLLOUT_REQUESTS, request)
        with EventConsumer(settings, "cli-test", [ROLLOUT_REQUESTS], codec) as consumer:
            consumer.run(lambda r: None, max_messages=2, timeout=30)

        status = cli("stream", "status", home=home).stdout
        assert row(status, ROLLOUT_REQUESTS)[1:] == ["4", "1", "1:4", "5"]  # replicas, leaders
        assert all(row(status, spec.name) for spec in TOPICS)
        assert row(status, "cli-test")[1:4] == ["empty", "0", "3"]  # 3 of 5 not consumed

        assert "stopped" in cli("stream", "down", home=home).stdout
        stopped = cli("stream", "status", home=home, check=False)
        assert stopped.returncode == 2
        assert stopped.stderr.strip() == (
            "asearcher: error: the local broker is not running: start it with `asearcher stream up`"
        )

        assert (
            "started" in cli("stream", "up", "--broker-only", home=home).stdout
        )  # the recorded port is kept
        assert row(cli("stream", "status", home=home).stdout, ROLLOUT_REQUESTS)[1:] == [
            "4",
            "1",
            "1:4",
            "5",
        ]
    finally:
        cli("stream", "down", "--purge", home=home, check=False)
    assert not (home / "kafka").exists()


def test_bad_settings_are_one_line_errors_naming_the_setting(tmp_path: Path) -> None:
    bad = cli("stream", "status", "-X", "no-equals-sign", home=tmp_path, check=False)
    assert bad.returncode == 2
    assert (
        bad.stderr.strip()
        == "asearcher: error: --kafka-config expects key=value, got 'no-equals-sign'"
    )
    level = cli("--log-level", "LOUD", "stream", "status", home=tmp_path, check=False)
    assert level.returncode == 2 and "--log-level" in level.stderr


def test_help_runs_from_any_directory_and_lists_every_command(tmp_path: Path) -> None:
    result = cli("--help", home=tmp_path)
    for command in ("stream", "schema", "replay", "demo"):
        assert command in result.stdout
    assert "up" in cli("stream", "--help", home=tmp_path).stdout
    assert cli("--version", home=tmp_path).stdout.startswith("asearcher ")


def test_schema_export_writes_a_schema_per_event(tmp_path: Path) -> None:
    cli("schema", "export", str(tmp_path / "schemas"), home=tmp_path)
    written = sorted(p.name for p in (tmp_path / "schemas").iterdir())
    assert "TrajectoryFinished.schema.json" in written and "topics.json" in written
    assert len(written) == len(EVENT_TYPES) + 1  # one per kind, plus topics.json
