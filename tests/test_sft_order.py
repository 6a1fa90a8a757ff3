"""Behaviour cloning trains on its demonstrations in an order set by what they hold, so the
same demonstrations, however they arrive and whatever ids they got, clone the same way."""

from __future__ import annotations

import random

import msgspec

from asearcher.streams.wire.events import new_id
from asearcher.trainer.sft.sft_job import training_order
from tests.support.samples import trajectory


def test_the_same_demonstrations_in_any_arrival_order_train_in_one_order() -> None:
    rng = random.Random(7)
    # Two samples of one group, and groups of single demonstrations (as the expert plays them).
    played = [trajectory(rng, tokens=8, group_id=f"run-expert-q{i % 5}", question_id=f"q{i % 5}")
              for i in range(7)]  # fmt: skip
    # Played again: the same content under fresh ids, reaching the topic in another order.
    again = [msgspec.structs.replace(t, trajectory_id=new_id()) for t in played]
    random.Random(1).shuffle(again)
    assert [t.trajectory_id for t in again] != [t.trajectory_id for t in played]

    first, second = training_order(played), training_order(again)
    assert [t.token_ids for t in first] == [t.token_ids for t in second]
    assert [t.group_id for t in first] == sorted(t.group_id for t in played)
    # Nothing is lost or repeated.
    assert sorted(t.trajectory_id for t in first) == sorted(t.trajectory_id for t in played)
