"""Grouping finished trajectories into training batches, and packing micro-batches."""

from __future__ import annotations

import random

import msgspec
import pytest

from asearcher.streams.wire.events import TrajectoryFinished
from asearcher.trainer.policy.batching import (
    BatchCounters,
    BatchingConfig,
    GroupCollector,
    pack_micro_batches,
    staleness,
)


def traj(
    group: str,
    tid: str,
    reward: float = 0.0,
    versions: tuple[int, ...] = (-1, -1, 0, 0),
    group_size: int = 2,
) -> TrajectoryFinished:
    """A trajectory whose token versions are given; -1 marks prompt and tool-output tokens."""
    n = len(versions)
    return TrajectoryFinished(
        trajectory_id=tid,
        group_id=group,
        question_id=f"q-{group}",
        token_ids=list(range(n)),
        logprobs=[-0.5] * n,
        loss_mask=[int(v >= 0) for v in versions],
        token_versions=list(versions),
        prompt_length=sum(1 for v in versions if v < 0),
        reward=reward,
        group_size=group_size,
    )


def full_group(collector: GroupCollector, group: str, rewards: list[float], **fields) -> None:
    for i, reward in enumerate(rewards):
        collector.add(traj(group, f"{group}-{i}", reward, group_size=len(rewards), **fields))


def ids(groups) -> list[str]:
    return [group.group_id for group in groups]


# --- staleness -----------------------------------------------------------------------------------


def test_staleness_uses_oldest_generated_token_and_skips_prompt_tokens():
    # Prompt (-1), turn at version 3, tool output (-1), turn at version 5: oldest is 3.
    trajectory = traj("g", "t", versions=(-1, -1, 3, 3, -1, 5, 5))
    assert staleness(trajectory, trainer_version=7) == 4
    assert staleness(traj("g", "t", versions=(-1, -1)), trainer_version=7) == 0
    assert staleness(traj("g", "t", versions=()), trainer_version=7) == 0


# --- grouping ------------------------------------------------------------------------------------


def test_collector_interleaved_groups_complete_once_each():
    collector = GroupCollector(BatchingConfig())
    assert collector.add(traj("a", "a0", group_size=3)) is None
    assert collector.add(traj("b", "b0", group_size=2)) is None
    assert collector.add(traj("a", "a1", group_size=3)) is None
    done_b = collector.add(traj("b", "b1", group_size=2))
    assert done_b is not None and done_b.group_id == "b"
    assert [t.trajectory_id for t in done_b.trajectories] == ["b0", "b1"]
    done_a = collector.add(traj("a", "a2", group_size=3))
    assert done_a is not None and len(done_a.trajectories) == 3


def test_collector_group_size_zero_means_one():
    collector = GroupCollector(BatchingConfig())
    assert collector.add(traj("solo", "s0", group_size=0)) is not None


def test_collector_duplicates_ignored_while_filling_complete_and_after_batch():
    collector = GroupCollector(BatchingConfig(groups_per_batch=1))
    assert collector.add(traj("a", "a0", 1.0)) is None
    assert collector.add(traj("a", "a0", 1.0)) is None  # redelivery: still one member
    assert collector.pending_trajectory_ids() == {"a0"}
    assert collector.add(traj("a", "a1", 0.0)) is not None
    assert collector.add(traj("a", "a1", 0.0)) is None  # group already complete
    batch = collector.take_batch(trainer_version=0)
    assert batch is not None and len(batch[0].trajectories) == 2
    # A late redelivery of a trained group must not reopen it as a group that never completes.
    assert collector.add(traj("a", "a0", 1.0)) is None
    assert collector.pending_trajectory_ids() == set()
    assert collector.counters.duplicates_ignored == 3
    assert collector.counters.samples_kept == 2


def test_collector_flat_groups_dropped_and_counted():
    collector = GroupCollector(BatchingConfig(groups_per_batch=1))
    full_group(collector, "flat", [1.0, 1.0, 1.0])
    full_group(collector, "zero", [0.0, 0.0])
    assert collector.take_batch(trainer_version=0) is None
    assert collector.counters.dropped_flat_groups == 2
    full_group(collector, "mixed", [1.0, 0.0])
    assert ids(collector.take_batch(trainer_version=0)) == ["mixed"]
    assert collector.counters == BatchCounters(groups_kept=1, dropped_flat_groups=2, samples_kept=2)
    # The trainer names them once, in its next event, for the feeder to pass their questions over.
    assert collector.drain_flat_groups() == ["flat", "zero"]
    assert collector.drain_flat_groups() == []


def test_collector_trains_late_samples_by_default_and_counts_them():
    # AReaL bounds staleness where rollouts start: a trajectory that ends η + 2 late is trained.
    collector = GroupCollector(BatchingConfig(groups_per_batch=1, eta=4))
    collector.add(traj("g", "long", 1.0, (-1, 4, 9), group_size=2))  # staleness 6 = η + 2
    collector.add(traj("g", "short", 0.0, (-1, 9), group_size=2))
    batch = collector.take_batch(trainer_version=10)
    assert batch is not None
    assert sorted(t.trajectory_id for t in batch[0].trajectories) == ["long", "short"]
    assert collector.counters.dropped_stale_samples == 0
    assert collector.counters.late_samples_kept == 1


def test_collector_stale_samples_dropped_and_group_kept_if_large_enough():
    # Trainer at 10, η = 4: a sample whose oldest generated token is from version 5 is 5 stale.
    collector = GroupCollector(
        BatchingConfig(groups_per_batch=1, eta=4, min_group_size=2, drop_stale=True)
    )
    stale, fresh, edge = (-1, -1, 5, -1, 9), (-1, 8, 9), (-1, -1, 6, 6)  # staleness 5, 2, 4
    collector.add(traj("g", "old", 1.0, stale, group_size=3))
    collector.add(traj("g", "new", 1.0, fresh, group_size=3))
    collector.add(traj("g", "edge", 0.0, edge, group_size=3))
    batch = collector.take_batch(trainer_version=10)
    assert batch is not None
    assert [t.trajectory_id for t in batch[0].trajectories] == ["new", "edge"]
    assert collector.counters.dropped_stale_samples == 1
    assert collector.counters.samples_kept == 2


def test_collector_group_too_small_after_stale_drops_is_dropped_and_counted():
    collector = GroupCollector(
        BatchingConfig(groups_per_batch=1, eta=1, min_group_size=2, drop_stale=True)
    )
    collector.add(traj("g", "old", 1.0, (-1, 0, 0), group_size=2))
    collector.add(traj("g", "new", 0.0, (-1, 2, 2), group_size=2))
    assert collector.take_batch(trainer_version=2) is None
    assert collector.counters.dropped_stale_samples == 1
    assert collector.counters.dropped_small_groups == 1
    assert collector.pending_trajectory_ids() == set()


def test_collector_small_group_below_min_group_size_dropped():
    collector = GroupCollector(BatchingConfig(groups_per_batch=1, min_group_size=3))
    full_group(collector, "pair", [1.0, 0.0])
    assert collector.take_batch(trainer_version=0) is None
    assert collector.counters.dropped_small_groups == 1


def test_collector_batches_hold_exactly_groups_per_batch_in_arrival_order():
    collector = GroupCollector(BatchingConfig(groups_per_batch=2))
    for name in ["g0", "g1", "g2", "g3", "g4"]:
        full_group(collector, name, [1.0, 0.0, 0.5])
    assert ids(collector.take_batch(trainer_version=0)) == ["g0", "g1"]
    assert ids(collector.take_batch(trainer_version=0)) == ["g2", "g3"]
    assert collector.take_batch(trainer_version=0) is None  # g4 waits for a partner
    assert collector.pending_trajectory_ids() == {"g4-0", "g4-1", "g4-2"}
    full_group(collector, "g5", [0.0, 1.0])
    assert ids(collector.take_batch(trainer_version=0)) == ["g4", "g5"]
    assert collector.counters.groups_kept == 6
    assert collector.counters.samples_kept == 5 * 3 + 2


def test_collector_waiting_group_that_turns_stale_is_dropped_later():
    collector = GroupCollector(BatchingConfig(groups_per_batch=2, eta=2, drop_stale=True))
    full_group(collector, "early", [1.0, 0.0], versions=(-1, 0, 0))
    assert collector.take_batch(trainer_version=1) is None  # fresh, but alone
    full_group(collector, "late", [1.0, 0.0], versions=(-1, 3, 3))
    assert collector.take_batch(trainer_version=3) is None  # "early" is now 3 stale: dropped
    assert collector.counters.dropped_stale_samples == 2
    assert collector.counters.dropped_small_groups == 1
    full_group(collector, "later", [0.0, 1.0], versions=(-1, 3, 3))
    assert ids(collector.take_batch(trainer_version=3)) == ["late", "later"]


def test_collector_pending_ids_cover_filling_and_waiting_groups():
    collector = GroupCollector(BatchingConfig(groups_per_batch=5))
    full_group(collector, "done", [1.0, 0.0])
    collector.add(traj("open", "open-0", group_size=4))
    assert collector.pending_trajectory_ids() == {"done-0", "done-1", "open-0"}


# --- config --------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["groups_per_batch", "micro_batch_tokens", "min_group_size"])
def test_batching_config_non_positive_value_names_the_field(field):
    with pytest.raises(ValueError, match=field):
        BatchingConfig(**{field: 0})


def test_batching_config_negative_eta_and_unknown_field_rejected():
    with pytest.raises(ValueError, match="eta"):
        BatchingConfig(eta=-1)
    with pytest.raises(msgspec.ValidationError, match="groups"):
        msgspec.convert({"groups": 4}, BatchingConfig)


# --- micro-batch packing -------------------------------------------------------------------------


def test_pack_micro_batches_first_fit_decreasing_by_hand():
    # Padded size = sequences x the longest. Decreasing: 5(#0) 4(#1) 3(#2) 3(#3) 1(#4), budget 8.
    # 5 opens A (5); 4 would make A 2x5=10: opens B (4); 3: A 10 no, B 2x4=8 yes;
    # 3: A 10 no, B 3x4=12 no: opens C (3); 1: A no, B no, C 2x3=6 yes.
    assert pack_micro_batches([5, 4, 3, 3, 1], token_budget=8) == [[0], [1, 2], [3, 4]]


def test_pack_micro_batches_oversize_sequence_gets_its_own_batch():
    # Decreasing: 12(#1) 7(#3) 3(#0) 0(#2), budget 10. 12 > 10 opens A alone for good;
    # 7 opens B; 3 would make B 2x7=14: opens C; the empty sequence fits C (2x3=6), never A.
    assert pack_micro_batches([3, 12, 0, 7], token_budget=10) == [[1], [3], [0, 2]]


def test_pack_micro_batches_empty_and_invalid_inputs():
    assert pack_micro_batches([], token_budget=8) == []
    with pytest.raises(ValueError, match="token_budget"):
        pack_micro_batches([1], token_budget=0)
    with pytest.raises(ValueError, match="lengths"):
        pack_micro_batches([1, -2], token_budget=8)


def test_pack_micro_batches_random_cases_keep_every_property():
    rng = random.Random(20250917)
    for _ in range(300):
        budget = rng.randint(1, 4096)
        lengths = [rng.randint(0, int(budget * 1.5)) for _ in range(rng.randint(0, 40))]
        packed = pack_micro_batches(lengths, budget)
        flat = [i for batch in packed for i in batch]
        assert sorted(flat) == list(range(len(lengths)))  # every index exactly once
        for batch in packed:
            assert batch, "no empty micro-batch"
            if len(batch) > 1:
                assert len(batch) * max(lengths[i] for i in batch) <= budget  # padded size
        for i, length in enumerate(lengths):
            if length > budget:
                assert [i] in packed  # an oversize sequence rides alone
        assert pack_micro_batches(lengths, budget) == packed  # deterministic
