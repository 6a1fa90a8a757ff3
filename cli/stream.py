"""`asearcher stream ...`: the event log itself (local broker, topics, status)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from asearcher.cli.errors import CliError
from asearcher.cli.jobs.chaos_plan import ChaosPlan
from asearcher.cli.options import BootstrapServers, Home, KafkaConfig, RunFile, RunName, cluster
from asearcher.cli.render import status_view
from asearcher.cli.wiring import ClusterOptions, as_cli_error, broker_up, local_broker

app = typer.Typer(
    help="Run a whole training topology: the local Kafka broker, the topics and every service.",
    no_args_is_help=True,
)
console = Console()


def _run_config(config_file: Path | None):
    from asearcher.cli.run.config import load_run_config

    with as_cli_error(ValueError):
        return load_run_config(config_file)


@app.command()
def up(
    config_file: RunFile = None,
    broker_only: Annotated[
        bool, typer.Option("--broker-only", help="Start the broker and topics, no services.")
    ] = False,
    wait: Annotated[
        bool, typer.Option(help="Wait until every service runs before returning.")
    ] = True,
    port: int = typer.Option(
        9092,
        help="Port of the local broker (the controller uses port+1; node i of a cluster "
        "port+2i and port+2i+1).",
    ),
    brokers: Annotated[
        int | None,
        typer.Option(
            "--brokers",
            min=1,
            max=7,
            help="Nodes of a new local cluster (3: every topic replicated 3 times, "
            "min.insync.replicas 2). Default: the run config's `brokers` (1).",
        ),
    ] = None,  # fmt: skip
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="A new local broker asks for SASL/SCRAM logins and enforces ACLs: each service "
            "runs as its own least-rights principal (passwords in <home>/kafka/credentials).",
        ),
    ] = False,
    host: Annotated[
        str | None,
        typer.Option(
            "--host",
            help="This machine's name among the run config's `hosts` tables: start only its share.",
        ),
    ] = None,
    bootstrap: BootstrapServers = None,
    kafka_config: KafkaConfig = None,
    home: Home = None,
) -> None:
    """Start the broker and every service of a run, supervised (restarted if they crash).

    Without -c the embedded run trains the CPU policy on the synthetic world on this machine.
    Running it again is harmless: it says what already runs and starts only what is missing.
    With --bootstrap-servers no broker is started: the topics are created on that cluster.
    A run spread over machines (the run config's `hosts` tables) is started on each machine
    with --host NAME.
    """
    from asearcher.cli.run import topology
    from asearcher.streams.cluster.settings import state_dir

    config = _run_config(config_file)
    settings = broker_up(port, bootstrap, kafka_config, home, secure, brokers or config.brokers)
    if broker_only:
        return
    with as_cli_error(ValueError):
        supervisor = topology.up(config, settings, state_dir(home), host=host)
    if wait:
        with console.status("waiting for every service to run"):
            behind = topology.wait_until_running(supervisor)
        if behind:
            console.print(f"[yellow]not running yet: {', '.join(behind)}[/yellow] "
                          "(see `asearcher stream logs NAME`)")  # fmt: skip
    console.print(topology.processes_table(supervisor))
    console.print("watch it with `asearcher stream status --watch`; stop it with "
                  "`asearcher stream down`")  # fmt: skip


@app.command()
def down(
    purge: bool = typer.Option(
        False, "--purge", help="Also delete the broker's data and every run's state."
    ),
    keep_broker: Annotated[
        bool, typer.Option("--keep-broker", help="Stop the services only.")
    ] = False,
    home: Home = None,
) -> None:
    """Stop every run's services in a safe order, then the local broker.

    Order: the feeder, the rollout producers (they drain their groups), the trainer (it
    finishes its step), the tool workers. --purge then deletes the broker's data and every
    run's weights, tool results, claim-check payloads and logs (the built world, index and
    initial policy are kept for the next run).
    """
    from asearcher.cli.run import topology
    from asearcher.streams.cluster.settings import state_dir

    for supervisor in topology.runs_up(state_dir(home)):
        console.print(f"stopping run {supervisor.run_dir.name!r}")
        topology.down(supervisor)
    topology.end_all_leftovers(state_dir(home))
    if keep_broker:
        return
    broker = local_broker(home)
    was_running = broker.down(purge=purge)
    console.print("local Kafka stopped" if was_running else "local Kafka was not running")
    if purge:
        removed = topology.purge(state_dir(home))
        console.print(f"deleted {', '.join(str(p) for p in [broker.dir, *removed])}")


@app.command()
def logs(
    service: Annotated[
        str,
        typer.Argument(
            help="A service (trainer, rollout-0, tools-0, feeder), supervisord or broker."
        ),  # fmt: skip
    ],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Print new lines.")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", min=0, help="Lines from the end.")] = 40,
    config_file: RunFile = None,
    run: RunName = None,
    home: Home = None,
) -> None:
    """Print the end of a service's log file (and follow it with -f)."""
    from asearcher.cli.run import topology
    from asearcher.streams.cluster.settings import state_dir

    name = run or _run_config(config_file).name
    supervisor = topology.run_supervisor(state_dir(home), name)
    if service == "broker":
        path = local_broker(home).logs_dir / "server.log"
    elif service == "supervisord":
        path = supervisor.log_file
    else:
        path = supervisor.log_path(service)
    if not path.is_file():
        known = sorted(p.stem for p in supervisor.logs_dir.glob("*.log"))
        raise CliError(f"no log for {service!r} in run {name!r}; known: {', '.join(known)}")
    _print_tail(path, lines, follow)


def _print_tail(path: Path, lines: int, follow: bool) -> None:
    import sys
    import time

    with path.open("r", errors="replace") as handle:
        for line in handle.readlines()[-max(lines, 0) :] if lines else []:
            sys.stdout.write(line)
        while follow:
            line = handle.readline()
            if line:
                sys.stdout.write(line)
                sys.stdout.flush()
            else:
                time.sleep(0.3)


@app.command()
def status(
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Refresh every --every seconds until Ctrl-C.")
    ] = False,
    every: Annotated[float, typer.Option(help="Seconds between refreshes with --watch.")] = 2.0,
    config_file: RunFile = None,
    run: RunName = None,
    bootstrap: BootstrapServers = None,
    kafka_config: KafkaConfig = None,
    home: Home = None,
) -> None:
    """Show the run: services, heartbeats and why they wait, the trainer, staleness, drops,
    then every topic with its message count (transaction markers excluded) and group lag.
    """
    settings = cluster(bootstrap, kafka_config, home)
    if not settings.external and not local_broker(home).is_running():
        raise CliError("the local broker is not running: start it with `asearcher stream up`")
    if every <= 0:
        raise CliError(f"--every must be positive, got {every}")
    name = run or (_run_config(config_file).name if config_file else None)
    if not watch:
        console.print(status_view(settings, home, name))
        return
    import time

    from rich.live import Live

    with Live(status_view(settings, home, name), console=console, screen=False) as live:
        while True:
            time.sleep(every)
            live.update(status_view(settings, home, name))


@app.command()
def audit(
    config_file: RunFile = None,
    run: RunName = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the ledger as JSON here.")
    ] = None,
    bootstrap: BootstrapServers = None,
    kafka_config: KafkaConfig = None,
    home: Home = None,
) -> None:
    """Prove the run's guarantees from its topics: one group per request, every trajectory
    trained once or dropped with a reason, versions without gaps, evaluations counted once.
    Exits with status 1 when one does not hold."""
    from asearcher.cli.ledger_view import ledger_view
    from asearcher.consumers.observability.run_ledger import read_ledger

    settings = cluster(bootstrap, kafka_config, home, check_local=True)
    name = run or _run_config(config_file).name
    codec = ClusterOptions(bootstrap, kafka_config, home).codec()  # the runs' claim stores too
    with console.status(f"reading the topics of run {name!r}"):
        ledger = read_ledger(settings, codec, name)
    console.print(ledger_view(ledger))
    _write_json(json_out, ledger)
    if not ledger.ok:
        raise typer.Exit(1)


_PLAN = ChaosPlan()  # the option defaults are the plan's


@app.command()
def chaos(
    seconds: Annotated[
        float,
        typer.Option(
            help="How long the faults go on; every cluster fault asked for is played, one "
            "delayed by a slow recovery after that."
        ),
    ] = _PLAN.seconds,
    every: Annotated[float, typer.Option(help="Mean seconds between two kills.")] = _PLAN.every_s,
    broker_restarts: Annotated[
        int, typer.Option(help="Times the local broker (all nodes) is killed -9 and restarted.")
    ] = _PLAN.broker_restarts,
    leader_kills: Annotated[
        int,
        typer.Option(
            help="Times the node leading most partitions of trajectories is killed -9 "
            "(a local cluster of 3: `stream up --brokers 3`)."
        ),
    ] = _PLAN.leader_kills,
    node_down: Annotated[
        float, typer.Option(help="Seconds a killed node stays down before it starts again.")
    ] = _PLAN.node_down_s,
    rolling_restarts: Annotated[
        int,
        typer.Option(
            help="Times every node is stopped and started in turn, each once all "
            "partitions are in sync again (a local cluster of 3)."
        ),
    ] = _PLAN.rolling_restarts,
    baseline: Annotated[
        float, typer.Option(help="Seconds watched without faults first (throughput before).")
    ] = _PLAN.baseline_s,
    settle: Annotated[
        float, typer.Option(help="Seconds left after the faults before the audit.")
    ] = _PLAN.settle_s,
    seed: Annotated[
        int, typer.Option(help="Seed of the fault schedule and the victims.")
    ] = _PLAN.seed,
    sample_every: Annotated[
        float, typer.Option(help="Seconds between samples of every service's memory and disk.")
    ] = _PLAN.sample_every_s,
    warmup: Annotated[
        float, typer.Option(help="Seconds sampled before memory and disk trends are measured.")
    ] = _PLAN.warmup_s,
    out: Annotated[
        Path | None,
        typer.Option(help="The report as JSON.", show_default="<run dir>/chaos/chaos-<seed>.json"),
    ] = None,
    config_file: RunFile = None,
    run: RunName = None,
    kafka_config: KafkaConfig = None,
    home: Home = None,
) -> None:
    """Kill -9 random services of a running run and restart the local broker, then audit it.

    On a local cluster of three nodes it can also kill the leader of `trajectories` and do
    rolling restarts. The run must be up (`stream up`). Each fault's recovery time and the
    time to the run's next trained step are measured, throughput is
    compared before, during and after the faults, every service's memory and the disk are
    sampled (with their trend after the warm-up), and the run's ledger (see `stream audit`)
    proves nothing was lost or done twice. Exits with status 1 when a guarantee does not
    hold or a service did not come back.
    """
    from asearcher.cli.jobs.chaos import Chaos, run_chaos
    from asearcher.cli.ledger_view import chaos_view
    from asearcher.cli.run import topology
    from asearcher.streams.cluster.settings import state_dir

    settings = cluster(None, kafka_config, home, check_local=True)
    name = run or _run_config(config_file).name
    supervisor = topology.run_supervisor(state_dir(home), name)
    if not supervisor.is_running():
        raise CliError(f"run {name!r} is not up: start it with `asearcher stream up`")
    broker = None if settings.external else local_broker(home)
    if broker_restarts and broker is None:
        raise CliError("--broker-restarts needs the local broker; this run uses another cluster")
    with as_cli_error(ValueError):
        plan = ChaosPlan(seconds=seconds, every_s=every, broker_restarts=broker_restarts,
                         leader_kills=leader_kills, node_down_s=node_down,
                         rolling_restarts=rolling_restarts, baseline_s=baseline, settle_s=settle,
                         seed=seed, sample_every_s=sample_every, warmup_s=warmup)  # fmt: skip
    codec = ClusterOptions(None, kafka_config, home).codec()
    with as_cli_error(ValueError):
        chaos = Chaos(supervisor, broker, plan, console.print)
    report = run_chaos(chaos, settings, codec, name)
    console.print(chaos_view(report))
    _write_json(out or supervisor.run_dir / "chaos" / f"chaos-{seed}.json", report)
    if not report.ok:
        raise typer.Exit(1)


def _write_json(path: Path | None, value: object) -> None:
    import msgspec

    if path is None:
        return
    with as_cli_error(OSError, os_error=f"cannot write {path}"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(msgspec.json.format(msgspec.json.encode(value)))
    console.print(f"written to {path}")


@app.command()
def install() -> None:
    """Fetch the pinned Apache Kafka jars from Maven Central into the user cache (once)."""
    from asearcher.streams.cluster.local_broker import KAFKA_VERSION, install_kafka

    with console.status(f"fetching Apache Kafka {KAFKA_VERSION} with Maven"):
        libs = install_kafka()
    console.print(f"Apache Kafka {KAFKA_VERSION} jars in {libs}")
