"""Why the trainer has not taken a step: one line with counts, for logs and `stream status`.

Users of the reference system met training runs that hung on a batch that never filled, with
nothing saying why. The trainer keeps a `WaitTracker` of what arrived and what was dropped since
its last step and, once it has waited `stall_after_s`, says which of the usual causes it is:
nothing arriving, every group flat (often: an untrained policy that never answers), groups
incomplete, or samples too stale.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from asearcher.trainer.policy.batching import BatchCounters


@dataclass(slots=True)
class WaitSnapshot:
    """The trainer's holdings and drops since its last step."""

    version: int
    held: int  # trajectories held, not yet trained or dropped
    filling_groups: int  # groups still missing members
    ready_groups: int  # complete, usable groups waiting for a batch
    groups_per_batch: int
    dropped_flat: int = 0  # since the last step
    dropped_small: int = 0
    dropped_stale: int = 0
    flat_rewards: frozenset[float] = frozenset()  # the rewards of the flat groups dropped
    arrived: int = 0  # trajectories received since the last step
    waited_s: float = 0.0  # since the last step (or the start)


def why_waiting(s: WaitSnapshot) -> str:
    """One line saying why no step was taken, with counts."""
    head = f"no step for {s.waited_s:.0f}s at v{s.version}: "
    if s.arrived == 0 and s.held == 0:
        return head + "no trajectories arrived: are rollout producers running and fed requests?"
    ready = f"{s.ready_groups} of {s.groups_per_batch} groups ready"
    if s.dropped_flat and s.ready_groups == 0 and s.filling_groups == 0:
        return head + f"{ready}; {s.dropped_flat} groups dropped as flat " + _flat(s.flat_rewards)
    drops = _drops(s)
    if s.filling_groups:
        return (
            head + f"{ready}, {s.filling_groups} groups still filling "
            f"({s.held} trajectories held){drops}"
        )
    return head + f"{ready} ({s.held} trajectories held){drops}"


def _flat(rewards: frozenset[float]) -> str:
    if len(rewards) == 1:
        (reward,) = rewards
        hint = ": is the policy producing answers?" if reward <= 0 else ""
        return f"(every reward is {reward:g}{hint})"
    return "(equal rewards within each group: no learning signal)"


def _drops(s: WaitSnapshot) -> str:
    parts = [
        f"{count} {what}"
        for count, what in (
            (s.dropped_flat, "flat groups"),
            (s.dropped_small, "small groups"),
            (s.dropped_stale, "stale samples"),
        )
        if count
    ]
    return f"; dropped since the last step: {', '.join(parts)}" if parts else ""


@dataclass(slots=True)
class WaitTracker:
    """Counts arrivals and drops since the last step, to explain a wait."""

    stall_after_s: float = 30.0
    since: float = field(default_factory=time.monotonic)
    arrived: int = 0
    flat_rewards: set[float] = field(default_factory=set)
    _counters_at_step: BatchCounters = field(default_factory=BatchCounters)

    def stepped(self, counters: BatchCounters) -> None:
        """A step was taken: start counting afresh."""
        self.since, self.arrived = time.monotonic(), 0
        self.flat_rewards = set()
        self._counters_at_step = BatchCounters(**_fields(counters))

    def stalled(self) -> bool:
        """Whether the trainer has waited long enough for the wait to be reported."""
        return time.monotonic() - self.since >= self.stall_after_s

    def snapshot(
        self, version: int, counters: BatchCounters, held: int, filling: int, ready: int,
        groups_per_batch: int,
    ) -> WaitSnapshot:  # fmt: skip
        """What the trainer holds and dropped since its last step."""
        last = self._counters_at_step
        return WaitSnapshot(
            version=version, held=held, filling_groups=filling, ready_groups=ready,
            groups_per_batch=groups_per_batch,
            dropped_flat=counters.dropped_flat_groups - last.dropped_flat_groups,
            dropped_small=counters.dropped_small_groups - last.dropped_small_groups,
            dropped_stale=counters.dropped_stale_samples - last.dropped_stale_samples,
            flat_rewards=frozenset(self.flat_rewards), arrived=self.arrived,
            waited_s=time.monotonic() - self.since,
        )  # fmt: skip


def _fields(counters: BatchCounters) -> dict[str, int]:
    return {name: getattr(counters, name) for name in counters.__struct_fields__}
