"""What `asearcher stream chaos` breaks, how often and for how long: the plan and its defaults.

Apart from `chaos.py` so that the CLI takes its option defaults from here without importing
what playing the plan needs.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta


class ChaosPlan(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How long, how often and what to break."""

    seconds: Annotated[
        float,
        Meta(description="seconds of faults; every planned cluster fault is played, one delayed "
             "by a slow recovery after them"),
    ] = 300.0  # fmt: skip
    every_s: Annotated[float, Meta(description="mean time between kills")] = 20.0
    broker_restarts: Annotated[
        int, Meta(description="times the whole local cluster is killed -9 and started again")
    ] = 1
    leader_kills: Annotated[
        int,
        Meta(description="times the node leading most partitions of trajectories is killed -9 "
             "(a local cluster of 3 or more nodes)"),
    ] = 0  # fmt: skip
    node_down_s: Annotated[
        float, Meta(description="seconds a killed node stays down before it is started again")
    ] = 20.0
    rolling_restarts: Annotated[
        int,
        Meta(description="times every node is stopped and started in turn, the next once every "
             "partition is in sync again (a local cluster of 3 or more nodes)"),
    ] = 0  # fmt: skip
    baseline_s: float = 60.0
    settle_s: float = 60.0
    seed: int = 0
    recovery_timeout_s: float = 180.0
    sample_every_s: Annotated[
        float, Meta(description="memory and disk of every service, the broker and the run")
    ] = 30.0
    warmup_s: Annotated[
        float, Meta(description="memory and disk trends are of the samples after this")
    ] = 600.0

    def __post_init__(self) -> None:
        for name in ("seconds", "every_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.sample_every_s <= 0:
            raise ValueError(f"sample_every_s must be positive, got {self.sample_every_s}")
        for name in ("broker_restarts", "leader_kills", "node_down_s", "rolling_restarts",
                     "baseline_s", "settle_s", "warmup_s"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def cluster_faults(self) -> list[tuple[float, str]]:
        """When each cluster fault happens (seconds into the faults, evenly spread), and which:
        leader kills first, then rolling restarts, then whole-cluster restarts."""
        kinds = (["leader"] * self.leader_kills + ["rolling"] * self.rolling_restarts
                 + ["broker"] * self.broker_restarts)  # fmt: skip
        return [(self.seconds * (i + 1) / (len(kinds) + 1), kind) for i, kind in enumerate(kinds)]
