"""Bring a whole run up and down: prepare it, start its services supervised, stop them in order.

`up` is idempotent: a second call says what already runs and starts only what is missing.
`down` stops the feeder first (nothing new is requested), then the producers (they drain their
groups), the trainer (it finishes its step), the tool workers, and last supervisord itself.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec
from rich.console import Console
from rich.table import Table

from asearcher.cli.run.config import (
    Paths,
    RunConfig,
    app_ids,
    groups,
    paths,
    programs,
    resolve,
    run_dir,
    stop_stages,
    write_run_config,
)
from asearcher.cli.run.hosts import host_programs, runs_warm_start
from asearcher.streams.cluster import acl
from asearcher.streams.cluster.settings import (
    ENV_BOOTSTRAP,
    ENV_CLAIMS_URL,
    ENV_HOME,
    ENV_KAFKA_PREFIX,
    KafkaSettings,
)
from asearcher.streams.service.supervisor import Program, RunSupervisor

console = Console()
STARTED_MARK = ".started"
DISTRIBUTED_WORLD = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT"}
)  # in the run directory: the run has been brought up before
# On a secure local broker each program runs as the principal of its kind (by name prefix).
PRINCIPALS = {"trainer": acl.TRAINER, "rollout-": acl.ROLLOUT, "evaluator-": acl.ROLLOUT,
              "tools-": acl.TOOLS, "feeder": acl.FEEDER, "eval-processor": acl.PROCESSOR,
              "metrics": acl.PROCESSOR, "synth-": acl.SYNTH}  # fmt: skip


def prepare(config: RunConfig, where: Paths) -> None:
    """Build what the services need and is missing: the world and its index, the worlds the
    warm start demonstrates on, the policy (from those worlds' pages when there are some)."""
    from asearcher.cli.run.config import DEMONSTRATION_SEED, demonstration_data
    from asearcher.cli.run.prepare import demonstration_corpus, policy, world_and_index

    data = config.data
    corpus, seed = where.world_dir / "corpus.jsonl", data.world_seed
    if data.qa is None or data.index_dir is None:
        corpus = world_and_index(where.world_dir, data, dense=data.dense)[0]["corpus"]
    if where.demonstration_worlds:
        worlds = zip(where.demonstration_worlds, demonstration_data(config), strict=True)
        corpora = [world_and_index(path, other, other.dense)[0]["corpus"] for path, other in worlds]
        if not (where.model_dir / "config.json").is_file():
            corpus, seed = demonstration_corpus(where.model_dir, corpora), DEMONSTRATION_SEED
    if not where.qa.is_file():
        raise ValueError(f"data.qa {where.qa} is not a file")
    if config.tools.replicas and not (where.index_dir / "manifest.json").is_file():
        raise ValueError(f"data.index_dir {where.index_dir} holds no index")
    if not (where.model_dir / "config.json").is_file():
        if not corpus.is_file():
            raise ValueError(f"model_dir {where.model_dir} holds no model")
        policy(where.model_dir, corpus, seed, config.policy)


def secure_local(settings: KafkaSettings, home: Path) -> bool:
    """Whether the run's services talk to a local broker that checks who they are."""
    return not settings.external and acl.local_secure(home)


def service_env(settings: KafkaSettings, home: Path, claims: str) -> dict[str, str]:
    """The environment supervised services inherit: where the cluster and stores are.

    Client settings (possibly secrets) travel in the environment, never in a config file.
    On a secure local broker no login is inherited (the operator's would be the admin's):
    each program reads its own principal's credentials file instead (`with_credentials`).
    """
    secure = secure_local(settings, home)
    logins = {_env_name(key) for key in acl.CREDENTIAL_KEYS} if secure else set()
    # A launcher's torch.distributed world (RANK, MASTER_PORT, ...) in the caller's environment
    # is not the services': the trainer would try to join it (or bind its port) and crash.
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in logins and name not in DISTRIBUTED_WORLD
    }
    env.update({ENV_HOME: str(home), ENV_CLAIMS_URL: claims})
    env.update(PYTHONUNBUFFERED="1", COLUMNS="160")  # whole log lines in the log files
    if settings.external:
        env[ENV_BOOTSTRAP] = settings.bootstrap_servers
    for key, value in settings.client_config.items():
        if _env_name(key) not in logins:
            env[_env_name(key)] = value
    return env


def _env_name(client_key: str) -> str:
    return ENV_KAFKA_PREFIX + client_key.upper().replace(".", "_")


def with_credentials(programs: list[Program], home: Path) -> list[Program]:
    """Each program with `$ASEARCHER_CREDENTIALS_FILE` naming its principal's credentials file.

    Set through `env` on its command line: supervisord.conf, the process list and the logs show
    a path, while the password stays in that owner-only file.
    """
    env = shutil.which("env") or "/usr/bin/env"
    updated = []
    for program in programs:
        path = acl.credentials_file(home, principal_of(program.name))
        command = [env, f"{acl.ENV_CREDENTIALS}={path}", *program.command]
        updated.append(msgspec.structs.replace(program, command=command))
    return updated


def principal_of(program: str) -> str:
    """The principal a supervised program runs as on a secure broker."""
    for prefix, principal in PRINCIPALS.items():
        if program.startswith(prefix):
            return principal
    raise ValueError(f"program {program!r} has no principal on a secure broker")


def run_groups(name: str) -> acl.ServiceGroups:
    """The consumer groups run `name`'s services join, for their ACLs."""
    named, apps = groups(name), app_ids(name)
    return acl.ServiceGroups(
        trainer=(named["trainer"],), rollout=(named["rollout"], named["evaluators"]),
        tools=(named["tools"],), processors=(apps["eval-processor"], apps["metrics"]),
        synth=(apps["synth"],),
    )  # fmt: skip


def up(
    config: RunConfig,
    settings: KafkaSettings,
    home: Path,
    held: Sequence[str] = (),
    host: str | None = None,
) -> RunSupervisor:
    """Start every service of the run that is not running yet, supervised; a fresh supervisord
    leaves the services whose names start with one of `held` stopped (`start_missing` starts
    them). With `host`, only that machine's share of a run spread over several (`hosts`)."""
    where = paths(config, home)
    resolved = resolve(config, where)
    mine = host_programs(config, host) if host is not None else None
    if host is None and config.hosts:
        raise ValueError(f"the run config spreads the run over hosts ({', '.join(config.hosts)}):"
                         " name this machine's with --host")  # fmt: skip
    prepare(config, where)
    write_run_config(config, where)
    if config.warm_start.enabled and runs_warm_start(config, host):
        _warm_start(config, resolved, where, settings)
    supervisor = RunSupervisor(where.run_dir)
    run_programs = [
        msgspec.structs.replace(p, autostart=False) if p.name.startswith(tuple(held)) else p
        for p in programs(config, resolved, where)
        if mine is None or p.name in mine
    ]
    if secure_local(settings, home):
        # The operator acts as the admin here: the run's groups get their ACLs first.
        settings = acl.as_principal(settings, home, acl.ADMIN)
        acl.provision(settings, run_groups(config.name))
        run_programs = with_credentials(run_programs, home)
    supervisor.write_config(run_programs)
    first_time = not (where.run_dir / STARTED_MARK).exists()
    if first_time:
        _skip_foreign_backlog(settings, config.name, resolved.eval_processor.app_id,
                              resolved.synth_processor.app_id)  # fmt: skip
    _end_leftovers(supervisor, config.name)
    if supervisor.start_daemon(service_env(settings, home, where.claims)):
        console.print(f"started supervisord for run {config.name!r} ({where.run_dir})")
    else:
        running = [p.name for p in supervisor.processes() if p.state == "RUNNING"]
        added, removed = supervisor.apply()
        started = supervisor.start_missing()
        console.print(f"run {config.name!r} already up; running: {', '.join(running) or 'none'}")
        for what, names in (("added", added), ("removed", removed), ("restarted", started)):
            if names:
                console.print(f"{what}: {', '.join(names)}")
    (where.run_dir / STARTED_MARK).touch()
    return supervisor


def _warm_start(config: RunConfig, resolved, where: Paths, settings: KafkaSettings) -> None:
    """Clone the expert into the run's first version (see `warm_start`), with the run's own
    claim-check store, before any service of the run starts."""
    from asearcher.cli.run.warm_start import warm_start
    from asearcher.streams.cluster.settings import claim_store
    from asearcher.streams.wire.codec import EventCodec

    warm_start(config, resolved, where, settings, EventCodec(claim_store(where.claims)))


def _skip_foreign_backlog(
    settings: KafkaSettings, name: str, eval_processor: str, synth_processor: str
) -> None:
    """A new run's groups start after what earlier runs or demos left on the shared topics."""
    from asearcher.streams.cluster.admin import skip_backlog
    from asearcher.streams.wire.topics import (
        EVAL_REQUESTS,
        EVAL_TRAJECTORIES,
        ROLLOUT_REQUESTS,
        SYNTH_REQUESTS,
        TOOL_CALLS,
        TRAJECTORIES,
    )

    run_groups = groups(name)
    # Evaluators too: a request pinned to a version of another run (or never published) would
    # hold a new run's evaluator at its version switch.
    for group, topic in (
        (run_groups["rollout"], ROLLOUT_REQUESTS),
        (run_groups["trainer"], TRAJECTORIES),
        (run_groups["tools"], TOOL_CALLS),
        (run_groups["evaluators"], EVAL_REQUESTS),
        # The evaluation processor (its faust app's group) would otherwise decode every earlier
        # run's evaluation samples, claim checks and all, before its own: minutes on a busy
        # cluster, with this run's first evaluation waiting behind them.
        (eval_processor, EVAL_TRAJECTORIES),
        # Other jobs' seeds: each would be read and passed over in a transaction of its own.
        (synth_processor, SYNTH_REQUESTS),
    ):
        skipped = skip_backlog(settings, group, topic)
        if skipped:
            console.print(
                f"{group}: skipping {skipped:,} records already on {topic} "
                "(earlier runs, demos or this run's warm start)"
            )


def wait_until_running(
    supervisor: RunSupervisor, timeout: float = 120.0, held: Sequence[str] = ()
) -> list[str]:
    """Wait until every program but the `held` ones (name prefixes) is RUNNING, or give up at
    `timeout`; the ones that are not."""
    deadline = time.monotonic() + timeout
    while True:
        behind = [p.name for p in supervisor.processes()
                  if p.state != "RUNNING" and not p.name.startswith(tuple(held))]  # fmt: skip
        if not behind or time.monotonic() > deadline:
            return behind
        time.sleep(0.5)


def processes_table(supervisor: RunSupervisor) -> Table:
    """The run's services as supervisord sees them."""
    table = Table(title=f"Services of run {supervisor.run_dir.name!r}")
    for column in ("service", "state", "pid", "uptime", "restarts", "log"):
        table.add_column(column)
    for p in supervisor.processes():
        table.add_row(p.name, p.state, str(p.pid or "-"), f"{p.uptime_s:.0f}s",
                      str(p.restarts), str(supervisor.log_path(p.name)))  # fmt: skip
    return table


def _end_leftovers(supervisor: RunSupervisor, name: str) -> None:
    """Stop services a dead supervisord left running, before anything starts beside them."""
    ended = supervisor.end_leftovers()
    if ended:
        console.print(
            f"stopped {len(ended)} processes of run {name!r} that outlived its supervisord "
            f"(pids {', '.join(map(str, ended))})"
        )


def end_all_leftovers(home: Path) -> None:
    """Stop what dead supervisords of any run under `home` left running."""
    root = home / "runs"
    for directory in sorted(root.iterdir()) if root.is_dir() else []:
        _end_leftovers(RunSupervisor(directory), directory.name)


def runs_up(home: Path) -> list[RunSupervisor]:
    """Supervisors of every run under `home` whose supervisord answers."""
    root = home / "runs"
    found = [RunSupervisor(d) for d in sorted(root.iterdir())] if root.is_dir() else []
    return [s for s in found if s.is_running()]


def down(supervisor: RunSupervisor) -> None:
    """Stop the run's services in the safe order, then its supervisord."""
    names = [p.name for p in supervisor.processes()]
    for stage in stop_stages(names):
        with console.status(f"stopping {', '.join(stage)}"):
            supervisor.stop(stage)
        console.print(f"stopped {', '.join(stage)}")
    supervisor.shutdown()


def purge(home: Path) -> list[Path]:
    """Delete every run's state (weights, tool results, claims, logs, configs) and the
    leftovers of commands run outside a run; the built world, index and policy stay."""
    doomed = [home / "runs", home / "weights", home / "tool-results", home / "claims"]
    removed = [path for path in doomed if path.exists()]
    for path in removed:
        shutil.rmtree(path)
    return removed


def run_supervisor(home: Path, name: str) -> RunSupervisor:
    """The supervisor of run `name` (running or not)."""
    return RunSupervisor(run_dir(home, name))
