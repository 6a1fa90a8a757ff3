"""Question kinds a guess answers: their priors, and worlds whose questions leave them out."""

from __future__ import annotations

from collections import Counter

import pytest

from asearcher.consumers.world.guessing import (
    answer_priors,
    chain_answers,
    question_kind,
    template_guess,
    world_template_guess,
)
from asearcher.consumers.world.world import (
    Chain,
    WorldQuestion,
    build_graph,
    generate_world,
    write_world,
)

WORLD = {"seed": 0, "entities": 60, "questions": 400, "max_hops": 2, "filler": False}


def test_a_world_s_one_country_makes_its_country_questions_a_sure_guess() -> None:
    graph = build_graph(seed=0, entities=60)
    priors = answer_priors(graph, max_hops=2)
    assert len(graph.by_kind["country"]) == 1
    assert priors[("city", (), "country")] == 1.0
    assert priors[("person", ("birthplace",), "country")] == 1.0
    # Every person has a birth year of their own: a guess is right about once.
    births = [a for kind, a in chain_answers(graph, 2) if kind == ("person", (), "birth_year")]
    commonest = Counter(births).most_common(1)[0][1]
    assert priors[("person", (), "birth_year")] == commonest / len(births) < 0.1


def test_chains_follow_no_entity_twice_and_stop_at_max_hops() -> None:
    graph = build_graph(seed=0, entities=60)
    kinds = {kind for kind, _ in chain_answers(graph, 2)}
    assert max(len(steps) for _, steps, _ in kinds) == 1
    assert ("person", ("spouse",), "spouse") not in kinds  # back to the start
    assert any(len(steps) == 2 for _, steps, _ in {k for k, _ in chain_answers(graph, 3)})


def test_question_kind_names_the_start_s_kind() -> None:
    graph = build_graph(seed=0, entities=60)
    person = graph.entities[graph.by_kind["person"][0]]
    assert question_kind(graph, Chain(person.name, ("birthplace",), "river")) == (
        "person", ("birthplace",), "river",
    )  # fmt: skip


def test_a_world_without_guessable_kinds_cannot_be_answered_by_its_templates() -> None:
    every = generate_world(**WORLD)
    fair = generate_world(**WORLD, max_answer_share=0.34)
    graph = build_graph(seed=0, entities=60)
    priors = answer_priors(graph, 2)
    asked = {q.question for q in every.questions}
    assert template_guess(every.questions).em > 0.25
    assert template_guess(fair.questions).em < 0.15
    assert len(fair.questions) == 400 and fair.pages == every.pages
    assert not any("country" in q.question or "university" in q.question for q in fair.questions)
    # The filter leaves out; it does not reword: every kept question is one the world asks.
    assert sum(q.question in asked for q in fair.questions) > 100
    assert max(priors.values()) == 1.0


def test_the_filter_is_off_by_default_and_a_seed_gives_the_same_questions() -> None:
    assert generate_world(**WORLD) == generate_world(**WORLD, max_answer_share=None)
    assert generate_world(**WORLD, max_answer_share=0.34) == generate_world(
        **WORLD, max_answer_share=0.34
    )


@pytest.mark.parametrize("share", [0.0, 1.5])
def test_run_config_refuses_a_share_outside_0_1(share: float) -> None:
    from asearcher.cli.run.config import DataConfig

    with pytest.raises(ValueError, match="world_max_answer_share"):
        DataConfig(world_max_answer_share=share)


def question(qid: str, text: str, answer: str, start: str, split: str) -> WorldQuestion:
    url = f"https://synthpedia.local/wiki/{start.replace(' ', '_')}"
    return WorldQuestion(qid, text, [answer], 1, [url], split)


def test_a_held_out_question_is_guessed_as_its_template_s_commonest_train_answer() -> None:
    attend = "Which university did {} attend?"
    questions = [
        question("1", attend.format("Ana Bel"), "North University", "Ana Bel", "train"),
        question("2", attend.format("Bo Cal"), "North University", "Bo Cal", "train"),
        question("3", attend.format("Cy Dor"), "South University", "Cy Dor", "train"),
        question("4", attend.format("Di Eng"), "North University", "Di Eng", "test"),
        question("5", attend.format("Ed Fo"), "South University", "Ed Fo", "test"),
        question("6", "In what year was Ed Fo born?", "1900", "Ed Fo", "test"),
    ]
    score = template_guess(questions)
    assert template_guess(questions, {"4", "6"}) == (0.5, 0.5, 2)
    assert score.questions == 3
    assert score.em == pytest.approx(1 / 3)
    # "North University" against "South University" shares one token of two: F1 0.5.
    assert score.f1 == pytest.approx((1 + 0.5 + 0) / 3)


def test_a_written_world_s_guess_is_read_back_and_other_qa_files_have_none(tmp_path) -> None:
    world = generate_world(**WORLD)
    write_world(world, tmp_path / "world")
    assert world_template_guess(tmp_path / "world") == template_guess(world.questions)
    (tmp_path / "qa").mkdir()
    (tmp_path / "qa" / "qa_train.jsonl").write_text('{"question": "q?", "answer": "a"}\n')
    (tmp_path / "qa" / "qa_test.jsonl").write_text('{"question": "q?", "answer": "a"}\n')
    assert world_template_guess(tmp_path / "qa") is None
    assert world_template_guess(tmp_path / "missing") is None
