"""Every mistake at the command line is one line on stderr and exit status 2, never a traceback.

The real `asearcher` binary runs in a subprocess, so what is checked is what a user sees: the
entry point's error handling included.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from asearcher.consumers.tools.backends import ToolError
from asearcher.consumers.tools.toolbox import load_tool_config
from asearcher.consumers.tools.url_safety import UrlPolicy, check_url
from asearcher.streams.cluster.preflight import missing_topics
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import RolloutRequested
from tests.support.rollout import events_of
from tests.support.runs import ASEARCHER


def cli(
    *args: str, home: Path, bootstrap: str | None = None, **extra_env: str
) -> subprocess.CompletedProcess:
    # PYTHONPATH: tool configs may name test plug-ins (tests.workers...).
    env = {**os.environ, "ASEARCHER_HOME": str(home), "COLUMNS": "200",
           "PYTHONPATH": str(Path(__file__).parents[1]), **extra_env}  # fmt: skip
    env.pop("ASEARCHER_BOOTSTRAP_SERVERS", None)
    if bootstrap is not None:
        env["ASEARCHER_BOOTSTRAP_SERVERS"] = bootstrap
    return subprocess.run(
        [ASEARCHER, *args], env=env, capture_output=True, text=True, timeout=120, cwd="/"
    )


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The error line, once it is certain there is exactly one and the status is 2."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("asearcher: error: "), lines[0]
    return lines[0].removeprefix("asearcher: error: ")


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- usage errors from the argument parser --------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--bogus"], "No such option: --bogus (see `asearcher --help`)"),
        (["stream", "status", "--bogus"], "No such option: --bogus"),
        (["replay"], "Missing argument 'topics'"),
        (["stream", "up", "--port", "abc"], "Invalid value for '--port'"),
        (["replay", "x", "--from-offset", "-1"], "Invalid value for '--from-offset'"),
    ],
)
def test_usage_error_is_one_line_and_exit_2(args: list[str], expected: str, tmp_path) -> None:
    assert expected in one_line_error(cli(*args, home=tmp_path))


def test_no_arguments_prints_help_without_a_traceback(tmp_path) -> None:
    result = cli(home=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stdout + result.stderr
    assert "Usage: asearcher" in result.stdout


@pytest.mark.parametrize("version", ["abc", "-1", "1.5"])
def test_weights_show_with_a_non_number_names_it_in_one_line(version: str, tmp_path) -> None:
    # After `--` a leading dash is the argument's, not an option's.
    error = one_line_error(cli("weights", "show", "--", version, home=tmp_path))
    assert error == f"a version is a whole number such as 3, not {version!r}"


@pytest.mark.parametrize(
    "command",
    [["schema", "export", "OUT"], ["world", "generate", "--out", "OUT", "--entities", "20"],
     ["index", "build", "--corpus", "CORPUS", "--out", "OUT", "--no-dense"]],
)  # fmt: skip
def test_command_writing_under_a_regular_file_is_one_line(command: list[str], tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text('{"url": "u", "title": "t", "contents": "c"}\n')
    places = {"OUT": str(blocker / "out"), "CORPUS": str(blocker)}
    error = one_line_error(cli(*[places.get(arg, arg) for arg in command], home=tmp_path))
    assert str(blocker / "out") in error and "Not a directory" in error


def test_world_generate_with_too_few_entities_is_one_line(tmp_path) -> None:
    result = cli(
        "world", "generate", "--out", str(tmp_path / "w"), "--entities", "-5", home=tmp_path
    )
    assert one_line_error(result) == "entities must be at least 20, got -5"


# -- config files and values ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["tools", "serve"], ["rollout", "serve"], ["train", "serve"], ["feed", "serve"],
     ["stream", "up"]],
)  # fmt: skip
@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_config_file_missing_or_a_directory_is_one_line(command, kind: str, tmp_path) -> None:
    path = tmp_path / "conf.toml"
    if kind == "directory":
        path.mkdir()
    error = one_line_error(cli(*command, "-c", str(path), home=tmp_path / "home"))
    assert str(path) in error


@pytest.mark.parametrize(
    ("line", "field"),
    [("max_concurrency = 0", "max_concurrency"), ("top_k = -1", "top_k"),
     ("call_timeout_s = nan", "call_timeout_s"), ("chunk_chars = 0", "chunk_chars")],
)  # fmt: skip
def test_tool_config_value_that_cannot_work_is_refused_naming_the_field(
    line: str, field: str, tmp_path
) -> None:
    config = tmp_path / "tools.toml"
    config.write_text(line + "\n")
    with pytest.raises(ValueError, match=field):
        load_tool_config(config)
    error = one_line_error(cli("tools", "serve", "-c", str(config), home=tmp_path))
    assert error.startswith(f"tool config {config}: {field} must be")


def test_tool_concurrency_and_k_flags_below_one_are_refused(tmp_path) -> None:
    assert "max_concurrency must be at least 1, got 0" in one_line_error(
        cli("tools", "serve", "--concurrency", "0", home=tmp_path)
    )
    assert "top_k must be at least 1, got -1" in one_line_error(
        cli("search", "anything", "-k", "-1", home=tmp_path)
    )


def test_rollout_config_with_nan_drain_timeout_is_refused_naming_the_field(tmp_path) -> None:
    config = tmp_path / "rollout.toml"
    config.write_text("drain_timeout_s = nan\n")
    error = one_line_error(cli("rollout", "serve", "-c", str(config), home=tmp_path))
    assert "drain_timeout_s must be a finite number" in error


def test_train_serve_max_steps_below_one_is_refused_at_once(tmp_path) -> None:
    started = time.monotonic()
    error = one_line_error(cli("train", "serve", "--max-steps", "0", home=tmp_path))
    assert error.startswith("--max-steps must be at least 1, got 0")
    assert time.monotonic() - started < 30


# -- the cluster ---------------------------------------------------------------------------------

# The default wait is 20 s (a remote SASL/TLS handshake); the same check, shorter, saves a minute.
QUICK_REACH = {"ASEARCHER_REACH_TIMEOUT_S": "3"}


def test_the_default_wait_for_an_unreachable_broker_is_20_s(tmp_path) -> None:
    started = time.monotonic()
    address = f"127.0.0.1:{unused_port()}"
    error = one_line_error(cli("stream", "status", home=tmp_path, bootstrap=address))
    assert error.startswith(f"cannot reach Kafka at {address} within 20 s: ")
    assert 19 < time.monotonic() - started < 30


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", "soon"])
def test_a_bad_reach_timeout_is_refused_naming_the_variable(value: str, tmp_path) -> None:
    address = f"127.0.0.1:{unused_port()}"
    error = one_line_error(cli("stream", "status", home=tmp_path, bootstrap=address,
                               ASEARCHER_REACH_TIMEOUT_S=value))  # fmt: skip
    assert error == (
        f"ASEARCHER_REACH_TIMEOUT_S must be a positive number of seconds, got {value!r}"
    )


@pytest.mark.parametrize(
    "command",
    [["replay", "rollout.requests"], ["stream", "status"], ["rollout", "request", "--limit", "1"]],
)
def test_command_pointed_at_an_unreachable_broker_says_so_once_within_30_s(
    command: list[str], tmp_path
) -> None:
    address = f"127.0.0.1:{unused_port()}"
    if command[0] == "rollout":
        qa = tmp_path / "qa.jsonl"
        qa.write_text('{"id": "q", "question": "who?", "answers": ["me"]}\n')
        command = [*command, "--qa", str(qa)]
    started = time.monotonic()
    error = one_line_error(cli(*command, home=tmp_path, bootstrap=address, **QUICK_REACH))
    assert time.monotonic() - started < 12
    assert error.startswith(f"cannot reach Kafka at {address} within 3 s: ")
    assert "Connection refused" in error
    assert error.endswith("(bootstrap servers from ASEARCHER_BOOTSTRAP_SERVERS)")


@pytest.mark.parametrize("via", ["flag", "local broker record"])
def test_tool_worker_pointed_at_an_unreachable_broker_says_so_once_within_30_s(
    via: str, tmp_path
) -> None:
    config = tmp_path / "tools.toml"
    config.write_text('search = "tests.workers.slow_search:SlowSearch"\nreader = "http"\n')
    address = f"127.0.0.1:{unused_port()}"
    flag = ["-b", address] if via == "flag" else []
    record = tmp_path / "broker.json"  # what `stream up` leaves for a broker now stopped
    record.write_text(f'{{"bootstrap_servers": "{address}"}}')
    started = time.monotonic()
    result = cli("tools", "serve", "-c", str(config), *flag, home=tmp_path, **QUICK_REACH)
    assert time.monotonic() - started < 12
    error = one_line_error(result)
    assert error.startswith(f"cannot reach Kafka at {address}")
    origin = "--bootstrap-servers" if via == "flag" else f"the local broker recorded in {record}"
    assert error.endswith(f"(bootstrap servers from {origin})")


# -- replay ---------------------------------------------------------------------------------------


@pytest.fixture
def requests_topic(settings, codec, make_topic) -> str:
    topic = make_topic(like="rollout.requests", partitions=1)
    with EventProducer(settings, codec) as producer:
        for number in range(3):
            producer.send(topic, RolloutRequested(question_id=f"q{number}", group_id="g",
                                                  question="?"))  # fmt: skip
    return topic


def test_replay_of_a_missing_topic_names_it_in_one_line(settings, tmp_path) -> None:
    missing = f"no-such-{uuid.uuid4().hex[:6]}"
    result = cli("replay", missing, home=tmp_path, bootstrap=settings.bootstrap_servers)
    error = one_line_error(result)
    assert error.startswith(f"no topic {missing!r} on {settings.bootstrap_servers}")


@pytest.mark.parametrize(
    ("target", "reason"),
    [("file://{tmp}/a-file/export.jsonl", "File exists"),
     ("nosuchproto://bucket/export.jsonl", "Protocol not known")],
)  # fmt: skip
def test_replay_export_to_an_unwritable_url_is_one_line(
    settings, requests_topic, target: str, reason: str, tmp_path
) -> None:
    (tmp_path / "a-file").write_text("a file where a directory would be\n")
    target = target.format(tmp=tmp_path)
    result = cli("replay", requests_topic, "--export", target, home=tmp_path,
                 bootstrap=settings.bootstrap_servers)  # fmt: skip
    error = one_line_error(result)
    assert error.startswith(f"cannot write {target}: ") and reason in error


def test_replay_to_a_missing_topic_asks_for_create_then_creates_it(
    settings, requests_topic, tmp_path
) -> None:
    target = f"{requests_topic}-copy"
    run = ["replay", requests_topic, "--to-topic", target]
    error = one_line_error(cli(*run, home=tmp_path, bootstrap=settings.bootstrap_servers))
    assert error == f"topic {target!r} does not exist: add --create to create it"
    assert missing_topics(settings, [target]) == [target]  # nothing was created

    created = cli(*run, "--create", home=tmp_path, bootstrap=settings.bootstrap_servers)
    assert created.returncode == 0, created.stderr
    assert "re-drove 3 events" in created.stdout
    assert len(events_of(settings, EventCodec(), target)) == 3
    again = cli(*run, home=tmp_path, bootstrap=settings.bootstrap_servers)
    assert again.returncode == 0, again.stderr  # an existing target needs no --create


# -- URL policy -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "kind"),
    [("::127.0.0.1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
     ("::ffff:7f00:1", "loopback"), ("::7f00:1", "loopback"),
     ("::ffff:10.0.0.1", "private"), ("::10.0.0.1", "private"),
     ("::ffff:0:127.0.0.1", "loopback"), ("64:ff9b:1::a00:1", "private")],
)  # fmt: skip
def test_url_to_an_ipv6_form_of_a_non_public_ipv4_address_is_refused(host: str, kind: str) -> None:
    with pytest.raises(ToolError, match=f"is an? {kind} address"):
        asyncio.run(check_url(f"http://[{host}]:8080/", UrlPolicy()))


def test_url_to_an_ipv6_form_of_a_public_ipv4_address_is_not_refused_for_its_form() -> None:
    # ::ffff:8.8.8.8 reaches 8.8.8.8: only where it leads matters.
    asyncio.run(check_url("http://[::ffff:8.8.8.8]/", UrlPolicy()))


def test_replay_into_a_topic_of_other_kinds_is_refused_unless_forced(settings, tmp_path) -> None:
    # Trajectories into `weights`: every consumer of `weights` would dead-letter them.
    run = ["replay", "trajectories", "--to-topic", "weights"]
    error = one_line_error(cli(*run, home=tmp_path, bootstrap=settings.bootstrap_servers))
    assert error == (
        "weights carries WeightsPublished, not TrajectoryFinished: its consumers would "
        "dead-letter them (pick --kind, or add --force)"
    )
    # --kind narrows what is sent: a kind the target carries passes the check.
    fine = ["replay", "trajectories", "--kind", "WeightsPublished", "--to-topic", "weights"]
    assert cli(*fine, home=tmp_path, bootstrap=settings.bootstrap_servers).returncode == 0
    lone = one_line_error(cli("replay", "trajectories", "--force", home=tmp_path,
                              bootstrap=settings.bootstrap_servers))  # fmt: skip
    assert lone == "--create and --force go with --to-topic"
