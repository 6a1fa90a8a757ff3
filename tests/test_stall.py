"""Why the trainer waits: the collector's counters, the tracker, and the one-line reason."""

from __future__ import annotations

import time

from asearcher.streams.wire.events import TrajectoryFinished, new_id
from asearcher.trainer.policy.batching import BatchingConfig, GroupCollector
from asearcher.trainer.runtime.stall import WaitSnapshot, WaitTracker, why_waiting


def _trajectory(group: str, reward: float, size: int, version: int = 0) -> TrajectoryFinished:
    """Three prompt tokens and two policy-written ones at `version`."""
    return TrajectoryFinished(
        trajectory_id=new_id(), group_id=group, question_id=group, token_ids=[1, 2, 3, 4, 5],
        logprobs=[0.0] * 5, loss_mask=[0, 0, 0, 1, 1],
        token_versions=[-1, -1, -1, version, version], prompt_length=3, reward=reward,
        group_size=size,
    )  # fmt: skip


def _add_group(
    collector: GroupCollector, tracker: WaitTracker, group: str, rewards: list[float],
    size: int | None = None, version: int = 0,
) -> None:  # fmt: skip
    """Members of `group` with `rewards` arrive (all of it unless `size` says more will)."""
    for reward in rewards:
        collector.add(_trajectory(group, reward, size or len(rewards), version))
    tracker.arrived += len(rewards)


def _reason(collector: GroupCollector, tracker: WaitTracker, version: int = 0) -> str:
    """What the trainer says after a batch could not be taken at `version`."""
    assert collector.take_batch(version) is None
    tracker.flat_rewards.update(collector.flat_rewards)
    collector.flat_rewards.clear()
    return why_waiting(_snapshot(collector, tracker, version))


def _snapshot(collector: GroupCollector, tracker: WaitTracker, version: int = 0) -> WaitSnapshot:
    return tracker.snapshot(
        version, collector.counters, len(collector.pending_trajectory_ids()),
        collector.filling_groups, collector.ready_groups, collector.config.groups_per_batch,
    )  # fmt: skip


def test_why_waiting_nothing_arrived_asks_whether_producers_run() -> None:
    collector, tracker = GroupCollector(BatchingConfig(groups_per_batch=4)), WaitTracker()
    reason = _reason(collector, tracker, version=3)
    assert reason.startswith("no step for 0s at v3: no trajectories arrived")
    assert "are rollout producers running and fed requests?" in reason


def test_why_waiting_reports_the_seconds_waited_and_version() -> None:
    snapshot = WaitSnapshot(
        version=7, held=0, filling_groups=0, ready_groups=0, groups_per_batch=8, waited_s=42.4
    )
    assert why_waiting(snapshot).startswith("no step for 42s at v7: ")


def test_why_waiting_every_group_flat_at_zero_asks_for_answers() -> None:
    collector, tracker = GroupCollector(BatchingConfig(groups_per_batch=2)), WaitTracker()
    for group in ("a", "b", "c"):
        _add_group(collector, tracker, group, [0.0, 0.0])
    reason = _reason(collector, tracker)
    assert collector.counters.dropped_flat_groups == 3
    assert tracker.flat_rewards == {0.0}
    assert reason.endswith(
        "0 of 2 groups ready; 3 groups dropped as flat "
        "(every reward is 0: is the policy producing answers?)"
    )


def test_why_waiting_every_group_flat_at_one_names_the_reward_without_the_hint() -> None:
    collector, tracker = GroupCollector(BatchingConfig(groups_per_batch=2)), WaitTracker()
    for group in ("a", "b"):
        _add_group(collector, tracker, group, [1.0, 1.0, 1.0])
    reason = _reason(collector, tracker)
    assert reason.endswith("2 groups dropped as flat (every reward is 1)")
    assert "producing answers" not in reason


def test_why_waiting_flat_groups_with_different_rewards_say_equal_within_each_group() -> None:
    collector, tracker = GroupCollector(BatchingConfig(groups_per_batch=2)), WaitTracker()
    _add_group(collector, tracker, "zeros", [0.0, 0.0])
    _add_group(collector, tracker, "ones", [1.0, 1.0])
    reason = _reason(collector, tracker)
    assert collector.counters.dropped_flat_groups == 2
    assert reason.endswith(
        "2 groups dropped as flat (equal rewards within each group: no learning signal)"
    )
    assert "every reward is" not in reason


def test_why_waiting_groups_still_filling_gives_counts() -> None:
    collector, tracker = GroupCollector(BatchingConfig(groups_per_batch=4)), WaitTracker()
    _add_group(collector, tracker, "ready", [0.0, 1.0])
    _add_group(collector, tracker, "one-of-three", [1.0], size=3)
    _add_group(collector, tracker, "two-of-three", [0.0, 1.0], size=3)
    reason = _reason(collector, tracker)
    assert (collector.filling_groups, collector.ready_groups) == (2, 1)
    assert reason.endswith("1 of 4 groups ready, 2 groups still filling (5 trajectories held)")
    assert "dropped" not in reason


def test_why_waiting_drops_since_the_last_step_are_listed() -> None:
    batching = BatchingConfig(groups_per_batch=4, eta=1, min_group_size=2, drop_stale=True)
    collector = GroupCollector(batching)
    tracker = WaitTracker()
    _add_group(collector, tracker, "stale", [0.0, 1.0], version=0)  # 5 versions old at v5
    _add_group(collector, tracker, "flat", [0.5, 0.5], version=5)
    _add_group(collector, tracker, "usable", [0.0, 1.0], version=5)
    reason = _reason(collector, tracker, version=5)
    counters = collector.counters
    assert (counters.dropped_stale_samples, counters.dropped_small_groups) == (2, 1)
    assert counters.dropped_flat_groups == 1
    assert reason.endswith(
        "1 of 4 groups ready (2 trajectories held); "
        "dropped since the last step: 1 flat groups, 1 small groups, 2 stale samples"
    )


def test_why_waiting_flat_drops_while_groups_fill_are_listed_with_the_filling() -> None:
    collector, tracker = GroupCollector(BatchingConfig(groups_per_batch=2)), WaitTracker()
    _add_group(collector, tracker, "flat", [0.0, 0.0])
    _add_group(collector, tracker, "filling", [1.0], size=2)
    reason = _reason(collector, tracker)
    assert reason.endswith(
        "0 of 2 groups ready, 1 groups still filling (1 trajectories held); "
        "dropped since the last step: 1 flat groups"
    )


def test_collector_counts_ready_and_filling_groups_as_they_complete_and_go() -> None:
    collector = GroupCollector(BatchingConfig(groups_per_batch=1))
    collector.add(_trajectory("g", 0.0, 2))
    assert (collector.filling_groups, collector.ready_groups) == (1, 0)
    collector.add(_trajectory("g", 1.0, 2))
    assert (collector.filling_groups, collector.ready_groups) == (0, 1)
    assert collector.take_batch(0) is not None
    assert (collector.filling_groups, collector.ready_groups) == (0, 0)
    assert collector.flat_rewards == []


def test_collector_flat_rewards_records_one_reward_per_flat_group() -> None:
    collector = GroupCollector(BatchingConfig(groups_per_batch=1))
    for group, reward in (("a", 0.0), ("b", 0.5), ("c", 0.0)):
        collector.add(_trajectory(group, reward, 3))
        collector.add(_trajectory(group, reward, 3))
        collector.add(_trajectory(group, reward, 3))
    assert collector.take_batch(0) is None
    assert collector.flat_rewards == [0.0, 0.5, 0.0]
    assert collector.ready_groups == 0


def test_wait_tracker_stepped_counts_afresh_from_the_step() -> None:
    collector, tracker = GroupCollector(BatchingConfig(groups_per_batch=1)), WaitTracker()
    _add_group(collector, tracker, "flat-before", [0.0, 0.0])
    _add_group(collector, tracker, "trained", [0.0, 1.0])
    assert collector.take_batch(0) is not None
    tracker.flat_rewards.update(collector.flat_rewards)
    collector.flat_rewards.clear()
    assert _snapshot(collector, tracker).dropped_flat == 1
    tracker.stepped(collector.counters)
    after_step = _snapshot(collector, tracker, version=1)
    assert (after_step.arrived, after_step.dropped_flat, after_step.flat_rewards) == (
        0, 0, frozenset(),
    )  # fmt: skip
    _add_group(collector, tracker, "flat-after", [1.0, 1.0], version=1)
    reason = _reason(collector, tracker, version=1)
    later = _snapshot(collector, tracker, version=1)
    assert (later.arrived, later.dropped_flat, later.flat_rewards) == (2, 1, frozenset({1.0}))
    assert reason.endswith("1 groups dropped as flat (every reward is 1)")


def test_wait_tracker_stalled_after_stall_after_s_until_a_step() -> None:
    collector, tracker = GroupCollector(BatchingConfig()), WaitTracker(stall_after_s=0.2)
    assert not tracker.stalled()
    time.sleep(0.25)
    assert tracker.stalled()
    assert _snapshot(collector, tracker).waited_s >= 0.2
    tracker.stepped(collector.counters)
    assert not tracker.stalled()
    assert _snapshot(collector, tracker).waited_s < 0.2
