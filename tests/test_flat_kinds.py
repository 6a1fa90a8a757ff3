"""The feeder's memory of flat kinds: once most finished groups of a kind of question were flat,
its questions are passed over, all but every `probe_every`-th; other kinds and questions
without a kind are not."""

import pytest

from asearcher.producers.rollout.flat_kinds import MIN_GROUPS, FlatKinds
from asearcher.producers.rollout.flat_questions import epoch_order

pytestmark = pytest.mark.unit

KINDS = ["person:born", "city:founded", "person:born", "", "city:founded", "person:born"] * 2


def group_of(question: int, epoch: int = 0) -> str:
    """The id of `question`'s group in `epoch` of run 'run', seed 5."""
    return f"run-e{epoch}-{epoch_order(5, epoch, len(KINDS)).index(question):06d}"


def kinds(share: float = 0.75, probe_every: int = 3) -> FlatKinds:
    return FlatKinds("run", seed=5, kinds=KINDS, share=share, probe_every=probe_every)


def questions_of(kind: str) -> list[int]:
    return [i for i, k in enumerate(KINDS) if k == kind]


def test_a_kind_whose_groups_were_mostly_flat_is_passed_over_but_probed_every_third() -> None:
    memory = kinds()
    born = questions_of("person:born")
    for question in born[:MIN_GROUPS]:
        memory.finished(group_of(question))
    for question in born[:3]:  # 3 of 4 flat: a share of 0.75
        memory.flat(group_of(question))
    assert memory.flat_share("person:born") == 0.75
    passes = [memory.passes_over(born[0]) for _ in range(6)]
    assert passes == [True, True, False, True, True, False]
    assert not memory.passes_over(questions_of("city:founded")[0])  # no groups yet
    assert "person:born (75% flat)" in memory.summary()


def test_a_kind_below_the_share_or_with_too_few_groups_is_fed() -> None:
    memory = kinds()
    born, founded = questions_of("person:born"), questions_of("city:founded")
    for question in born[:MIN_GROUPS]:
        memory.finished(group_of(question))
    for question in born[:2]:  # half flat
        memory.flat(group_of(question))
    for question in founded[: MIN_GROUPS - 1]:  # every one flat, but one group short
        memory.finished(group_of(question, epoch=1))
        memory.flat(group_of(question, epoch=1))
    assert memory.flat_share("city:founded") is None
    assert not any(memory.passes_over(q) for q in born + founded for _ in range(3))
    memory.finished(group_of(founded[MIN_GROUPS - 1], epoch=1))
    assert memory.passes_over(founded[0])  # 3 of 4 flat now


def test_questions_without_a_kind_and_a_share_of_zero_pass_nothing_over() -> None:
    memory = kinds(share=0.0)
    assert not memory.active and kinds().active
    untyped = questions_of("")
    everything = kinds(share=0.5)
    for memory_ in (memory, everything):
        for question in range(len(KINDS)):
            memory_.finished(group_of(question))
            memory_.flat(group_of(question))
    assert not any(memory.passes_over(q) for q in range(len(KINDS)))
    assert not any(everything.passes_over(q) for q in untyped)
    everything.flat("other-run-e0-000001")  # another run's group is ignored
    everything.finished("run-e0-999999")  # as is a position past the questions
    assert everything.flat_share("person:born") == 1.0
