"""What the trainer refuses to train on, and how a group goes on without a refused member."""

from __future__ import annotations

import msgspec
import pytest

from asearcher.streams.wire.events import TrajectoryFinished, WeightsPublished
from asearcher.trainer.policy.batching import BatchingConfig, GroupCollector
from asearcher.trainer.runtime.validation import reason_to_refuse

VOCAB = 100


def trajectory(
    group: str = "g", size: int = 2, reward: float = 1.0, **fields
) -> TrajectoryFinished:
    base = dict(
        trajectory_id=msgspec.json.encode(fields).hex()[:8] + group + str(reward),
        group_id=group, question_id="q", token_ids=[1, 2, 3, 4], logprobs=[0.0, 0.0, -0.5, -1.0],
        loss_mask=[0, 0, 1, 1], token_versions=[-1, -1, 0, 0], reward=reward, group_size=size,
    )  # fmt: skip
    return TrajectoryFinished(**{**base, **fields})


def test_a_well_formed_trajectory_is_accepted() -> None:
    assert reason_to_refuse(trajectory(), VOCAB) is None
    # Sequences of [1], [2], [3, 4]: each holds a token.
    assert reason_to_refuse(trajectory(sequence_starts=[1, 2]), VOCAB) is None


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"token_ids": [1, 2, 3, VOCAB]}, "outside the policy's vocabulary"),
        ({"token_ids": [1, 2, 3, -1]}, "outside the policy's vocabulary"),
        ({"loss_mask": [0, 1]}, "differ in length"),
        ({"logprobs": [0.0]}, "differ in length"),
        ({"token_ids": [], "logprobs": [], "loss_mask": [], "token_versions": []}, "no tokens"),
        ({"loss_mask": [0, 0, 2, 1]}, "other than 0 and 1"),
        ({"token_versions": [-1, -7, 0, 0]}, "below -1"),
        ({"reward": float("nan")}, "reward nan is not finite"),
        ({"reward": float("inf")}, "reward inf is not finite"),
        ({"temperature": 1e-300}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"logprobs": [0.0, 0.0, float("nan"), -1.0]}, "log-prob"),
        ({"logprobs": [0.0, 0.0, 3.0, -1.0]}, "log-prob"),
        ({"group_size": 0}, "group_size 0"),
        ({"group_id": ""}, "empty group_id"),
        ({"sequence_starts": [0]}, "outside 1..3"),
        ({"sequence_starts": [4]}, "outside 1..3"),
        ({"sequence_starts": [2, 2]}, "not strictly increasing"),
        ({"sequence_starts": [3, 1]}, "not strictly increasing"),
        ({"purpose": "eval"}, "only training trajectories"),
        ({"purpose": "synthesis"}, "only training trajectories"),
    ],
)
def test_a_trajectory_that_cannot_work_is_refused_with_the_reason(fields, reason) -> None:
    refused = reason_to_refuse(trajectory(**fields), VOCAB)
    assert refused is not None and reason in refused


def test_a_trajectory_from_a_version_not_yet_published_is_refused() -> None:
    claimed = trajectory(token_versions=[-1, -1, 1_000_000, 3])
    assert reason_to_refuse(claimed, VOCAB) is None  # without the trainer's version: no check
    refused = reason_to_refuse(claimed, VOCAB, newest_version=3)
    assert refused == "token version 1000000 is newer than the newest version published (3)"
    assert reason_to_refuse(trajectory(token_versions=[-1, -1, 3, 3]), VOCAB, 3) is None


def test_another_event_kind_is_refused() -> None:
    event = WeightsPublished(version=1, uri="file:///w", sha256="x", step=1)
    assert "not a trajectory" in (reason_to_refuse(event, VOCAB) or "")


def test_a_group_completes_without_its_refused_member() -> None:
    collector = GroupCollector(BatchingConfig(groups_per_batch=1))
    first = trajectory(size=3, reward=1.0)
    assert collector.add(first) is None
    assert collector.refuse(trajectory(size=3, reward=0.5)) is None  # still one to come
    group = collector.add(trajectory(size=3, reward=0.0))
    assert group is not None and len(group.trajectories) == 2
    assert collector.take_batch(0) == [group]


def test_a_group_whose_members_are_all_refused_leaves_nothing_pending() -> None:
    collector = GroupCollector(BatchingConfig(groups_per_batch=1))
    assert collector.refuse(trajectory(size=2, reward=1.0)) is None
    assert collector.refuse(trajectory(size=2, reward=0.0)) is None
    assert collector.filling_groups == 0 and collector.pending_trajectory_ids() == set()
    # A late redelivery of a member does not reopen the group.
    assert collector.add(trajectory(size=2, reward=0.5)) is None
    assert collector.filling_groups == 0
