"""One table of service kinds (`cli/run/service_kinds.py`) and the children a job starts."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from asearcher.cli.app import app
from asearcher.cli.run.service_kinds import SERVICE_KINDS, serve_command
from asearcher.streams.service.children import JobChildren


@pytest.mark.parametrize("kind", sorted(SERVICE_KINDS))
def test_every_kind_is_served_by_a_command_of_the_cli(kind: str) -> None:
    command = serve_command(kind, log_level="DEBUG")
    assert command[:5] == [sys.executable, "-m", "asearcher.cli.app", "--log-level", "DEBUG"]
    result = CliRunner().invoke(app, [*SERVICE_KINDS[kind].command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_children_log_to_their_file_report_exits_and_stop_with_the_job(tmp_path: Path) -> None:
    waiting = "import time; print('up', flush=True); time.sleep(120)"
    with JobChildren(tmp_path / "logs", stop_wait_s=10) as children:
        log = children.start("sleeper", python(waiting))
        children.start("failing", python("import sys; print('bad'); sys.exit(3)"))
        deadline = time.monotonic() + 30
        while "failing" not in children.exited() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert children.exited() == {"failing": 3}
        while "up" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert log == tmp_path / "logs" / "sleeper.log" and log.read_text() == "up\n"
        started = time.monotonic()
    assert time.monotonic() - started < 5  # SIGTERM ended it at once
    assert children.exited()["sleeper"] != 0


def test_a_child_that_ignores_sigterm_is_killed_after_the_wait(tmp_path: Path) -> None:
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(120)"
    )
    children = JobChildren(tmp_path, stop_wait_s=1)
    log = children.start("stubborn", python(stubborn))
    deadline = time.monotonic() + 30
    while "up" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    started = time.monotonic()
    children.stop()
    assert 1 <= time.monotonic() - started < 10
    assert children.exited() == {"stubborn": -9}
