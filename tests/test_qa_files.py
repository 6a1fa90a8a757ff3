"""Question files in the reference's layouts: gold and augmented answers, ids, .json arrays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asearcher.consumers.formats.qa_files import QaFileError, QaQuestion, read_qa_file
from asearcher.consumers.scoring.reward import RewardConfig, blend_augmented, score_trajectory

REFERENCE_ITEMS = [
    # The reference's training layout: `answer` a list, `aug_answer`, an integer `qid`.
    {"question": "Nationality?", "answer": ["Australian"], "source": "opensource",
     "aug_answer": ["Aussie", "Australian national"], "qid": 1},
    {"question": "Capital?", "answer": "Paris", "idx": "p-7"},  # a string, `idx`
    {"question": "Year?", "gt": 1815.0, "id": 3},  # `gt`, a number written as a person would
    {"question": "Rivers?", "answers": ["Rhine", "Danube"]},  # no id: its position
    {"question": "Empty aug?", "answer": "x", "aug_answer": [], "query_id": "z"},
    # A synthetic world's question names its kind and hops, for the feeder's curriculum.
    {"question": "Born?", "answers": ["1850"], "id": "w", "kind": "person:born", "hops": 2,
     "supporting_urls": ["https://w/A", " https://w/B "]},  # stripped
    {"question": "Null pages?", "answer": "x", "id": "n", "supporting_urls": None},
]  # fmt: skip
EXPECTED = [
    QaQuestion(id="1", question="Nationality?", answers=["Australian"],
               aug_answers=["Aussie", "Australian national"]),
    QaQuestion(id="p-7", question="Capital?", answers=["Paris"]),
    QaQuestion(id="3", question="Year?", answers=["1815"]),
    QaQuestion(id="3-default", question="Rivers?", answers=["Rhine", "Danube"]),
    QaQuestion(id="z", question="Empty aug?", answers=["x"]),
    QaQuestion(id="w", question="Born?", answers=["1850"], kind="person:born", hops=2,
               supporting_urls=["https://w/A", "https://w/B"]),
    QaQuestion(id="n", question="Null pages?", answers=["x"]),
]  # fmt: skip


def test_reference_layouts_read_the_same_from_json_lines_and_a_json_array(tmp_path: Path) -> None:
    lines = tmp_path / "train.jsonl"
    lines.write_text("\n".join(json.dumps(item) for item in REFERENCE_ITEMS) + "\n\n")
    array = tmp_path / "train.json"
    array.write_text(json.dumps(REFERENCE_ITEMS, indent=2))

    def default(index: int) -> str:
        return f"{index}-default"

    assert read_qa_file(str(lines), default) == EXPECTED
    assert read_qa_file(str(array), default) == EXPECTED


def test_a_file_without_gold_answers_is_refused_naming_the_file_and_its_fields(
    tmp_path: Path,
) -> None:
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "Q", "golden": "A", "qid": 1}) + "\n")
    with pytest.raises(QaFileError) as caught:
        read_qa_file(str(qa))
    message = str(caught.value)
    assert message.startswith(f"{qa}:1: no gold answer: expected one of answer, answers, gt")
    assert message.endswith("its fields: golden, qid, question") and "\n" not in message


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ('{"question": "Q"}', "is not a JSON document|holds a JSON array"),
        ('[{"question": "Q", "answer": "A"}, {"question": "Q2"}]', ":item 2: no gold answer"),
        ('[{"question": "Q", "answer": "A", "aug_answer": [""]}]', "empty augmented answer"),
        ('[{"question": "Q", "answer": "A", "idx": 1}, {"question": "R", "answer": "B", "id": 1}]',
         "item 2: duplicate id '1' \\(first on item 1\\)"),
        ("[]", "holds no questions"),
        ('[{"question": "Q", "answer": "A", "kind": 3}]', "item 1: 'kind' must be a string"),
        ('[{"question": "Q", "answer": "A", "hops": -1}]', "item 1: 'hops' must be a whole"),
        ('[{"question": "Q", "answer": "A", "hops": "2"}]', "item 1: 'hops' must be a whole"),
        ('[{"question": "Q", "answer": "A", "supporting_urls": "u"}]',
         "item 1: 'supporting_urls' must be a list of URLs"),
        ('[{"question": "Q", "answer": "A", "supporting_urls": [" "]}]',
         "item 1: 'supporting_urls' must be a list of URLs"),
    ],
)  # fmt: skip
def test_a_bad_json_array_is_refused_with_one_line(tmp_path: Path, content: str, why: str) -> None:
    qa = tmp_path / "qa.json"
    qa.write_text(content)
    with pytest.raises(QaFileError) as caught:
        read_qa_file(str(qa))
    assert caught.match(why) and "\n" not in str(caught.value)


def test_augmented_answers_blend_into_the_training_reward_as_the_reference_does() -> None:
    config = RewardConfig()
    calls = ["<answer>Aussie</answer>"]
    plain = score_trajectory(calls, ["Australian"], config)
    blended = score_trajectory(calls, ["Australian"], config, aug_golds=["Aussie", "Australians"])
    assert plain.reward == 0.0 and "aug" not in plain.parts
    # 0.7 x 0 (the gold) + 0.3 x max(0, 1) (an augmented answer matches)
    assert blended.reward == pytest.approx(0.3)
    assert blended.parts["f1"] == 0.0 and blended.parts["aug"] == 1.0
    # A gold match is never lowered by the augmented answers.
    right = score_trajectory(["<answer>Australian</answer>"], ["Australian"], config,
                             aug_golds=["Aussie"])  # fmt: skip
    assert right.reward == 1.0
    assert blend_augmented(0.5, 0.2) == pytest.approx(0.5)
    assert blend_augmented(0.5, 1.0) == pytest.approx(0.65)
    # A format failure still zeroes the blended reward.
    broken = score_trajectory(["<answer>Aussie</answer><search>x"], ["Australian"], config,
                              aug_golds=["Aussie"])  # fmt: skip
    assert broken.reward == 0.0
