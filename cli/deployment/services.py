"""A run's services as the cluster runs them: `stream up`'s own programs, one entry per kind.

Which services a run has, how many of each, their config files and their command lines all
come from `cli/run/config.py: programs`, the derivation `stream up` starts under supervisord.
What changes on the cluster: the command runs `asearcher` in the image instead of this
interpreter, paths are the pod's, and where `stream up` writes a replica's number (its
instance name, a producer's config file with its staleness share) the pod writes its ordinal.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import msgspec

from asearcher.cli.run.config import (
    Paths,
    Resolved,
    RunConfig,
    paths,
    programs,
    resolve,
    write_run_config,
)
from asearcher.cli.run.service_kinds import CLI_MODULE, SERVICE_KINDS
from asearcher.cli.run.topology import principal_of
from asearcher.streams.service.supervisor import Program

# The variable a pod's command names its ordinal with; Kubernetes expands `$(NAME)` in a
# container's command from the container's environment.
INDEX_VARIABLE = "POD_INDEX"
INDEX_SLOT = f"$({INDEX_VARIABLE})"
CONFIG_FILES = ".json"


class Service(msgspec.Struct, frozen=True, kw_only=True):
    """One kind of service of the run, as its pods run it."""

    kind: str  # a key of SERVICE_KINDS
    replicas: int  # how many `stream up` starts
    command: list[str]  # `asearcher ...`, with INDEX_SLOT where a replica's number goes
    principal: str | None  # its Kafka login on a secure cluster; None: it has none
    stop_wait_s: float  # SIGTERM to SIGKILL, as supervisord gives it
    # Whether `stream up` numbers its replicas (`rollout-0`): each is then told apart by its
    # number (a StatefulSet's ordinal), even while there is one.
    numbered: bool


class RunServices(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the workloads are made of."""

    where: Paths  # the pod's paths
    resolved: Resolved
    services: list[Service]  # in `stream up`'s start order
    config_files: dict[str, bytes]  # file name -> content, mounted at `where.configs`


def run_services(config: RunConfig, home: Path) -> RunServices:
    """The run's services with pod paths under `home`; ValueError if the run does not resolve.

    `programs` writes the services' config files where their commands name them: a staging
    directory stands in for the run directory, and the commands are then moved to the pod's.
    """
    where = paths(config, home)
    with tempfile.TemporaryDirectory(prefix="asearcher-deploy-") as staging:
        staged = msgspec.structs.replace(where, run_dir=Path(staging))
        shape = _command_shape(config)
        shaped = programs(shape, resolve(shape, where), staged)
        resolved = resolve(config, where)
        counted = programs(config, resolved, staged)  # rewrites the files: these are the run's
        write_run_config(config, staged)
        files = {path.name: path.read_bytes() for path in sorted(staged.configs.iterdir())}

        def in_pod(command: list[str]) -> list[str]:
            return _in_pod(command, staged.run_dir, where.run_dir)

        services = [
            Service(
                kind=kind,
                replicas=sum(1 for p in counted if kind_of(p.name) == kind),
                command=in_pod(_replica_command([p for p in shaped if kind_of(p.name) == kind])),
                principal=_principal(first),
                stop_wait_s=first.stop_wait_s,
                numbered=first.name != kind,
            )
            for kind, first in _first_of_each(counted).items()
        ]
    return RunServices(where=where, resolved=resolved, services=services, config_files=files)


def kind_of(program: str) -> str:
    """The service kind of a supervised program (`rollout-3` is a `rollout`)."""
    if program in SERVICE_KINDS:
        return program
    kind = program.rpartition("-")[0]
    if kind not in SERVICE_KINDS:
        raise ValueError(f"program {program!r} is of no known service kind")
    return kind


def _first_of_each(run_programs: list[Program]) -> dict[str, Program]:
    first: dict[str, Program] = {}
    for program in run_programs:
        first.setdefault(kind_of(program.name), program)
    return first


def _command_shape(config: RunConfig) -> RunConfig:
    """The run with two of each kind told apart by number, so that two replicas' commands show
    where the number goes, and the trainer as one process: the command each rank runs (with
    several, `stream up` runs DeepSpeed's launcher, which starts that command per rank).
    Producers keep their count: no pod beyond it ever runs (see `scaling`)."""
    return msgspec.structs.replace(
        config,
        tools=msgspec.structs.replace(config.tools, replicas=_two(config.tools.replicas)),
        eval=msgspec.structs.replace(config.eval, replicas=_two(config.eval.replicas)),
        synth=msgspec.structs.replace(config.synth, replicas=_two(config.synth.replicas)),
        trainer=msgspec.structs.replace(config.trainer, processes=min(config.trainer.processes, 1)),
    )


def _two(replicas: int) -> int:
    return max(replicas, 2) if replicas else 0


def _replica_command(replicas: list[Program]) -> list[str]:
    """The command of any replica: the first's, with INDEX_SLOT where the second's differs."""
    if len(replicas) < 2:
        return list(replicas[0].command)
    first, second = replicas[0].command, replicas[1].command
    if len(first) != len(second):
        raise ValueError(f"{replicas[0].name} and {replicas[1].name} differ in shape")
    return [a if a == b else _index_slot(a, b) for a, b in zip(first, second, strict=True)]


def _index_slot(first: str, second: str) -> str:
    """`first` (replica 0's argument) with INDEX_SLOT where replica 1's `second` differs."""
    prefix = os.path.commonprefix([first, second])
    suffix = os.path.commonprefix([first[::-1], second[::-1]])[::-1]
    if first[len(prefix) : len(first) - len(suffix)] != "0":
        raise ValueError(f"replicas differ beyond their number: {first!r}, {second!r}")
    return f"{prefix}{INDEX_SLOT}{suffix}"


def _in_pod(command: list[str], staged: Path, run_dir: Path) -> list[str]:
    """A `stream up` command as the image runs it: the `asearcher` script, the pod's paths."""
    interpreter = [sys.executable, "-m", CLI_MODULE]
    if command[: len(interpreter)] != interpreter:
        raise ValueError(f"not an asearcher command: {command[:3]}")
    return ["asearcher", *(arg.replace(str(staged), str(run_dir)) for arg in command[3:])]


def _principal(program: Program) -> str | None:
    """The principal the program logs in as on a secure cluster (None: the ACLs name none)."""
    try:
        return principal_of(program.name)
    except ValueError:
        return None
