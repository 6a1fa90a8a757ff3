"""Run services as supervised background processes, with Supervisor (supervisord) from PyPI.

A run's services are `Program`s: a command, its environment, how long it may take to stop.
`RunSupervisor` writes supervisord's config in the run directory, starts the daemon (once), and
drives it over its XML-RPC API on a unix socket: add what is missing, stop in a given order,
report state, pid, uptime and restarts, and give each service one log file. supervisord restarts
a crashed service with back-off (a service that dies within `startsecs` is retried after 1, 2,
3 ... s, `startretries` times) and stops a process group with SIGTERM, then SIGKILL after the
service's `stop_wait_s`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import subprocess
import sys
import tempfile
import time
import xmlrpc.client
from pathlib import Path
from typing import Any

import msgspec
import psutil

from asearcher.streams.service.log import get_logger

log = get_logger(__name__)
# A unix socket path must fit in sockaddr_un (108 bytes on Linux).
MAX_SOCKET_PATH = 100


class SupervisorError(RuntimeError):
    """supervisord could not be started or asked; the message says why."""


class Program(msgspec.Struct, frozen=True, kw_only=True):
    """One supervised process."""

    name: str  # unique within the run: "trainer", "rollout-0", ...
    command: list[str]
    stop_wait_s: float = 30.0  # after SIGTERM, how long before SIGKILL
    start_s: float = 3.0  # alive this long counts as started (shorter: a failed start)
    description: str = ""
    autostart: bool = True  # False: written but left stopped until asked (start_missing)


class ProcessState(msgspec.Struct, frozen=True, kw_only=True):
    """What supervisord says of one program."""

    name: str
    state: str  # RUNNING, STARTING, BACKOFF, STOPPED, EXITED, FATAL, ...
    pid: int
    uptime_s: float
    restarts: int  # spawns since this supervisord started, minus the first
    description: str = ""


class RunSupervisor:
    """The supervisord of one run, its config, socket and logs under `run_dir`."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.logs_dir = run_dir / "logs"
        self.conf = run_dir / "supervisord.conf"
        self.pid_file = run_dir / "supervisord.pid"
        self.log_file = self.logs_dir / "supervisord.log"
        self.socket = _socket_path(run_dir)

    # -- the daemon ------------------------------------------------------------------------

    def write_config(self, programs: list[Program]) -> None:
        """supervisord's config for `programs` (read again by `apply`)."""
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        sections = [self._daemon_section(), *(self._program_section(p) for p in programs)]
        self.conf.write_text("\n".join(sections))

    def _daemon_section(self) -> str:
        return "\n".join([
            "; written by asearcher stream up",
            "[unix_http_server]", f"file={_path(self.socket)}", "chmod=0700", "",
            "[supervisord]", f"logfile={_path(self.log_file)}", f"pidfile={_path(self.pid_file)}",
            "logfile_maxbytes=10MB", "logfile_backups=2", f"directory={_path(self.run_dir)}",
            "loglevel=info", "",
            "[rpcinterface:supervisor]",
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface", "",
            "[supervisorctl]", f"serverurl=unix://{_path(self.socket)}", "",
        ])  # fmt: skip

    def _program_section(self, program: Program) -> str:
        command = " ".join(_quote(part) for part in program.command)
        return "\n".join([
            f"[program:{program.name}]", f"command={command}",
            f"directory={_path(self.run_dir)}",
            f"autostart={str(program.autostart).lower()}", "autorestart=true",
            f"startsecs={int(program.start_s)}",
            "startretries=10", "stopsignal=TERM", f"stopwaitsecs={int(program.stop_wait_s)}",
            # Whole process groups: a launcher's workers go with it.
            "stopasgroup=true", "killasgroup=true", "redirect_stderr=true",
            f"stdout_logfile={_path(self.log_path(program.name))}", "stdout_logfile_maxbytes=20MB",
            "stdout_logfile_backups=2", "",
        ])  # fmt: skip

    def log_path(self, name: str) -> Path:
        """The one log file of program `name`."""
        return self.logs_dir / f"{name}.log"

    def is_running(self) -> bool:
        """Whether this run's supervisord answers."""
        if not Path(self.socket).exists():
            return False
        try:
            self._rpc().supervisor.getState()
        except (OSError, xmlrpc.client.Fault):
            return False
        return True

    def start_daemon(self, env: dict[str, str] | None = None, timeout: float = 30.0) -> bool:
        """Start supervisord (it daemonizes) if it is not running; True if it was started.

        Its programs inherit `env`, so settings such as the bootstrap servers or client secrets
        reach the services without being written into the config file.
        """
        if self.is_running():
            return False
        command = [sys.executable, "-m", "supervisor.supervisord", "-c", str(self.conf)]
        result = subprocess.run(
            command, env=env, capture_output=True, text=True, check=False, cwd=self.run_dir
        )
        if result.returncode != 0:
            raise SupervisorError(f"supervisord did not start: {result.stderr or result.stdout}")
        deadline = time.monotonic() + timeout
        while not self.is_running():
            if time.monotonic() > deadline:
                raise SupervisorError(f"supervisord did not answer within {timeout:.0f}s")
            time.sleep(0.1)
        return True

    def shutdown(self, timeout: float = 60.0) -> None:
        """Stop supervisord itself (after its programs were stopped)."""
        if not self.is_running():
            return
        pid = int(self.pid_file.read_text()) if self.pid_file.exists() else None
        self._rpc().supervisor.shutdown()
        deadline = time.monotonic() + timeout
        while pid is not None and _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)

    def leftovers(self) -> list[psutil.Process]:
        """Service processes of this run that outlived their supervisord (killed -9, say).

        Every program runs in the run's directory, so a process whose working directory it is
        and that runs asearcher belongs to the run; while the run's supervisord answers, its
        processes are supervised, not left over."""
        if self.is_running():
            return []
        here, mine = str(self.run_dir.resolve()), _lineage()
        found = []
        for process in psutil.process_iter(["pid", "cwd", "cmdline"]):
            info = process.info
            if info["pid"] in mine or info["cwd"] != here:
                continue
            if any("asearcher" in part for part in info["cmdline"] or ()):
                found.append(process)
        return found

    def end_leftovers(self, timeout: float = 15.0) -> list[int]:
        """Stop the processes `leftovers` finds (TERM, then KILL after `timeout`); their pids."""
        found = self.leftovers()
        for process in found:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.terminate()
        _, alive = psutil.wait_procs(found, timeout=timeout)
        for process in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(alive, timeout=timeout)
        return [process.pid for process in found]

    # -- its programs ----------------------------------------------------------------------

    def apply(self) -> tuple[list[str], list[str]]:
        """Reread the config: add new programs (they start), remove dropped ones.

        Returns (added, removed). Programs already running are left alone.
        """
        rpc = self._rpc()
        [[added, changed, removed]] = rpc.supervisor.reloadConfig()
        for name in removed + changed:
            rpc.supervisor.stopProcessGroup(name, True)
            rpc.supervisor.removeProcessGroup(name)
        for name in added + changed:
            rpc.supervisor.addProcessGroup(name)
        return sorted(added + changed), sorted(removed)

    def start_missing(self) -> list[str]:
        """Start programs that are not running (stopped, exited or fatal); their names."""
        rpc = self._rpc()
        started = []
        for info in rpc.supervisor.getAllProcessInfo():
            if info["statename"] in ("STOPPED", "EXITED", "FATAL"):
                rpc.supervisor.startProcess(info["name"], False)
                started.append(info["name"])
        return started

    def stop(self, names: list[str]) -> None:
        """Stop `names` together and wait until they are down (SIGTERM, then SIGKILL)."""
        rpc = self._rpc()
        known = {info["name"]: info["statename"] for info in rpc.supervisor.getAllProcessInfo()}
        for name in names:
            if known.get(name) in ("RUNNING", "STARTING", "BACKOFF"):
                rpc.supervisor.stopProcess(name, False)
        while True:
            states = {i["name"]: i["statename"] for i in rpc.supervisor.getAllProcessInfo()}
            if all(states.get(name) not in ("RUNNING", "STARTING", "STOPPING", "BACKOFF")
                   for name in names):  # fmt: skip
                return
            time.sleep(0.2)

    def processes(self) -> list[ProcessState]:
        """Every program with its state, pid, uptime and restarts."""
        spawns = self._spawns()
        states = []
        for info in self._rpc().supervisor.getAllProcessInfo():
            running = info["statename"] == "RUNNING"
            states.append(ProcessState(
                name=info["name"], state=info["statename"], pid=info["pid"],
                uptime_s=float(info["now"] - info["start"]) if running else 0.0,
                restarts=max(0, spawns.get(info["name"], 0) - 1),
                description=info.get("spawnerr") or "",
            ))  # fmt: skip
        return states

    def _spawns(self) -> dict[str, int]:
        """How often supervisord spawned each program, from its log since it started."""
        counts: dict[str, int] = {}
        if not self.log_file.exists():
            return counts
        for line in self.log_file.read_text(errors="replace").splitlines():
            if "supervisord started with pid" in line:
                counts = {}  # an earlier daemon's spawns do not count
            elif " spawned: '" in line:
                name = line.split(" spawned: '", 1)[1].split("'", 1)[0]
                counts[name] = counts.get(name, 0) + 1
        return counts

    def _rpc(self) -> Any:
        from supervisor.xmlrpc import SupervisorTransport

        transport = SupervisorTransport(None, None, f"unix://{self.socket}")
        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)


def _socket_path(run_dir: Path) -> str:
    path = str(run_dir / "supervisor.sock")
    if len(path) <= MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(str(run_dir).encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir()) / f"asearcher-{digest}.sock")


def _path(path: Path | str) -> str:
    # supervisord expands %(...)s in every value.
    return str(path).replace("%", "%%")


def _quote(part: str) -> str:
    # supervisord splits commands shell-like and expands %(...)s: escape both.
    return shlex.quote(part).replace("%", "%%")


def _lineage() -> set[int]:
    """This process and its ancestors: never leftovers, whatever their working directory."""
    pids, process = set(), psutil.Process()
    while process is not None:
        pids.add(process.pid)
        process = process.parent()
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
