"""What `asearcher learn` reports about the RL phase counts every group the trainer set aside."""

from __future__ import annotations

from asearcher.cli.jobs.learning import flat_share
from asearcher.streams.wire.events import TrainerStepFinished, TrajectoriesDropped


def test_flat_groups_count_whether_reported_with_a_step_or_committed_while_waiting() -> None:
    steps = [
        TrainerStepFinished(model="r", version=2, step=1, groups=2, dropped_flat_groups=3),
        TrainerStepFinished(model="r", version=3, step=2, groups=2, dropped_flat_groups=0),
    ]
    # After the last step no other came: the trainer committed what it dropped meanwhile.
    drops = [
        TrajectoriesDropped(model="r", version=3, dropped_ids=["a"] * 8, dropped_flat_groups=1),
        TrajectoriesDropped(model="r", version=3, dropped_ids=["b"] * 16, dropped_flat_groups=2),
    ]
    assert flat_share(steps, drops) == (4, 6)
    assert flat_share([], drops) == (0, 3)
