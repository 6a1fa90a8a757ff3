"""A run spread over machines: each host's share of the services, from one run config.

A run config with `[hosts.NAME]` tables says which services each machine runs; every machine
is given the same file and `stream up --host NAME` starts that machine's share. Replicated
kinds are numbered across hosts in the file's order (the first host's producers are
rollout-0.., the next host's follow), so each producer keeps the staleness share its index
derives from `rollout.replicas`, the run's total.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import msgspec
from msgspec import Meta

if TYPE_CHECKING:
    from asearcher.cli.run.config import RunConfig


class HostSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One machine's share of a run spread over several (`stream up --host NAME`)."""

    tools: Annotated[int, Meta(ge=0, description="tool workers on this host")] = 0
    rollout: Annotated[
        int, Meta(ge=0, description="rollout producers on this host (of rollout.replicas)")
    ] = 0
    eval: Annotated[int, Meta(ge=0, description="evaluators on this host (of eval.replicas)")] = 0
    synth: Annotated[
        int, Meta(ge=0, description="synthesis processors on this host (of synth.replicas)")
    ] = 0
    trainer: Annotated[
        bool, Meta(description="the trainer (all its trainer.processes) and the warm start")
    ] = False
    feeder: Annotated[bool, Meta(description="the request feeder")] = False
    processors: Annotated[
        bool, Meta(description="the evaluation processor and the metrics processor")
    ] = False


# Replicated kinds: (program name prefix, host field, the run's total as a dotted field).
_REPLICATED = (
    ("tools", "tools", "tools.replicas"),
    ("rollout", "rollout", "rollout.replicas"),
    ("evaluator", "eval", "eval.replicas"),
    ("synth", "synth", "synth.replicas"),
)


def _total(config: RunConfig, dotted: str) -> int:
    section, field = dotted.split(".")
    return getattr(getattr(config, section), field)


def _singletons(config: RunConfig) -> dict[str, tuple[str, ...]]:
    """Each single service's host field and the programs it places, where the run has it."""
    return {
        "trainer": ("trainer",) if config.trainer.processes else (),
        "feeder": ("feeder",) if config.feeder.enabled else (),
        "processors": (
            *(("eval-processor",) if config.eval.replicas else ()),
            *(("metrics",) if config.metrics.enabled else ()),
        ),
    }


def check_hosts(config: RunConfig) -> None:
    """Every service of the run on exactly one host; ValueError naming what does not add up."""
    hosts = config.hosts
    if not hosts:
        return
    for prefix, field, dotted in _REPLICATED:
        placed = sum(getattr(host, field) for host in hosts.values())
        if placed != _total(config, dotted):
            raise ValueError(
                f"hosts place {placed} of {dotted} = {_total(config, dotted)} "
                f"({prefix} services): the hosts' `{field}` must add up to it"
            )
    for field, programs in _singletons(config).items():
        chosen = [name for name, host in hosts.items() if getattr(host, field)]
        wanted = 1 if programs else 0
        if len(chosen) != wanted:
            where = ", ".join(chosen) or "none"
            raise ValueError(
                f"hosts: `{field} = true` must be on {wanted} host(s) for this run, found {where}"
            )


def host_programs(config: RunConfig, host: str) -> frozenset[str]:
    """The names of the programs `host` runs (ValueError for a host the config lacks)."""
    if host not in config.hosts:
        known = ", ".join(config.hosts) or "none: the run config has no [hosts] tables"
        raise ValueError(f"--host {host!r} is not in the run config's hosts ({known})")
    names: list[str] = []
    first = {prefix: 0 for prefix, _, _ in _REPLICATED}
    for name, section in config.hosts.items():
        for prefix, field, _ in _REPLICATED:
            count = getattr(section, field)
            if name == host:
                names += [f"{prefix}-{i}" for i in range(first[prefix], first[prefix] + count)]
            first[prefix] += count
        if name == host:
            for field, programs in _singletons(config).items():
                names += list(programs) if getattr(section, field) else []
    return frozenset(names)


def runs_warm_start(config: RunConfig, host: str | None) -> bool:
    """Whether this machine clones the warm start: the trainer's host, or the only one."""
    return host is None or config.hosts[host].trainer
