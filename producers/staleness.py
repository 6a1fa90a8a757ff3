"""AReaL's staleness control, applied by each rollout producer to its own share of the work.

With trainer version V and bound η, AReaL admits a new trajectory only while
    started ≤ (V + η + 1) × B
where B is the number of trajectories per training step. Then every trajectory started at
policy version v is trained at a version ≤ v + η. Each producer counts what it started since it
joined (at version V0) against its share of B, so the rule needs no shared counter.

Trajectories that will never count towards a training step are given back, as AReaL does for
rejected rollouts: a group that was not delivered (cancelled, failed, revoked) and every
trajectory the trainer reports as dropped (flat or small group, stale) on `trainer.metrics`.
Without that, a share of dropped groups would stall producers for good.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

DELIVERED_MEMORY = 200_000  # delivered trajectory ids remembered, to recognise drops


class StalenessConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The staleness bound and how much of each training batch this producer supplies."""

    eta: int = 4  # the bound: trainer version - policy version of the oldest token
    batch_trajectories: int = 128  # trajectories the trainer takes per step (all producers)
    producers: int = 1  # rollout producers sharing that batch
    producer_index: int = 0  # which of them this one is (0 ... producers - 1)
    group_size: int = 0  # > 0: shares are whole groups of this size (a run config sets it)
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.eta < 0:
            raise ValueError(f"eta must be >= 0, got {self.eta}")
        if self.batch_trajectories < 1 or self.producers < 1:
            raise ValueError("batch_trajectories and producers must be positive")
        if not 0 <= self.producer_index < self.producers:
            raise ValueError(f"producer_index must be within 0..{self.producers - 1}")
        if self.group_size < 0:
            raise ValueError(f"group_size must be >= 0, got {self.group_size}")
        if self.share < 1:
            raise ValueError(
                f"producer {self.producer_index} of {self.producers} gets no share of a batch "
                f"of {self.batch_trajectories} trajectories: use fewer producers"
            )

    @property
    def share(self) -> int:
        """Trajectories per training step this producer is expected to deliver.

        The producers' shares add up to exactly one batch (the first ones take the remainder),
        in whole groups when `group_size` is set: otherwise rounding would leave the producers
        together short of a batch per version, and the trainer would starve.
        """
        unit = self.group_size or 1
        units = self.batch_trajectories // unit
        mine = units // self.producers + (self.producer_index < units % self.producers)
        return mine * unit


class StalenessGate:
    """Decides whether a group of n more trajectories may start now."""

    def __init__(self, config: StalenessConfig, base_version: int) -> None:
        self.config = config
        self.base_version = base_version
        self.started = 0
        self._delivered: dict[str, None] = {}  # insertion-ordered: a bounded set

    def capacity(self, trainer_version: int) -> int:
        """How many trajectories may have been started by now in total."""
        steps = trainer_version - self.base_version + self.config.eta + 1
        return max(0, steps) * self.config.share

    def admits(self, n: int, trainer_version: int) -> bool:
        """Whether n more trajectories keep within the bound."""
        if not self.config.enabled:
            return True
        return self.started + n <= self.capacity(trainer_version)

    def record_start(self, n: int) -> None:
        self.started += n

    def give_back(self, n: int) -> None:
        """`n` started trajectories will never be trained (not delivered)."""
        self.started = max(0, self.started - n)

    def track(self, trajectory_ids: Iterable[str]) -> None:
        """Remember delivered trajectories, to recognise them among the trainer's drops."""
        for trajectory_id in trajectory_ids:
            self._delivered[trajectory_id] = None
        while len(self._delivered) > DELIVERED_MEMORY:
            self._delivered.pop(next(iter(self._delivered)))

    def dropped_by_trainer(self, trajectory_ids: Iterable[str]) -> int:
        """Give back those of `trajectory_ids` this producer delivered; how many they were."""
        mine = [t for t in trajectory_ids if t in self._delivered]
        for trajectory_id in mine:
            del self._delivered[trajectory_id]
        self.give_back(len(mine))
        return len(mine)
