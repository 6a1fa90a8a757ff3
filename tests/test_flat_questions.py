"""The feeder's memory of flat questions: a flat group maps back to its question through its
epoch's order, and that question is passed over for `revisit_every` epochs, then asked again."""

import pytest

from asearcher.producers.rollout.flat_questions import FlatQuestions, epoch_order

pytestmark = pytest.mark.unit


def test_epoch_orders_are_permutations_fixed_by_seed_and_epoch() -> None:
    first, second = epoch_order(7, 0, 10), epoch_order(7, 1, 10)
    assert sorted(first) == list(range(10)) and first != second
    assert epoch_order(7, 0, 10) == first and epoch_order(8, 0, 10) != first


def test_a_flat_group_passes_its_question_over_until_revisit_every_epochs_later() -> None:
    flat = FlatQuestions("run", seed=3, questions=10, revisit_every=3)
    flat.note("run-e0-000004")
    question = epoch_order(3, 0, 10)[4]
    assert [flat.passes_over(question, epoch) for epoch in (1, 2, 3, 4)] == [
        True, True, False, False
    ]  # fmt: skip
    others = [q for q in range(10) if q != question]
    assert not any(flat.passes_over(q, 1) for q in others)
    # Flat again when asked in epoch 3: passed over in 4 and 5.
    flat.note(f"run-e3-{epoch_order(3, 3, 10).index(question):06d}")
    assert flat.passes_over(question, 5) and not flat.passes_over(question, 6)
    # A late report of an older flat group does not shorten the wait.
    flat.note("run-e0-000004")
    assert flat.passes_over(question, 5)


def test_other_runs_groups_and_positions_past_the_file_are_ignored() -> None:
    flat = FlatQuestions("run", seed=0, questions=4, revisit_every=2)
    for group_id in ("other-e0-000001", "run-e0-000009", "run-x", "run-e0-000001-extra"):
        flat.note(group_id)
    assert flat.count == 0


def test_revisit_every_one_never_passes_over() -> None:
    flat = FlatQuestions("run", seed=0, questions=4, revisit_every=1)
    flat.note("run-e0-000000")
    assert flat.count == 1
    assert not any(flat.passes_over(q, 1) for q in range(4))
    with pytest.raises(ValueError, match="revisit_flat_every"):
        FlatQuestions("run", seed=0, questions=4, revisit_every=0)
