"""The embedded event log: one Apache Kafka 4.x node in KRaft mode, from Maven Central jars.

`install_kafka` resolves the broker and a log4j2 backend with Maven into a cache outside any
checkout; `LocalBroker` formats its storage once, starts `kafka.Kafka` in the background with
data and logs in the state directory, waits until it answers, and stops it cleanly.

A secure broker (`secure=True`, chosen when it is first formatted and kept from then on) asks
clients for SASL/SCRAM-SHA-512 and authorises every request with ACLs (`streams.acl`): an
`admin` super user created at format time, one least-rights principal per service kind.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from importlib import resources
from pathlib import Path

import platformdirs

from asearcher.streams.cluster import acl
from asearcher.streams.cluster.settings import BROKER_FILE, KafkaSettings
from asearcher.streams.service.log import get_logger

log = get_logger(__name__)

KAFKA_VERSION = "4.1.1"
ENV_CACHE = "ASEARCHER_CACHE"
DEFAULT_PORT = 9092
HEAP_MB = 512
CONTROLLER_USER = "controller"  # the secure broker's login to its own controller listener


class BrokerError(RuntimeError):
    """The local broker could not be installed, started or stopped; the message says why."""


def cache_dir() -> Path:
    """Downloads shared by every checkout: `$ASEARCHER_CACHE` or the user cache directory."""
    chosen = os.environ.get(ENV_CACHE)
    return Path(chosen).expanduser() if chosen else platformdirs.user_cache_path("asearcher")


def kafka_libs(version: str = KAFKA_VERSION) -> Path:
    """The directory holding the broker's jars once installed."""
    return cache_dir() / f"kafka-{version}" / "libs"


def install_kafka(version: str = KAFKA_VERSION) -> Path:
    """Resolve the broker jars with Maven (once; later calls return the cached directory)."""
    libs = kafka_libs(version)
    if (libs / ".complete").exists():
        return libs
    if shutil.which("mvn") is None:
        raise BrokerError("Maven (mvn) is needed once to fetch the Kafka jars; install it first")
    staging = libs.with_name(f"libs.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    log.info("fetching Apache Kafka %s from Maven Central into %s", version, libs)
    with resources.as_file(resources.files("asearcher.infra") / "kafka" / "pom.xml") as pom:
        command = [
            "mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
            f"-Dkafka.version={version}", f"-DoutputDirectory={staging}", "-DincludeScope=runtime",
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BrokerError(f"Maven could not fetch Kafka {version}:\n{result.stdout[-2000:]}")
    (staging / ".complete").write_text(version)
    shutil.rmtree(libs, ignore_errors=True)
    staging.rename(libs)
    return libs


def new_cluster_id() -> str:
    """A Kafka cluster id: a UUID in URL-safe base64 without padding (22 characters)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        # A leading '-' would be read as an option by the storage tool (Kafka avoids it too).
        if not cluster_id.startswith("-"):
            return cluster_id


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on `host:port`."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalBroker:
    """One combined broker+controller node whose state lives in `home / "kafka"`."""

    def __init__(
        self, home: Path, port: int | None = None, heap_mb: int = HEAP_MB, secure: bool = False
    ) -> None:
        self.home = home
        self.dir = home / "kafka"
        self.data_dir = self.dir / "data"
        self.logs_dir = self.dir / "logs"
        self.pid_file = self.dir / "kafka.pid"
        self.record = home / BROKER_FILE
        recorded = json.loads(self.record.read_text()) if self.record.exists() else {}
        # Once formatted, a broker keeps its ports: clients find it through the record.
        self.port = recorded.get("port") or port or DEFAULT_PORT
        self.controller_port = recorded.get("controller_port") or self.port + 1
        self.heap_mb = heap_mb
        # And its security: its admin user exists only if it was formatted secure.
        self.secure = recorded.get("secure", False) if self.formatted() else secure
        self.asked_secure = secure

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def pid(self) -> int | None:
        """The broker's process id if it is running."""
        try:
            pid = int(self.pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if b"kafka.Kafka" in cmdline else None

    def is_running(self) -> bool:
        return self.pid() is not None

    def formatted(self) -> bool:
        return (self.data_dir / "meta.properties").exists()

    def admin_settings(self) -> KafkaSettings:
        """Settings that reach this broker with every right (the admin's, when secure)."""
        if not self.secure:
            return KafkaSettings(bootstrap_servers=self.bootstrap_servers)
        admin = acl.read_credentials(acl.credentials_file(self.home, acl.ADMIN))
        return KafkaSettings(bootstrap_servers=self.bootstrap_servers, client_config=admin)

    def server_properties(self) -> dict[str, str]:
        """The broker configuration; single-node replication overrides are required."""
        client = "CLIENT" if self.secure else "PLAINTEXT"
        protocol = acl.PROTOCOL if self.secure else "PLAINTEXT"
        return {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"{client}://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"{client}://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": client,
            "listener.security.protocol.map": f"CONTROLLER:{protocol},{client}:{protocol}",
            **(self._security_properties() if self.secure else {}),
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            # Without these a single node cannot host the internal topics that consumer groups,
            # transactions and share groups need.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "8",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
        }

    def _security_properties(self) -> dict[str, str]:
        """SCRAM on the client listener, ACLs everywhere. KRaft cannot check SCRAM on the
        controller listener (the users live in the metadata it serves), so the broker logs in
        to its own controller with PLAIN as `controller`, a user known only to this file;
        left PLAINTEXT, that listener's anonymous principal would have to be a super user."""
        admin, controller = self._password(acl.ADMIN), acl.new_password()
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule"
        plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
        return {
            "sasl.enabled.mechanisms": acl.MECHANISM,
            "sasl.mechanism.inter.broker.protocol": acl.MECHANISM,
            # Transaction markers go through the inter-broker listener, even to this node.
            f"listener.name.client.{acl.MECHANISM.lower()}.sasl.jaas.config": (
                f'{scram} required username="{acl.ADMIN}" password="{admin}";'
            ),
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": (
                f'{plain} required username="{CONTROLLER_USER}" password="{controller}" '
                f'user_{CONTROLLER_USER}="{controller}";'
            ),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{acl.ADMIN};User:{CONTROLLER_USER}",
        }

    def _password(self, principal: str) -> str:
        return acl.ensure_credentials(self.home, [principal])[principal]

    def _write_config(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "server.properties"
        lines = [f"{key}={value}" for key, value in self.server_properties().items()]
        # A secure broker's file holds its own login: owner-only, like the credentials files.
        _write_private(config, "# written by asearcher stream up\n" + "\n".join(lines) + "\n")
        self.record.write_text(
            json.dumps(
                {
                    "bootstrap_servers": self.bootstrap_servers,
                    "port": self.port,
                    "controller_port": self.controller_port,
                    "kafka_version": KAFKA_VERSION,
                    "secure": self.secure,
                }
            )
        )
        return config

    def _java(self, libs: Path, main: str, *args: str) -> list[str]:
        config_file = resources.files("asearcher.infra") / "kafka" / "log4j2.properties"
        with resources.as_file(config_file) as cfg:
            log_config = str(cfg)
        # The heap is touched whole at start (AlwaysPreTouch), so the broker's resident memory
        # is flat from its first minute instead of climbing for half an hour as G1 fills it.
        return [
            "java", f"-Xmx{self.heap_mb}m", f"-Xms{self.heap_mb}m", "-XX:+UseG1GC",
            "-XX:+AlwaysPreTouch",
            "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={log_config}",
            f"-Dkafka.logs.dir={self.logs_dir}", "-cp", f"{libs}/*", main, *args,
        ]  # fmt: skip

    def _format_once(self, libs: Path, config: Path) -> None:
        if self.formatted():
            return
        command = self._java(
            libs, "kafka.tools.StorageTool", "format", "-t", new_cluster_id(),
            "-c", str(config), "--standalone", "--ignore-formatted",
        )  # fmt: skip
        if self.secure:
            # The admin must exist before the broker starts: it creates every other user.
            admin = f"{acl.MECHANISM}=[name={acl.ADMIN},password={self._password(acl.ADMIN)}]"
            command += ["--add-scram", admin]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BrokerError(f"formatting Kafka storage failed:\n{result.stdout}{result.stderr}")

    def up(self, timeout: float = 120.0) -> bool:
        """Start the broker if needed; True if it was started, False if it was already up."""
        if self.asked_secure and not self.secure:
            raise BrokerError(
                f"the local broker in {self.dir} was formatted without --secure and has no admin "
                "user: `asearcher stream down --purge` first (this deletes its data)"
            )
        if self.is_running():
            return False
        for port in (self.port, self.controller_port):
            if port_open(port):
                raise BrokerError(
                    f"port {port} is already in use by another process: choose --port, or point "
                    "asearcher at that cluster with --bootstrap-servers"
                )
        libs = install_kafka()
        config = self._write_config()
        self._format_once(libs, config)
        out = (self.logs_dir / "kafka.out").open("ab")
        process = subprocess.Popen(
            self._java(libs, "kafka.Kafka", str(config)),
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=self.dir,
        )  # fmt: skip
        self.pid_file.write_text(str(process.pid))
        self._wait_until_ready(process, timeout)
        if self.secure:
            self._provision()
        return True

    def _provision(self) -> None:
        """Every service principal's SCRAM user and ACLs (groups come with each run)."""
        passwords = acl.ensure_credentials(self.home, acl.SERVICE_PRINCIPALS)
        acl.provision(self.admin_settings(), passwords=passwords)

    def _wait_until_ready(self, process: subprocess.Popen, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise BrokerError(f"the Kafka broker exited during start-up:\n{self.log_tail()}")
            if port_open(self.port) and self._answers():
                return
            time.sleep(0.25)
        raise BrokerError(
            f"the Kafka broker did not answer within {timeout:.0f}s:\n{self.log_tail()}"
        )

    def _answers(self) -> bool:
        from confluent_kafka.admin import AdminClient

        try:
            AdminClient(self.admin_settings().client()).list_topics(timeout=2)
        except Exception:
            return False
        return True

    def log_tail(self, lines: int = 30) -> str:
        """The end of the broker's console and server logs, for error messages."""
        parts = []
        for name in ("kafka.out", "server.log"):
            path = self.logs_dir / name
            if path.exists():
                parts.extend(path.read_text(errors="replace").splitlines()[-lines:])
        return "\n".join(parts)

    def kill(self, timeout: float = 30.0) -> int | None:
        """Kill the broker with SIGKILL, as a crash would (chaos runs), and wait until it is
        gone; its pid, or None if it was not running."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            _wait_for_exit(pid, timeout)
            # The JVM's main thread is a zombie before its other threads let go of the sockets.
            deadline = time.monotonic() + timeout
            while port_open(self.port) or port_open(self.controller_port):
                if time.monotonic() > deadline:
                    raise BrokerError(f"the killed broker {pid} still holds its ports")
                time.sleep(0.1)
            self.pid_file.unlink(missing_ok=True)
        return pid

    def down(self, purge: bool = False, timeout: float = 60.0) -> bool:
        """Stop the broker (controlled shutdown); True if it ran. `purge` also deletes its data."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            if not _wait_for_exit(pid, timeout):
                log.warning("broker %d ignored SIGTERM for %.0fs; killing it", pid, timeout)
                os.kill(pid, signal.SIGKILL)
                _wait_for_exit(pid, 10)
        self.pid_file.unlink(missing_ok=True)
        if purge:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.record.unlink(missing_ok=True)
        return pid is not None


def _write_private(path: Path, text: str) -> None:
    """Write `path` readable by its owner only, from the first byte on."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    path.chmod(0o600)  # O_CREAT's mode does not apply to a file that existed


def _wait_for_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            finished, _ = os.waitpid(pid, os.WNOHANG)
            if finished == pid:
                return True
        except ChildProcessError:
            pass  # not our child: fall back to probing
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if _is_zombie(pid):
            return True
        time.sleep(0.2)
    return False


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (OSError, IndexError):
        return True
