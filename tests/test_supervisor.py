"""`RunSupervisor` against a real supervisord: start, report, restart, stop, apply, shut down."""

from __future__ import annotations

import os
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest

from asearcher.streams.service.supervisor import (
    MAX_SOCKET_PATH,
    ProcessState,
    Program,
    RunSupervisor,
    _quote,
    _socket_path,
)

# Sleeps until SIGTERM, then writes its pid to the file named by its argument and exits.
IDLE = (
    "import os, signal, sys, time; "
    "signal.signal(signal.SIGTERM, "
    "lambda *_: (open(sys.argv[1], 'w').write(str(os.getpid())), os._exit(0))); "
    "time.sleep(10**6)"
)
CRASH = "import sys, time; time.sleep(1.5); sys.exit(1)"  # counts as started, then fails


def _marks(tmp_path: Path) -> Path:
    # A space and a '%' in every marker path: commands must reach the program verbatim.
    directory = tmp_path / "marks a b 100%"
    directory.mkdir(exist_ok=True)
    return directory


def _idle(name: str, marks: Path) -> Program:
    return Program(
        name=name, command=[sys.executable, "-c", IDLE, str(marks / f"{name}.term")],
        start_s=1, stop_wait_s=10,
    )  # fmt: skip


@contextmanager
def _supervised(run_dir: Path, programs: list[Program]) -> Iterator[RunSupervisor]:
    run_dir.mkdir(parents=True, exist_ok=True)
    supervisor = RunSupervisor(run_dir)
    supervisor.write_config(programs)
    try:
        assert supervisor.start_daemon(timeout=20)
        yield supervisor
    finally:
        supervisor.shutdown(timeout=20)


def _wait_for(
    supervisor: RunSupervisor,
    done: Callable[[dict[str, ProcessState]], bool],
    timeout: float = 15.0,
) -> dict[str, ProcessState]:
    """The programs' states once `done` holds for them."""
    deadline = time.monotonic() + timeout
    while True:
        states = {state.name: state for state in supervisor.processes()}
        if done(states):
            return states
        if time.monotonic() > deadline:
            raise AssertionError(f"supervisord did not get there in {timeout}s: {states}")
        time.sleep(0.1)


def _all_running(states: dict[str, ProcessState]) -> bool:
    return all(state.state == "RUNNING" for state in states.values())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_supervisor_programs_run_with_pid_and_uptime_and_daemon_starts_once(
    tmp_path: Path,
) -> None:
    marks = _marks(tmp_path)
    run_dir = tmp_path / ("run-" + "d" * 90)  # its socket path would not fit in sockaddr_un
    with _supervised(run_dir, [_idle("a", marks), _idle("b", marks)]) as supervisor:
        assert len(supervisor.socket) <= MAX_SOCKET_PATH
        assert not supervisor.socket.startswith(str(run_dir))
        states = _wait_for(supervisor, _all_running)
        assert sorted(states) == ["a", "b"]
        for state in states.values():
            assert state.pid > 0 and _alive(state.pid)
            assert state.uptime_s >= 1.0 and state.restarts == 0
        assert supervisor.start_daemon() is False
        assert supervisor.is_running()
        assert supervisor.log_path("a").parent == run_dir / "logs"


def test_supervisor_killed_or_crashed_program_is_restarted_and_counted(tmp_path: Path) -> None:
    crash = Program(name="crash", command=[sys.executable, "-c", CRASH], start_s=1)
    with _supervised(tmp_path / "run", [_idle("idle", _marks(tmp_path)), crash]) as supervisor:
        first = _wait_for(supervisor, lambda s: s["idle"].state == "RUNNING")["idle"].pid
        os.kill(first, signal.SIGKILL)
        states = _wait_for(
            supervisor,
            lambda s: s["idle"].state == "RUNNING" and s["idle"].pid != first
            and s["crash"].restarts >= 1,
        )  # fmt: skip
        assert states["idle"].restarts == 1
        assert not _alive(first)
        assert _alive(states["idle"].pid)


def test_supervisor_stop_sends_sigterm_and_waits_and_start_missing_restarts(
    tmp_path: Path,
) -> None:
    marks = _marks(tmp_path)
    with _supervised(tmp_path / "run", [_idle("a", marks), _idle("b", marks)]) as supervisor:
        before = _wait_for(supervisor, _all_running)
        supervisor.stop(["a"])
        # Returned only once "a" is down, after its SIGTERM handler ran.
        assert (marks / "a.term").read_text() == str(before["a"].pid)
        assert not _alive(before["a"].pid)
        after = {state.name: state for state in supervisor.processes()}
        assert after["a"].state == "STOPPED"
        assert (after["b"].state, after["b"].pid) == ("RUNNING", before["b"].pid)
        assert not (marks / "b.term").exists()
        assert supervisor.start_missing() == ["a"]
        again = _wait_for(supervisor, _all_running)
        assert again["a"].pid != before["a"].pid and again["b"].pid == before["b"].pid
        assert supervisor.start_missing() == []


def test_supervisor_apply_adds_new_programs_and_removes_dropped_ones(tmp_path: Path) -> None:
    marks = _marks(tmp_path)
    with _supervised(tmp_path / "run", [_idle("a", marks)]) as supervisor:
        pid = _wait_for(supervisor, _all_running)["a"].pid
        supervisor.write_config([_idle("a", marks), _idle("extra", marks)])
        assert supervisor.apply() == (["extra"], [])
        states = _wait_for(supervisor, lambda s: "extra" in s and _all_running(s))
        assert states["a"].pid == pid  # left alone
        extra = states["extra"].pid
        supervisor.write_config([_idle("a", marks)])
        assert supervisor.apply() == ([], ["extra"])
        assert [state.name for state in supervisor.processes()] == ["a"]
        assert (marks / "extra.term").read_text() == str(extra)
        assert not _alive(extra)
        assert supervisor.apply() == ([], [])


def test_supervisor_shutdown_leaves_no_process(tmp_path: Path) -> None:
    marks = _marks(tmp_path)
    with _supervised(tmp_path / "run", [_idle("a", marks), _idle("b", marks)]) as supervisor:
        pids = [state.pid for state in _wait_for(supervisor, _all_running).values()]
        pids.append(int(supervisor.pid_file.read_text()))
        assert all(_alive(pid) for pid in pids)
        supervisor.shutdown(timeout=20)
        assert not supervisor.is_running()
        assert [pid for pid in pids if _alive(pid)] == []
        assert sorted(path.name for path in marks.iterdir()) == ["a.term", "b.term"]


@pytest.mark.parametrize("part", ["/runs/a b/100%/x.json", "it's", "%(here)s", "plain"])
def test_quote_escapes_shell_splitting_and_percent_expansion(part: str) -> None:
    quoted = _quote(part)
    # supervisord expands %(name)s first ('%%' is one '%'), then splits the command shell-like.
    assert shlex.split(quoted.replace("%%", "%")) == [part]
    assert "%" not in quoted.replace("%%", "")


def test_quote_path_with_space_and_percent_is_one_quoted_word() -> None:
    assert _quote("/runs/a b/100%") == "'/runs/a b/100%%'"


def test_socket_path_short_run_dir_stays_in_it() -> None:
    run_dir = Path("/srv/asearcher/runs/default")
    assert _socket_path(run_dir) == "/srv/asearcher/runs/default/supervisor.sock"


def test_socket_path_long_run_dir_falls_back_to_a_short_unique_one() -> None:
    long_dir = Path("/tmp") / ("d" * 150) / "runs" / "default"
    other = long_dir.parent / "other"
    path = _socket_path(long_dir)
    assert len(path) <= MAX_SOCKET_PATH
    assert Path(path).parent == Path(tempfile.gettempdir())
    assert path == _socket_path(long_dir) != _socket_path(other)


def test_socket_path_at_the_limit_is_kept_one_more_falls_back() -> None:
    suffix = len("/supervisor.sock")
    fits = Path("/" + "x" * (MAX_SOCKET_PATH - suffix - 1))
    assert _socket_path(fits) == str(fits / "supervisor.sock")
    assert len(_socket_path(fits)) == MAX_SOCKET_PATH
    too_long = Path(str(fits) + "x")
    assert not _socket_path(too_long).startswith(str(too_long))


def test_supervisor_held_program_stays_stopped_until_start_missing(tmp_path: Path) -> None:
    marks = _marks(tmp_path)
    held = msgspec.structs.replace(_idle("held", marks), autostart=False)
    with _supervised(tmp_path / "run", [_idle("a", marks), held]) as supervisor:
        states = _wait_for(supervisor, lambda s: s["a"].state == "RUNNING")
        time.sleep(1.5)  # a program started with the daemon would be RUNNING by now
        assert {s.name: s.state for s in supervisor.processes()}["held"] == "STOPPED"
        assert states["held"].pid == 0
        assert supervisor.start_missing() == ["held"]
        assert _wait_for(supervisor, _all_running)["held"].pid > 0
