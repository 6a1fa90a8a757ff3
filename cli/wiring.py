"""The wiring every command that talks to the cluster repeats, written once.

The shared options name a cluster and a claim-check store: `ClusterOptions` turns them into
Kafka settings (the cluster checked reachable) and the codec every service takes.
`service_command` is what every `serve` command does around that: a SIGTERM while starting stops
the service cleanly instead of killing it, and the service is closed whatever happens.
`as_cli_error` (from `errors.py`, where jobs import it too) turns the errors a command expects
(a bad config value, a directory that cannot be written) into the one-line `CliError` the entry
point prints.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Protocol, TypeVar

from rich.console import Console

from asearcher.cli.errors import CliError, as_cli_error
from asearcher.cli.options import BootstrapServers, ClaimsUrl, Home, KafkaConfig, cluster

if TYPE_CHECKING:
    from asearcher.cli.run.config import RunConfig
    from asearcher.producers.rollout.service import RolloutConfig
    from asearcher.streams.cluster.settings import KafkaSettings
    from asearcher.streams.wire.codec import EventCodec

console = Console()


class Service(Protocol):
    """What a command starts: anything it must close when it ends."""

    def close(self) -> None: ...


S = TypeVar("S", bound=Service)


@dataclass(frozen=True, slots=True)
class Connection:
    """What every service is built from."""

    settings: KafkaSettings
    codec: EventCodec


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    """A command's shared cluster options, as given on the command line."""

    bootstrap: str | None
    kafka_config: list[str] | None
    home: str | None
    claims_url: str | None = None

    def settings(self, *, check_local: bool = True) -> KafkaSettings:
        """The Kafka settings, once the cluster answered (see `options.cluster`)."""
        return cluster(self.bootstrap, self.kafka_config, self.home, check_local=check_local)

    def codec(self) -> EventCodec:
        """The event codec with the claim-check store the options name (it writes there), also
        reading the claims stores of the runs under the state dir (each run writes its own)."""
        from asearcher.cli.run.config import saved_claim_stores
        from asearcher.streams.cluster.settings import reading_claim_store, state_dir
        from asearcher.streams.wire.codec import EventCodec

        shared = saved_claim_stores(state_dir(self.home))  # runs that name a shared store
        return EventCodec(reading_claim_store(self.claims_url, self.home, also=shared))

    def connect(self, *, check_local: bool = True) -> Connection:
        """Settings, then codec: a cluster that does not answer is named first."""
        return Connection(self.settings(check_local=check_local), self.codec())

    def args(self) -> list[str]:
        """These options as command-line arguments, for a child command on the same cluster."""
        args = []
        if self.bootstrap:
            args += ["--bootstrap-servers", self.bootstrap]
        for pair in self.kafka_config or []:
            args += ["--kafka-config", pair]
        if self.home:
            args += ["--home", self.home]
        if self.claims_url:
            args += ["--claims-url", self.claims_url]
        return args


# The shared options, in the order `ClusterOptions` takes them.
CLUSTER_PARAMETERS = (
    ("bootstrap", BootstrapServers), ("kafka_config", KafkaConfig), ("home", Home),
    ("claims_url", ClaimsUrl),
)  # fmt: skip
R = TypeVar("R")


def with_cluster(command: Callable[..., R]) -> Callable[..., R]:
    """`command` with the shared cluster options (-b, -X, --home, --claims-url) declared here,
    once: they reach it as one keyword argument `cluster: ClusterOptions`."""
    signature = inspect.signature(command, eval_str=True)  # typer needs the types, not strings
    own = [p for p in signature.parameters.values() if p.name != "cluster"]
    shared = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind)
        for name, kind in CLUSTER_PARAMETERS
    ]

    @functools.wraps(command)
    def wrapper(*args: object, **kwargs: object) -> R:
        given = [kwargs.pop(name, None) for name, _ in CLUSTER_PARAMETERS]
        return command(*args, cluster=ClusterOptions(*given), **kwargs)  # type: ignore[arg-type]

    wrapper.__signature__ = signature.replace(parameters=[*own, *shared])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in [*own, *shared]}
    return wrapper


class ServiceStarter:
    """Builds a command's services on its cluster and closes them when the command ends."""

    def __init__(self, options: ClusterOptions, closing: ExitStack) -> None:
        self.options = options
        self._closing = closing

    def start(self, build: Callable[[KafkaSettings, EventCodec], S]) -> S:
        """Connect, build the service with `build(settings, codec)`, and close it at the end.

        The local broker is checked too: a service must not wait for one that is not running.
        """
        connection = self.options.connect(check_local=True)
        service = build(connection.settings, connection.codec)
        self._closing.callback(service.close)
        return service


@contextmanager
def service_command(name: str, options: ClusterOptions) -> Iterator[ServiceStarter]:
    """Around a whole `serve` command: what it loads may take minutes, and a supervisor's
    SIGTERM meanwhile stops the service once it runs (`service_starting`); every service
    `start`ed inside is closed on the way out, whatever happened."""
    from asearcher.streams.service.lifecycle import service_starting

    with service_starting(name), ExitStack() as closing:
        yield ServiceStarter(options, closing)


P = TypeVar("P")
ServeProcessor = Callable[["KafkaSettings", "EventCodec", P, Path, str], int]


def run_processor(
    what: str, config_type: type[P], config_file: Path | None, options: ClusterOptions,
    home: str | None, log_level: str, serve: ServeProcessor[P],
) -> NoReturn:  # fmt: skip
    """A stream processor command: load its config (`what`: "evaluation processor"), connect,
    `serve` until stopped, and exit with the worker's status. Its state lives under
    `<home>/processors/<app id>`."""
    from rich.console import Console

    from asearcher.streams.cluster.settings import state_dir
    from asearcher.streams.service.config_file import load_config
    from asearcher.streams.service.faust_app import exit_now

    with as_cli_error(ValueError):
        config = load_config(config_type, f"{what} config", config_file)
    connection = options.connect(check_local=True)
    app_id = config.app_id  # type: ignore[attr-defined]
    Console().print(f"{what} {app_id} on {connection.settings.bootstrap_servers}")
    datadir = state_dir(home) / "processors" / app_id
    exit_now(serve(connection.settings, connection.codec, config, datadir, log_level))


def state_home() -> Path:
    from asearcher.streams.cluster.settings import state_dir

    return state_dir(None)


def chosen_run_config(config_file: Path | None, run: str | None, home: Path) -> RunConfig:
    """The run config a command was given: by name (`--run`, saved when the run was brought up
    or re-trained) or by file (`-c`, else the embedded run)."""
    from asearcher.cli.run.config import load_run_config, saved_run_config

    if run and config_file:
        raise CliError("give the run by name (--run) or by its config (-c), not both")
    with as_cli_error(ValueError):
        return saved_run_config(home, run) if run else load_run_config(config_file)


def weights_version(weights: str, store: str) -> int:
    """The version `--weights` names: vN, N, or latest (the store's newest; 0 when empty);
    a version the store does not hold (pruned, or not published yet) is refused by name."""
    from asearcher.streams.storage.weight_reader import WeightStoreError, WeightStoreReader

    try:
        reader = WeightStoreReader(store)
        if weights == "latest":
            latest = reader.latest()
            return latest.version if latest is not None else 0
        published = reader.versions()
    except WeightStoreError as exc:
        raise CliError(f"--weights {weights}: {exc}") from exc
    text = weights[1:] if weights.startswith("v") else weights
    if not text.isdigit():
        raise CliError(f"--weights must be vN, N or latest, got {weights!r}")
    version = int(text)
    if version and version not in published:
        held = f"v{published[0]}..v{published[-1]}" if published else "none"
        raise CliError(f"--weights v{version} is not in the weight store {store} (it holds "
                       f"{held}, {len(published)} versions: older ones are pruned)")  # fmt: skip
    return version


def local_broker(
    home: str | None, port: int | None = None, secure: bool = False, brokers: int | None = None
):
    from asearcher.streams.cluster.local_broker import LocalBroker
    from asearcher.streams.cluster.settings import state_dir

    return LocalBroker(state_dir(home), port=port, secure=secure, brokers=brokers)


def broker_up(
    port: int,
    bootstrap: str | None,
    kafka_config: list[str] | None,
    home: str | None,
    secure: bool = False,
    brokers: int | None = None,
) -> KafkaSettings:
    """Start the local broker (or cluster of `brokers` nodes) unless an external cluster is
    named; create missing topics."""
    from asearcher.streams.cluster.admin import ensure_topics

    settings = cluster(bootstrap, kafka_config, home)
    if secure and settings.external:
        raise CliError("--secure secures the local broker; an external cluster has its own "
                       "security, its ACLs come from `asearcher stream acl apply`")  # fmt: skip
    if not settings.external:
        broker = local_broker(home, port, secure, brokers)
        with console.status("starting the local Kafka broker (the first run fetches its jars)"):
            started = broker.up()
        state = "started" if started else "already up"
        mode = ", SASL/SCRAM + ACLs" if broker.secure else ""
        size = f"{broker.brokers} nodes, replication 3" if broker.brokers > 1 else "one node"
        console.print(f"local Kafka {state} at {broker.bootstrap_servers} ({size}{mode}; "
                      f"state in {broker.dir})")  # fmt: skip
        settings = cluster(bootstrap, kafka_config, home)
    created = ensure_topics(settings)
    console.print(f"created topics: {', '.join(created)}" if created else "all topics exist")
    return settings


def serve_producer(
    label: str,
    config: RolloutConfig,
    engine: str,
    model: Path | None,
    qa: Path | None,
    mistake_rate: float,
    options: ClusterOptions,
    max_groups: int | None,
) -> None:
    """Build the engine and run a rollout service (a producer or an evaluator) until stopped."""
    import msgspec

    from asearcher.producers.engines.registry import make_engine
    from asearcher.producers.rollout.service import RolloutService
    from asearcher.streams.cluster.settings import state_dir
    from asearcher.streams.storage.weight_reader import resolve_store_url

    home = options.home
    with service_command(label, options) as command:
        with as_cli_error(ValueError, ImportError):
            # Only versions in the trainer's store are loaded: the same default as `train serve`.
            config = msgspec.structs.replace(config, store=resolve_store_url(config.store, home))
            policy = make_engine(
                engine, model or state_dir(home) / "model", qa_file=qa,
                mistake_rate=mistake_rate, threads=config.engine_threads,
            )  # fmt: skip
        service = command.start(
            lambda settings, codec: RolloutService(settings, codec, policy, config)
        )
        bound = (
            f"staleness eta {config.staleness.eta}" if config.mode == "train"
            else "each request's own weight version"
        )  # fmt: skip
        console.print(
            f"{label} ({engine}, v{policy.version}) in group {config.group_id}, "
            f"concurrency {config.concurrency}, {bound}"
        )
        stats = service.run(max_groups=max_groups)
    console.print(f"finished: {stats.line(0, policy.version)}")
