"""Which snapshots of a cloning run the warm start scores (`warm_start.snapshots`)."""

from __future__ import annotations

from asearcher.cli.run.clone_selection import snapshot_steps


def test_snapshots_are_spaced_over_the_last_epoch_and_end_with_the_last_step() -> None:
    assert snapshot_steps(204, 68, 4) == [153, 170, 187, 204]
    assert snapshot_steps(204, 68, 1) == [204]
    assert snapshot_steps(5, 2, 4) == [2, 3, 4, 5]  # at most one a step
    assert snapshot_steps(3, 1, 5) == [1, 2, 3]  # never before the first step
