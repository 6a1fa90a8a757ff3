"""The one prompt module: golden prompts, the per-question valid instruction, observations."""

from __future__ import annotations

from pathlib import Path

import pytest

from asearcher.producers.agents.prompt import (
    NO_PAGE,
    agent_prompt,
    eval_prompt,
    observation,
    page_information,
    question_of,
    training_prompt,
    valid_instruction_for,
)

GOLDEN = Path(__file__).parent / "golden"
QUESTION = "In which city was the founder of Shetetri Publishing born?"


@pytest.mark.parametrize(
    ("golden", "purpose", "valid", "tools"),
    [
        ("prompt_train_valid.txt", "train", True, "search_access"),
        ("prompt_train_invalid.txt", "train", False, "search_access"),
        ("prompt_train_search_only.txt", "train", False, "search_only"),
        ("prompt_eval.txt", "eval", False, "search_access"),
    ],
)
def test_the_rendered_prompt_equals_its_golden_file(golden, purpose, valid, tools) -> None:
    expected = (GOLDEN / golden).read_text(encoding="utf-8")
    question = f"  {QUESTION}\n"  # surrounding blanks are not part of the question
    rendered = agent_prompt(question, purpose=purpose, valid_instruction=valid, tools=tools)
    assert rendered == expected


def test_prompt_variants_differ_exactly_where_the_reference_does() -> None:
    valid = training_prompt(QUESTION, valid_instruction=True, tools="search_access")
    invalid = training_prompt(QUESTION, valid_instruction=False, tools="search_access")
    evaluation = eval_prompt(QUESTION)
    assert valid.endswith("Assistant: \n<think>\n") and invalid.endswith("Assistant: \n<think>\n")
    assert evaluation.endswith(f"User: {QUESTION}\n\nAssistant: \n<think>")
    assert "the question is invalid" in invalid and "most likely answer" not in invalid
    assert "most likely answer" in valid and "the question is invalid" not in valid
    assert "the question is a valid question" in evaluation
    assert "the question is invalid" not in evaluation and "language" not in evaluation
    only = training_prompt(QUESTION, valid_instruction=False, tools="search_only")
    assert "<access>" not in only and "<access> url </access>" in invalid


@pytest.mark.parametrize("purpose", ["train", "eval", "synthesis"])
def test_the_question_is_found_back_in_every_prompt(purpose) -> None:
    prompt = agent_prompt(QUESTION, purpose=purpose, valid_instruction=True)
    later = prompt + "I will search.</think>\n<search>User: x</search>" + observation("User: y")
    assert question_of(later) == QUESTION
    assert question_of("no prompt here") is None


def test_the_valid_instruction_is_drawn_per_question_at_the_configured_rate() -> None:
    groups = [f"group-{i}" for i in range(4000)]
    drawn = [valid_instruction_for(g, 0.3) for g in groups]
    assert drawn == [valid_instruction_for(g, 0.3) for g in groups]  # the same for every member
    assert 0.27 < sum(drawn) / len(drawn) < 0.33
    assert not any(valid_instruction_for(g, 0.0) for g in groups)
    assert all(valid_instruction_for(g, 1.0) for g in groups)


def test_observations_end_with_the_think_priming_and_chunks_have_a_short_form() -> None:
    assert observation("[1] X") == "\n\n<information>\n[1] X\n</information>\n<think>\n"
    chunk = "x" * 150 + "TAIL"
    full, short = page_information(3, chunk)
    assert full == f"\n\n<information>\n>>>> Page 3 >>>>\n\n{chunk}\n</information>"
    assert short == f"\n\n<information>\n>>>> Page 3 >>>>\n\n{'x' * 100}\n</information>"
    assert NO_PAGE == "No More Information is Found for this URL."


def test_the_training_eval_style_plays_the_training_prompt_asking_for_the_most_likely_answer() -> (
    None
):
    trained = agent_prompt(QUESTION, purpose="eval", valid_instruction=False, eval_style="training")
    assert trained == training_prompt(QUESTION, valid_instruction=True, tools="search_access")
    assert agent_prompt(QUESTION, purpose="eval") == eval_prompt(QUESTION)  # the default
    # Training requests are unaffected by the evaluation style.
    for valid in (True, False):
        assert agent_prompt(
            QUESTION, purpose="train", valid_instruction=valid, eval_style="training"
        ) == training_prompt(QUESTION, valid_instruction=valid, tools="search_access")


def test_an_unknown_eval_style_is_refused_naming_the_setting() -> None:
    from asearcher.producers.agents.agent import AgentConfig

    with pytest.raises(ValueError, match="eval_prompt must be one of reference, training"):
        AgentConfig(eval_prompt="chat")  # type: ignore[arg-type]
