"""A step's advantages, by hand: AReaL's batch-token normalisation (one rank and two) and the
per-group std option, over trajectories with one or several training sequences."""

from __future__ import annotations

import math

import pytest

from asearcher.streams.wire.events import TrajectoryFinished, new_id
from asearcher.trainer.policy import step as step_module
from asearcher.trainer.policy.batching import Group
from asearcher.trainer.policy.objective import ObjectiveConfig, token_moments
from asearcher.trainer.policy.sequences import Row, training_rows
from asearcher.trainer.policy.step import flatten, normalised_over_tokens

EPS = 1e-5


def trajectory(reward: float, trained: list[int], group: str) -> TrajectoryFinished:
    """A trajectory with one training sequence per entry of `trained` (its loss tokens): each
    sequence is a masked token followed by that many trained ones."""
    ids, mask, starts = [], [], []
    for count in trained:
        if ids:
            starts.append(len(ids))
        ids += [1] * (count + 1)
        mask += [0] + [1] * count
    return TrajectoryFinished(
        trajectory_id=new_id(), group_id=group, question_id=group, token_ids=ids,
        logprobs=[0.0] * len(ids), loss_mask=mask, token_versions=[0] * len(ids),
        sequence_starts=starts, reward=reward, group_size=2,
    )  # fmt: skip


def batch() -> list[Group]:
    # g1: rewards [1, 0] over 2 and 4 loss tokens (the second in two sequences of 1 and 3);
    # g2: rewards [1, 0, 0.5] over 1, 3 and 2 loss tokens.
    return [
        Group(group_id="g1", trajectories=[trajectory(1.0, [2], "g1"),
                                           trajectory(0.0, [1, 3], "g1")]),
        Group(group_id="g2", trajectories=[trajectory(1.0, [1], "g2"),
                                           trajectory(0.0, [3], "g2"),
                                           trajectory(0.5, [2], "g2")]),
    ]  # fmt: skip


# Group-centred: g1 [0.5, -0.5], g2 [0.5, -0.5, 0]. Over the 12 loss tokens:
# Σ n·a = 0.5·2 - 0.5·4 + 0.5·1 - 0.5·3 + 0 = -2, mean -1/6;
# Σ n·a² = 0.25·(2 + 4 + 1 + 3) = 2.5, E[a²] = 5/24, biased variance 5/24 - 1/36 = 13/72.
MEAN, STD = -1 / 6, math.sqrt(13 / 72)
BY_TOKENS = [(a - MEAN) / (STD + EPS) for a in (0.5, -0.5, 0.5, -0.5, 0.0)]
BY_ROW = [BY_TOKENS[0], BY_TOKENS[1], BY_TOKENS[1], *BY_TOKENS[2:]]  # the 2-sequence trajectory


def normalised(rows: list[Row], mine: list[int]) -> list[float]:
    return [row.advantage for row in normalised_over_tokens(rows, mine)]


def rows_of(groups: list[Group], objective: ObjectiveConfig) -> list[Row]:
    return training_rows(*flatten(groups, objective))


def test_batch_tokens_advantages_by_hand() -> None:
    rows = rows_of(batch(), ObjectiveConfig())
    assert [row.advantage for row in rows] == pytest.approx([0.5, -0.5, -0.5, 0.5, -0.5, 0.0])
    assert [row.trained_tokens for row in rows] == [2, 1, 3, 1, 3, 2]
    assert normalised(rows, list(range(len(rows)))) == pytest.approx(BY_ROW, abs=1e-12)


def test_every_sequence_of_a_trajectory_gets_its_advantage() -> None:
    rows = normalised_over_tokens(rows_of(batch(), ObjectiveConfig()), list(range(6)))
    two = [row for row in rows if row.trajectory.sequence_starts]
    assert len(two) == 2 and two[0].advantage == two[1].advantage
    assert two[0].trajectory is two[1].trajectory


def test_two_ranks_normalise_with_the_whole_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = rows_of(batch(), ObjectiveConfig())
    shares = [[0, 2, 4], [1, 3, 5]]  # the rows each rank trains
    moments = [
        token_moments([rows[i].advantage for i in share], [rows[i].trained_tokens for i in share])
        for share in shares
    ]
    results = []
    for rank, share in enumerate(shares):
        other = moments[1 - rank]

        def all_reduce(values: list[float], other: list[float] = other) -> list[float]:
            return [a + b for a, b in zip(values, other, strict=True)]

        monkeypatch.setattr(step_module, "sum_across_ranks", all_reduce)
        results.append(normalised(rows, share))
    assert results[0] == pytest.approx(BY_ROW, abs=1e-12)
    assert results[1] == pytest.approx(BY_ROW, abs=1e-12)


def test_one_rank_alone_does_not_see_the_whole_batch() -> None:
    # The sums must cross ranks: one share on its own normalises with other statistics.
    rows = rows_of(batch(), ObjectiveConfig())
    assert normalised(rows, [0, 2, 4]) != pytest.approx(BY_ROW, abs=1e-3)


def test_group_std_advantages_by_hand() -> None:
    # g1: centred ±0.5, std 0.5 -> ±0.5/(0.5 + 1e-6); g2: [0.5, -0.5, 0], std √(1/6).
    objective = ObjectiveConfig(advantages="group_std")
    _, advantages = flatten(batch(), objective)
    g2 = math.sqrt(1 / 6) + 1e-6
    assert advantages == pytest.approx(
        [0.5 / 0.500001, -0.5 / 0.500001, 0.5 / g2, -0.5 / g2, 0.0], abs=1e-12
    )
    undivided = ObjectiveConfig(advantages="group_std", divide_by_std=False)
    assert flatten(batch(), undivided)[1] == pytest.approx([0.5, -0.5, 0.5, -0.5, 0.0])
