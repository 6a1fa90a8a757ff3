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

import msgspec
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


class BrokerNode(msgspec.Struct, frozen=True, kw_only=True):
    """One node of the local cluster: a combined broker and controller with its own ports and
    state directory."""

    node_id: int
    port: int
    controller_port: int
    dir: Path

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def logs_dir(self) -> Path:
        return self.dir / "logs"

    @property
    def pid_file(self) -> Path:
        return self.dir / "kafka.pid"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def pid(self) -> int | None:
        """The node's process id if it is running."""
        try:
            pid = int(self.pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if b"kafka.Kafka" in cmdline else None

    def formatted(self) -> bool:
        return (self.data_dir / "meta.properties").exists()

    def log_tail(self, lines: int = 30) -> str:
        """The end of the node's console and server logs, for error messages."""
        parts = []
        for name in ("kafka.out", "server.log"):
            path = self.logs_dir / name
            if path.exists():
                parts.extend(path.read_text(errors="replace").splitlines()[-lines:])
        return "\n".join(parts)


class LocalBroker:
    """The local Kafka cluster whose state lives in `home / "kafka"`: one combined
    broker+controller node by default, or `brokers` of them (a three-node KRaft quorum whose
    topics are replicated three times). Node i (from 0) listens on `port + 2i` for clients
    and `port + 2i + 1` for the controller quorum."""

    def __init__(
        self,
        home: Path,
        port: int | None = None,
        heap_mb: int = HEAP_MB,
        secure: bool = False,
        brokers: int | None = None,
    ) -> None:
        self.home = home
        self.dir = home / "kafka"
        self.record = home / BROKER_FILE
        recorded = json.loads(self.record.read_text()) if self.record.exists() else {}
        first = BrokerNode(node_id=1, port=0, controller_port=0, dir=self.dir)
        formatted = first.formatted() or (self.dir / "node-1" / "data" / "meta.properties").exists()
        # Once formatted, a cluster keeps its ports, its size and its security: clients find
        # it through the record, and its admin user exists only if it was formatted secure.
        self.port = recorded.get("port") or port or DEFAULT_PORT
        self.brokers = recorded.get("brokers", 1) if formatted else (brokers or 1)
        self.asked_brokers = brokers
        self.heap_mb = heap_mb
        self.secure = recorded.get("secure", False) if formatted else secure
        self.asked_secure = secure
        self.nodes = self._nodes(recorded.get("controller_port"))

    def _nodes(self, recorded_controller: int | None) -> list[BrokerNode]:
        if self.brokers == 1:
            controller = recorded_controller or self.port + 1
            return [BrokerNode(node_id=1, port=self.port, controller_port=controller, dir=self.dir)]
        return [
            BrokerNode(
                node_id=i + 1,
                port=self.port + 2 * i,
                controller_port=self.port + 2 * i + 1,
                dir=self.dir / f"node-{i + 1}",
            )
            for i in range(self.brokers)
        ]

    # The first node's places: the single broker's, and where `stream logs broker` looks.
    @property
    def data_dir(self) -> Path:
        return self.nodes[0].data_dir

    @property
    def logs_dir(self) -> Path:
        return self.nodes[0].logs_dir

    @property
    def controller_port(self) -> int:
        return self.nodes[0].controller_port

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.address for node in self.nodes)

    def node(self, node_id: int) -> BrokerNode:
        """The node with Kafka's `node_id` (1-based), as metadata names leaders."""
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise BrokerError(f"the local cluster has no node {node_id} (it has {self.brokers})")

    def pid(self) -> int | None:
        """The first running node's process id (the single broker's), or None."""
        pids = self.pids()
        return next(iter(pids.values()), None)

    def pids(self) -> dict[int, int]:
        """The running nodes' process ids by node id."""
        return {node.node_id: pid for node in self.nodes if (pid := node.pid()) is not None}

    def is_running(self) -> bool:
        return bool(self.pids())

    def formatted(self) -> bool:
        return all(node.formatted() for node in self.nodes)

    def admin_settings(self) -> KafkaSettings:
        """Settings that reach this cluster with every right (the admin's, when secure)."""
        if not self.secure:
            return KafkaSettings(bootstrap_servers=self.bootstrap_servers)
        admin = acl.read_credentials(acl.credentials_file(self.home, acl.ADMIN))
        return KafkaSettings(bootstrap_servers=self.bootstrap_servers, client_config=admin)

    def server_properties(self, node: BrokerNode | None = None) -> dict[str, str]:
        """One node's configuration; the internal topics' replication fits the cluster."""
        node = node or self.nodes[0]
        client = "CLIENT" if self.secure else "PLAINTEXT"
        protocol = acl.PROTOCOL if self.secure else "PLAINTEXT"
        replicas, insync = str(min(3, self.brokers)), str(max(1, min(2, self.brokers - 1)))
        return {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            **self._quorum_properties(),
            "listeners": (
                f"{client}://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}"
            ),
            "advertised.listeners": f"{client}://127.0.0.1:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": client,
            "listener.security.protocol.map": f"CONTROLLER:{protocol},{client}:{protocol}",
            **(self._security_properties() if self.secure else {}),
            "log.dirs": str(node.data_dir),
            "num.partitions": "1",
            # Kafka's defaults (3 copies of its internal topics) cannot be placed on fewer
            # nodes: consumer groups, transactions and share groups would never start.
            "default.replication.factor": replicas,
            "min.insync.replicas": insync,
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": insync,
            "transaction.state.log.num.partitions": "8",
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": insync,
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
        }

    def _quorum_properties(self) -> dict[str, str]:
        """A single node bootstraps a dynamic quorum of itself (`--standalone`); a cluster
        names its fixed voters, every node a controller."""
        if self.brokers == 1:
            return {"controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}"}
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        return {"controller.quorum.voters": voters}

    def _security_properties(self) -> dict[str, str]:
        """SCRAM on the client listener, ACLs everywhere. KRaft cannot check SCRAM on the
        controller listener (the users live in the metadata it serves), so the nodes log in
        to the controllers with PLAIN as `controller`, a user known only to their files;
        left PLAINTEXT, that listener's anonymous principal would have to be a super user."""
        admin, controller = self._password(acl.ADMIN), self._controller_password()
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

    def _controller_password(self) -> str:
        """The nodes' shared login to the controller listener, kept (owner-only) so that a
        node restarted alone still agrees with the others."""
        path = self.dir / "controller.secret"
        if not path.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            _write_private(path, acl.new_password())
        return path.read_text()

    def _write_config(self, node: BrokerNode) -> Path:
        node.dir.mkdir(parents=True, exist_ok=True)
        node.logs_dir.mkdir(parents=True, exist_ok=True)
        config = node.dir / "server.properties"
        lines = [f"{key}={value}" for key, value in self.server_properties(node).items()]
        # A secure broker's file holds its own login: owner-only, like the credentials files.
        _write_private(config, "# written by asearcher stream up\n" + "\n".join(lines) + "\n")
        return config

    def _write_record(self) -> None:
        self.record.write_text(
            json.dumps(
                {
                    "bootstrap_servers": self.bootstrap_servers,
                    "port": self.port,
                    "controller_port": self.controller_port,
                    "brokers": self.brokers,
                    "kafka_version": KAFKA_VERSION,
                    "secure": self.secure,
                }
            )
        )

    def _java(self, libs: Path, node: BrokerNode, main: str, *args: str) -> list[str]:
        config_file = resources.files("asearcher.infra") / "kafka" / "log4j2.properties"
        with resources.as_file(config_file) as cfg:
            log_config = str(cfg)
        # The heap is touched whole at start (AlwaysPreTouch), so the broker's resident memory
        # is flat from its first minute instead of climbing for half an hour as G1 fills it.
        return [
            "java", f"-Xmx{self.heap_mb}m", f"-Xms{self.heap_mb}m", "-XX:+UseG1GC",
            "-XX:+AlwaysPreTouch",
            "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={log_config}",
            f"-Dkafka.logs.dir={node.logs_dir}", "-cp", f"{libs}/*", main, *args,
        ]  # fmt: skip

    def _format_once(self, libs: Path, node: BrokerNode, config: Path, cluster_id: str) -> None:
        if node.formatted():
            return
        command = self._java(
            libs, node, "kafka.tools.StorageTool", "format", "-t", cluster_id,
            "-c", str(config), "--ignore-formatted",
        )  # fmt: skip
        if self.brokers == 1:
            command.append("--standalone")
        if self.secure:
            # The admin must exist before the broker starts: it creates every other user.
            admin = f"{acl.MECHANISM}=[name={acl.ADMIN},password={self._password(acl.ADMIN)}]"
            command += ["--add-scram", admin]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BrokerError(f"formatting Kafka storage failed:\n{result.stdout}{result.stderr}")

    def _refuse_mismatch(self) -> None:
        if self.asked_secure and not self.secure:
            raise BrokerError(
                f"the local broker in {self.dir} was formatted without --secure and has no admin "
                "user: `asearcher stream down --purge` first (this deletes its data)"
            )
        if self.asked_brokers not in (None, self.brokers):
            raise BrokerError(
                f"the local cluster in {self.dir} was formatted with {self.brokers} broker(s), "
                f"not --brokers {self.asked_brokers}: `asearcher stream down --purge` first "
                "(this deletes its data)"
            )

    def up(self, timeout: float = 120.0) -> bool:
        """Start every node that is not running; True if any was started, False if the whole
        cluster was already up."""
        self._refuse_mismatch()
        stopped = [node for node in self.nodes if node.pid() is None]
        if not stopped:
            return False
        for node in stopped:
            for port in (node.port, node.controller_port):
                if port_open(port):
                    raise BrokerError(
                        f"port {port} is already in use by another process: choose --port, or "
                        "point asearcher at that cluster with --bootstrap-servers"
                    )
        libs = install_kafka()
        cluster_id = self._cluster_id()
        started = [self._start(libs, node, cluster_id) for node in stopped]
        self._write_record()
        try:
            self._wait_until_ready(started, timeout)
        except BrokerError:
            # A node that could not start leaves the others waiting for their quorum forever.
            for node, _ in started:
                self.kill_node(node.node_id)
            raise
        if self.secure:
            self._provision()
        return True

    def start_node(self, node_id: int, timeout: float = 120.0) -> None:
        """Start one stopped node (after `kill_node`, or in a rolling restart) and wait until
        the cluster counts it again."""
        node = self.node(node_id)
        if node.pid() is None:
            self._wait_until_ready(
                [self._start(install_kafka(), node, self._cluster_id())], timeout
            )

    def _cluster_id(self) -> str:
        """The cluster's id: the one its formatted nodes carry, else a new one."""
        for node in self.nodes:
            meta = node.data_dir / "meta.properties"
            if meta.exists():
                for line in meta.read_text().splitlines():
                    if line.startswith("cluster.id="):
                        return line.split("=", 1)[1].strip()
        return new_cluster_id()

    def _start(
        self, libs: Path, node: BrokerNode, cluster_id: str
    ) -> tuple[BrokerNode, subprocess.Popen]:
        config = self._write_config(node)
        self._format_once(libs, node, config, cluster_id)
        out = (node.logs_dir / "kafka.out").open("ab")
        process = subprocess.Popen(
            self._java(libs, node, "kafka.Kafka", str(config)),
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=node.dir,
        )  # fmt: skip
        node.pid_file.write_text(str(process.pid))
        return node, process

    def _provision(self) -> None:
        """Every service principal's SCRAM user and ACLs (groups come with each run)."""
        passwords = acl.ensure_credentials(self.home, acl.SERVICE_PRINCIPALS)
        acl.provision(self.admin_settings(), passwords=passwords)

    def _wait_until_ready(
        self, started: list[tuple[BrokerNode, subprocess.Popen]], timeout: float
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node, process in started:
                if process.poll() is not None:
                    raise BrokerError(
                        f"Kafka node {node.node_id} exited during start-up:\n{node.log_tail()}"
                    )
            if all(port_open(node.port) for node, _ in started) and self._answers():
                return
            time.sleep(0.25)
        tails = "\n".join(node.log_tail() for node, _ in started)
        raise BrokerError(f"the Kafka broker did not answer within {timeout:.0f}s:\n{tails}")

    def _answers(self) -> bool:
        """Whether the cluster answers metadata requests with every node registered."""
        from confluent_kafka.admin import AdminClient

        try:
            metadata = AdminClient(self.admin_settings().client()).list_topics(timeout=2)
        except Exception:
            return False
        return len(metadata.brokers) >= self.brokers

    def log_tail(self, lines: int = 30) -> str:
        """The end of the first node's console and server logs, for error messages."""
        return self.nodes[0].log_tail(lines)

    def kill(self, timeout: float = 30.0) -> int | None:
        """Kill every node with SIGKILL, as a crash of the whole cluster would (chaos runs),
        and wait until they are gone; the first node's pid, or None if none was running."""
        pids = [self.kill_node(node.node_id, timeout) for node in self.nodes]
        return next((pid for pid in pids if pid is not None), None)

    def kill_node(self, node_id: int, timeout: float = 30.0) -> int | None:
        """Kill one node with SIGKILL and wait until it has let go of its ports; its pid, or
        None if it was not running."""
        node = self.node(node_id)
        pid = node.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            _wait_for_exit(pid, timeout)
            # The JVM's main thread is a zombie before its other threads let go of the sockets.
            deadline = time.monotonic() + timeout
            while port_open(node.port) or port_open(node.controller_port):
                if time.monotonic() > deadline:
                    raise BrokerError(f"the killed Kafka node {pid} still holds its ports")
                time.sleep(0.1)
            node.pid_file.unlink(missing_ok=True)
        return pid

    def stop_node(self, node_id: int, timeout: float = 60.0) -> bool:
        """Stop one node cleanly (SIGTERM: it hands its partitions' leadership over first);
        True if it ran."""
        node = self.node(node_id)
        pid = node.pid()
        if pid is not None:
            _terminate(pid, timeout)
        node.pid_file.unlink(missing_ok=True)
        return pid is not None

    def down(self, purge: bool = False, timeout: float = 60.0) -> bool:
        """Stop every node (controlled shutdown, all at once: a node stopped after the quorum
        is gone would wait for it); True if any ran. `purge` also deletes the data."""
        pids = self.pids()
        for pid in pids.values():
            os.kill(pid, signal.SIGTERM)
        for pid in pids.values():
            _terminate(pid, timeout, signalled=True)
        for node in self.nodes:
            node.pid_file.unlink(missing_ok=True)
        if purge:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.record.unlink(missing_ok=True)
        return bool(pids)


def _terminate(pid: int, timeout: float, signalled: bool = False) -> None:
    """SIGTERM `pid` (unless already sent) and wait; SIGKILL it if it ignores that."""
    if not signalled:
        os.kill(pid, signal.SIGTERM)
    if not _wait_for_exit(pid, timeout):
        log.warning("broker %d ignored SIGTERM for %.0fs; killing it", pid, timeout)
        os.kill(pid, signal.SIGKILL)
        _wait_for_exit(pid, 10)


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
