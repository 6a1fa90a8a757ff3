"""An epoch's plays: a question as often as its hops ask, the last count for longer ones."""

from collections import Counter

import pytest

from asearcher.cli.feed import feeding_line
from asearcher.consumers.formats.qa_files import QaQuestion
from asearcher.producers.rollout.feeder import FeederConfig
from asearcher.producers.rollout.plays import epoch_slots, plays_of


def question(qid: str, hops: int) -> QaQuestion:
    return QaQuestion(id=qid, question=f"{qid}?", answers=["a"], hops=hops)


QUESTIONS = [question("one", 1), question("two", 2), question("three", 3), question("?", 0)]


def test_each_question_is_played_as_often_as_its_hops_ask_and_unknown_hops_once() -> None:
    played = Counter(q.id for q in epoch_slots(QUESTIONS, [1, 2]))
    assert played == {"one": 1, "two": 2, "three": 2, "?": 1}  # 3 hops: the last entry
    played = Counter(q.id for q in epoch_slots(QUESTIONS, [2, 1, 4]))
    assert played == {"one": 2, "two": 1, "three": 4, "?": 1}


def test_without_plays_by_hops_every_question_is_played_once_in_file_order() -> None:
    assert epoch_slots(QUESTIONS, []) == QUESTIONS
    assert plays_of(5, []) == 1


@pytest.mark.parametrize("plays", [[0], [1, 0], [-2]])
def test_a_play_count_below_one_is_refused_naming_the_setting(plays: list[int]) -> None:
    with pytest.raises(ValueError, match="plays_by_hops must hold counts of at least 1"):
        FeederConfig(qa="qa.jsonl", plays_by_hops=plays)


def test_the_feeders_start_line_counts_plays_where_they_differ_from_questions() -> None:
    config = FeederConfig(qa="qa.jsonl", run="r", epochs=2, plays_by_hops=[1, 2])
    line = feeding_line(config, questions=5, plays=7, published=3)
    assert line.startswith("feeding run r from qa.jsonl: 5 questions (7 plays) an epoch x 2 epochs")
    assert line.endswith("3 already published")
    plain = feeding_line(
        FeederConfig(qa="qa.jsonl", run="r", epochs=0), questions=5, plays=5, published=0
    )
    assert "plays" not in plain and "5 questions an epoch x unlimited epochs" in plain
