"""AReaL's staleness control, applied by each rollout producer to its own share of the work.

With trainer version V and bound η, AReaL admits a new episode only while
    started ≤ (V + η + 1) × B
where B is the number of episodes per training step. An episode here is a GRPO group (one
request), as in AReaL, whose trainer also takes whole groups per step: counting trajectories
instead would let a group of unusual size starve one side (bigger groups use more trajectories
per step than the bound grows by, and the producer waits for a trainer that waits for groups).
Then every group started at policy version v is trained at a version ≤ v + η. Each producer
counts what it started since it joined (at version V0) against its share of B, so the rule
needs no shared counter.

Groups that will never count towards a training step are given back, as AReaL does for
rejected rollouts: a group that was not delivered (cancelled, failed, revoked) and a group all
of whose trajectories the trainer reports as dropped (flat or small group, stale, invalid) on
`trainer.metrics`. Without that, a share of dropped groups would stall producers for good.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

import msgspec
from msgspec import Meta

from asearcher.streams.wire.defaults import GROUPS_PER_BATCH, STALENESS_ETA

DELIVERED_MEMORY = 200_000  # delivered trajectory ids remembered, to recognise drops


class StalenessConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The staleness bound and how much of each training batch this producer supplies."""

    eta: Annotated[
        int, Meta(description="the bound: trainer version - policy version of the oldest token")
    ] = STALENESS_ETA
    batch_groups: Annotated[
        int, Meta(description="groups the trainer takes per step (all producers)")
    ] = GROUPS_PER_BATCH
    producers: Annotated[int, Meta(description="rollout producers sharing that batch")] = 1
    producer_index: Annotated[
        int, Meta(description="which of them this one is (0 ... producers - 1)")
    ] = 0
    enabled: Annotated[
        bool,
        Meta(description="false: start groups regardless of how far ahead of the trainer they are"),
    ] = True

    def __post_init__(self) -> None:
        if self.eta < 0:
            raise ValueError(f"eta must be >= 0, got {self.eta}")
        if self.batch_groups < 1 or self.producers < 1:
            raise ValueError("batch_groups and producers must be positive")
        if not 0 <= self.producer_index < self.producers:
            raise ValueError(f"producer_index must be within 0..{self.producers - 1}")
        if self.share < 1:
            raise ValueError(
                f"producer {self.producer_index} of {self.producers} gets no share of a batch "
                f"of {self.batch_groups} groups: use fewer producers"
            )

    @property
    def share(self) -> int:
        """Groups per training step this producer is expected to deliver.

        The producers' shares add up to exactly one batch (the first ones take the remainder):
        rounding down would leave the producers together short of a batch per version, and the
        trainer would starve.
        """
        base, extra = divmod(self.batch_groups, self.producers)
        return base + (self.producer_index < extra)


class StalenessGate:
    """Decides whether one more group may start now, counting groups as AReaL counts episodes."""

    def __init__(self, config: StalenessConfig, base_version: int) -> None:
        self.config = config
        self.base_version = base_version
        self.started = 0  # groups started since joining, less those given back
        # Delivered trajectory -> its group, and each group's members not yet reported dropped:
        # a group is given back when the last of them is. Insertion-ordered, so bounded.
        self._group_of: dict[str, str] = {}
        self._undropped: dict[str, int] = {}

    def capacity(self, trainer_version: int) -> int:
        """How many groups may have been started by now in total."""
        steps = trainer_version - self.base_version + self.config.eta + 1
        return max(0, steps) * self.config.share

    def admits(self, trainer_version: int) -> bool:
        """Whether one more group keeps within the bound."""
        if not self.config.enabled:
            return True
        return self.started + 1 <= self.capacity(trainer_version)

    def record_start(self) -> None:
        self.started += 1

    def give_back(self) -> None:
        """A started group will never be trained (not delivered, or all of it dropped)."""
        self.started = max(0, self.started - 1)

    def track(self, group_id: str, trajectory_ids: Iterable[str]) -> None:
        """Remember a delivered group, to recognise its members among the trainer's drops."""
        members = list(trajectory_ids)
        for trajectory_id in members:
            self._group_of[trajectory_id] = group_id
        self._undropped[group_id] = self._undropped.get(group_id, 0) + len(members)
        while len(self._group_of) > DELIVERED_MEMORY:
            oldest = self._group_of.pop(next(iter(self._group_of)))
            self._undropped.pop(oldest, None)

    def dropped_by_trainer(self, trajectory_ids: Iterable[str]) -> int:
        """Count the trainer's drops against the groups this producer delivered; give back each
        group none of whose members will be trained. Returns the groups given back."""
        given_back = 0
        for trajectory_id in trajectory_ids:
            group_id = self._group_of.pop(trajectory_id, None)
            if group_id is None or group_id not in self._undropped:
                continue  # another producer's, or forgotten
            self._undropped[group_id] -= 1
            if self._undropped[group_id] == 0:
                del self._undropped[group_id]
                self.give_back()
                given_back += 1
        return given_back
