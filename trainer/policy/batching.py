"""From a stream of finished trajectories to training batches of whole GRPO groups.

Input: `TrajectoryFinished` events in arrival order (members of one group arrive interleaved with
other groups'). Output: lists of `groups_per_batch` complete, usable groups, and micro-batch
index lists that fit a token budget. Components:
- `GroupCollector` gathers a group's trajectories by `group_id`, ignores redelivered ones, and at
  each optimiser step drops what cannot be trained: samples older than the staleness bound η,
  groups left too small, and flat groups (equal rewards give zero advantages: no signal);
- `staleness`, the version gap AReaL bounds by η, measured at the oldest generated token;
- `pack_micro_batches`, first-fit decreasing packing of sequences into micro-batches.
Every drop is counted in `BatchCounters`, since a trajectory is either trained or counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import msgspec
from msgspec import Meta

from asearcher.streams.wire.defaults import GROUPS_PER_BATCH, STALENESS_ETA
from asearcher.streams.wire.events import TrajectoryFinished


class BatchingConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How the trainer turns finished trajectories into optimiser steps."""

    groups_per_batch: Annotated[int, Meta(description="GRPO groups per optimiser step")] = (
        GROUPS_PER_BATCH
    )
    eta: Annotated[
        int,
        Meta(
            description=(
                "The staleness bound η: producers start no group that could not be trained "
                "within it. A sample whose oldest token is older than that at training time "
                'is "late".'
            )
        ),
    ] = STALENESS_ETA
    drop_stale: Annotated[
        bool,
        Meta(
            description=(
                "Drop late samples instead of training them (counted as dropped_stale). Off: "
                "AReaL's way."
            )
        ),
    ] = False
    micro_batch_tokens: Annotated[
        int, Meta(description="token budget of one micro-batch (summed sequence lengths)")
    ] = 16384
    min_group_size: Annotated[
        int, Meta(description="a group with fewer usable trajectories is dropped")
    ] = 2
    hold_batches: Annotated[
        int,
        Meta(
            description=(
                "Batches of usable groups the trainer holds ready at most: with that many it stops "
                "fetching, so a backlog waits in Kafka, not in its memory."
            )
        ),
    ] = 4

    def __post_init__(self) -> None:
        if self.groups_per_batch < 1:
            raise ValueError(f"groups_per_batch must be >= 1, got {self.groups_per_batch}")
        if self.eta < 0:
            raise ValueError(f"eta must be >= 0, got {self.eta}")
        if self.micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens must be >= 1, got {self.micro_batch_tokens}")
        if self.min_group_size < 1:
            raise ValueError(f"min_group_size must be >= 1, got {self.min_group_size}")
        if self.hold_batches < 1:
            raise ValueError(f"hold_batches must be >= 1, got {self.hold_batches}")

    @property
    def hold_groups(self) -> int:
        """Usable groups held ready at most (at least one batch, so a step never waits on it)."""
        return self.hold_batches * self.groups_per_batch


class Group(msgspec.Struct):
    """The trajectories of one question sampled together, whose rewards are compared."""

    group_id: str
    trajectories: list[TrajectoryFinished]


class BatchCounters(msgspec.Struct):
    """Running totals of what the collector kept and why it dropped the rest."""

    groups_kept: int = 0  # groups handed out in batches
    dropped_flat_groups: int = 0  # all rewards equal
    dropped_stale_samples: int = 0  # late trajectories dropped (only with drop_stale)
    late_samples_kept: int = 0  # trajectories past the staleness bound, trained all the same
    dropped_small_groups: int = 0  # fewer than min_group_size trajectories left
    samples_kept: int = 0  # trajectories handed out in batches
    duplicates_ignored: int = 0  # redelivered trajectories, or members of retired groups


def staleness(trajectory: TrajectoryFinished, trainer_version: int) -> int:
    """Versions between the trainer and the oldest token the policy wrote (0 if it wrote none)."""
    # -1 marks tokens the policy did not write (prompt, tool output): they have no version.
    versions = [version for version in trajectory.token_versions if version >= 0]
    return trainer_version - min(versions) if versions else 0


class _Pending(msgspec.Struct):
    expected: int
    members: dict[str, TrajectoryFinished]


class GroupCollector:
    """Collects trajectories into complete groups and hands out batches of usable ones."""

    def __init__(self, config: BatchingConfig) -> None:
        self.config = config
        self.counters = BatchCounters()
        self._filling: dict[str, _Pending] = {}
        self._complete: list[Group] = []  # arrival order of completion
        # Groups already trained or dropped: a late redelivery must not open them again, or it
        # would wait forever as an incomplete group (and hold back offset commits).
        self._retired: set[str] = set()
        self.flat_rewards: list[float] = []  # the reward of each flat group dropped; drained by
        # the trainer to say why it waits
        self._flat_groups: list[str] = []  # flat groups' ids since the last drain (the feeder
        # requests their questions less often)

    @property
    def filling_groups(self) -> int:
        """Groups still waiting for members."""
        return len(self._filling)

    @property
    def ready_groups(self) -> int:
        """Complete groups waiting for a batch (usable at the last `take_batch`)."""
        return len(self._complete)

    def add(self, trajectory: TrajectoryFinished) -> Group | None:
        """Hold `trajectory`; return its group the one time the group becomes complete."""
        if self._is_duplicate(trajectory):
            self.counters.duplicates_ignored += 1
            return None
        group_id = trajectory.group_id
        pending = self._filling.setdefault(
            group_id, _Pending(expected=max(trajectory.group_size, 1), members={})
        )
        pending.members[trajectory.trajectory_id] = trajectory
        if len(pending.members) < pending.expected:
            return None
        del self._filling[group_id]
        group = Group(group_id=group_id, trajectories=list(pending.members.values()))
        self._complete.append(group)
        return group

    def refuse(self, trajectory: TrajectoryFinished) -> Group | None:
        """A member of `trajectory`'s group was set aside (invalid): the group will complete
        without it. Returns the group if that completes it now."""
        if self._is_duplicate(trajectory):
            return None
        group_id = trajectory.group_id
        pending = self._filling.setdefault(
            group_id, _Pending(expected=max(trajectory.group_size, 1), members={})
        )
        pending.expected -= 1
        if len(pending.members) < pending.expected:
            return None
        del self._filling[group_id]
        if not pending.members:  # nothing of it can be trained: nothing to wait for
            self._retired.add(group_id)
            return None
        group = Group(group_id=group_id, trajectories=list(pending.members.values()))
        self._complete.append(group)
        return group

    def drain_flat_groups(self) -> list[str]:
        """The ids of the groups dropped as flat since the last call."""
        drained, self._flat_groups = self._flat_groups, []
        return drained

    def take_batch(self, trainer_version: int) -> list[Group] | None:
        """The next `groups_per_batch` usable groups at `trainer_version`, or None if too few.

        Unusable groups and stale samples are dropped (and counted) on every call, since a
        waiting group only grows staler; usable groups keep their place until a batch is full.
        """
        usable = [group for group in self._complete if self._usable(group, trainer_version)]
        self._complete = usable
        wanted = self.config.groups_per_batch
        if len(usable) < wanted:
            return None
        batch, self._complete = usable[:wanted], usable[wanted:]
        for group in batch:
            self._retired.add(group.group_id)
            late = sum(self._late(t, trainer_version) for t in group.trajectories)
            self.counters.late_samples_kept += late
        self.counters.groups_kept += len(batch)
        self.counters.samples_kept += sum(len(group.trajectories) for group in batch)
        return batch

    def pending_trajectory_ids(self) -> set[str]:
        """Ids of every trajectory held and not yet handed out: filling and complete groups."""
        ids = {tid for pending in self._filling.values() for tid in pending.members}
        ids.update(t.trajectory_id for group in self._complete for t in group.trajectories)
        return ids

    def _late(self, trajectory: TrajectoryFinished, trainer_version: int) -> bool:
        return staleness(trajectory, trainer_version) > self.config.eta

    def _is_duplicate(self, trajectory: TrajectoryFinished) -> bool:
        if trajectory.group_id in self._retired:
            return True
        pending = self._filling.get(trajectory.group_id)
        if pending is not None:
            return trajectory.trajectory_id in pending.members
        # A complete group is still waiting for a batch: everything it could hold has arrived.
        return any(group.group_id == trajectory.group_id for group in self._complete)

    def _usable(self, group: Group, trainer_version: int) -> bool:
        """Drop `group`'s late samples in place if asked to; whether what remains can be trained."""
        if self.config.drop_stale:
            kept = [t for t in group.trajectories if not self._late(t, trainer_version)]
            self.counters.dropped_stale_samples += len(group.trajectories) - len(kept)
            group.trajectories = kept
        members = group.trajectories
        if len(members) < self.config.min_group_size:
            self.counters.dropped_small_groups += 1
        elif len({t.reward for t in members}) <= 1:
            self.counters.dropped_flat_groups += 1
            self.flat_rewards.append(members[0].reward)
            self._flat_groups.append(group.group_id)
        else:
            return True
        self._retired.add(group.group_id)
        return False


def pack_micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Indices of `lengths` packed first-fit decreasing into micro-batches whose padded size
    (sequences × the longest one, what the tensors hold) is <= `token_budget`.

    A sequence longer than the budget gets a micro-batch of its own. Ties are broken by index, so
    the packing is deterministic; indices within a micro-batch are ascending.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    if any(length < 0 for length in lengths):
        raise ValueError("lengths must be >= 0")
    order = sorted(range(len(lengths)), key=lambda index: (-lengths[index], index))
    bins: list[list[int]] = []
    for index in order:
        # In decreasing order a bin's first sequence is its longest: adding one more costs a
        # whole row of that length. An oversize sequence alone already exceeds the budget.
        slot = next((b for b in bins if (len(b) + 1) * max(lengths[b[0]], 1) <= token_budget), None)
        if slot is None:
            bins.append([index])
        else:
            slot.append(index)
    return [sorted(indices) for indices in bins]
