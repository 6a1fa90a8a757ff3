"""The scripted expert follows ASearcher's turn structure and answers only through working tools."""

from __future__ import annotations

import asyncio

import pytest

from asearcher.consumers.tools.toolbox import LocalReader, LocalSearch, Toolbox, ToolConfig
from asearcher.producers.agents.agent import AgentConfig, run_trajectory
from asearcher.producers.agents.expert import ExpertScript, cue_span, title_of
from asearcher.producers.engines.base import ScriptedEngine
from asearcher.producers.rollout.tool_router import InProcessToolClient
from asearcher.streams.wire.events import RolloutRequested, SamplingSettings, ToolResultReady


class Steps:
    def __init__(self) -> None:
        self.events = []

    def emit(self, event) -> None:
        self.events.append(event)


def play(question, engine, tools, config=None, **sampling):
    request = RolloutRequested(
        question_id=question.id, group_id=f"g-{question.id}", question=question.question,
        gold_answers=question.answers, group_size=1,
        sampling=SamplingSettings(**{"max_turns": 64, **sampling}),
    )  # fmt: skip
    steps = Steps()
    finished = asyncio.run(
        run_trajectory(request, 0, engine, tools, steps, config or AgentConfig())
    )
    return finished, steps.events


@pytest.mark.parametrize("turns", ["think_then_act", "single_call"])
@pytest.mark.parametrize("hops", [1, 2, 3, 4])
def test_the_expert_answers_through_pages_read_in_many_chunks(world_index, hops, turns):
    world, index = world_index
    config = ToolConfig(chunk_chars=300)  # most pages take several chunks
    box = Toolbox(LocalSearch(index, "bm25"), LocalReader(index), config)
    question = next(q for q in world.questions if q.hops == hops)
    engine = ScriptedEngine(ExpertScript(world.questions))
    finished, steps = play(question, engine, InProcessToolClient(box), AgentConfig(turns=turns))
    assert finished.finish_reason == "answer" and finished.reward == 1.0, [s.text for s in steps]
    assert sum("<access>" in s.text for s in steps) == hops
    if turns == "single_call":
        assert finished.num_turns == hops + 2  # search, each access, answer
    else:  # one more think call per extra chunk than 1 + 2 per action
        assert finished.num_turns > 1 + 2 * (hops + 1)


class EmptyTools:
    async def call(self, request):
        return ToolResultReady(
            call_id=request.call_id, trajectory_id=request.trajectory_id, tool=request.tool
        )


def test_without_working_tools_the_expert_does_not_know(world_index):
    world, _ = world_index
    question = next(q for q in world.questions if q.hops == 2)
    finished, steps = play(question, ScriptedEngine(ExpertScript(world.questions)), EmptyTools())
    assert finished.answer == "unknown" and finished.reward == 0.0
    assert len(steps) == 3  # search, a think call on no results, the answer


def test_with_a_mistake_rate_some_answers_are_wrong(world_index):
    world, index = world_index
    box = Toolbox(LocalSearch(index, "bm25"), LocalReader(index), ToolConfig())
    question = next(q for q in world.questions if q.hops == 1)
    expert = ExpertScript(world.questions, mistake_rate=0.5, seed=3)
    rewards = [
        play(question, ScriptedEngine(expert), InProcessToolClient(box))[0].reward
        for _ in range(12)
    ]
    assert 0 < sum(rewards) < len(rewards)


# Quoting writes a whole sentence before each action: it fits 64 tokens a call on questions of
# the learning run's hops (at most 2), not on the longest names of 4-hop chains.
@pytest.mark.parametrize(
    ("quote", "cue", "hops"), [(False, False, 4), (True, False, 2), (False, True, 2)]
)
def test_with_the_policy_tokenizer_the_calls_fit_64_tokens(
    world_index, tmp_path, quote, cue, hops
) -> None:
    from asearcher.consumers.world.world import write_world
    from asearcher.producers.engines.registry import make_engine
    from asearcher.producers.policy.model_init import init_model

    world, index = world_index
    box = Toolbox(LocalSearch(index, "bm25"), LocalReader(index), ToolConfig())
    files = write_world(world, tmp_path / "world")
    # A policy whose tokenizer read this world, as a run's policy reads its own.
    model_dir = init_model(tmp_path / "policy", files["corpus"], hidden_size=64, layers=2, seed=1)
    engine = make_engine("expert", model_dir, qa_file=files["qa_train"], quote=quote, cue=cue)
    questions = [q for q in world.questions if q.hops == hops and q.split == "train"][:10]
    for question in questions:
        finished, steps = play(
            question, engine, InProcessToolClient(box), AgentConfig(turns="single_call"),
            max_new_tokens_per_turn=64, max_turns=16,
        )  # fmt: skip
        assert finished.reward == 1.0, [s.text for s in steps]
        assert all(s.finish_reason == "stop" for s in steps), [s.text for s in steps]


@pytest.mark.parametrize("rate", [0.0, 0.5, 1.0])
def test_a_shortcut_rate_stops_the_reading_that_often_and_the_rewards_follow(world_index, rate):
    world, index = world_index
    box = Toolbox(LocalSearch(index, "bm25"), LocalReader(index), ToolConfig())
    questions = [q for q in world.questions if q.hops == 2][:60]
    expert = ExpertScript(world.questions, shortcut_rate=rate, seed=5)
    reads, rewards = [], []
    for question in questions:
        finished, steps = play(question, ScriptedEngine(expert), InProcessToolClient(box),
                               AgentConfig(turns="single_call"))  # fmt: skip
        read = sum("<access>" in s.text for s in steps)
        reads.append(read)
        rewards.append(finished.reward)
        # Right exactly when it read every page the question needs; a shortcut answers the
        # name of the page it did not open.
        assert (finished.reward == 1.0) == (read == question.hops), [s.text for s in steps]
        if read < question.hops:
            assert finished.answer.strip() == title_of(question.supporting_urls[read])
    pages = sum(reads) / len(reads)
    if rate == 0.0:
        assert pages == 2.0 and sum(rewards) == len(questions)
    elif rate == 1.0:
        assert pages == 0.0 and sum(rewards) == 0
    else:  # each page is skipped half the time: 0.75 pages expected (standard error 0.11)
        assert 0.45 < pages < 1.05 and 0 < sum(rewards) < len(questions)
        assert sum(rewards) / len(rewards) == sum(r == 2 for r in reads) / len(reads)


def test_a_shortcut_is_a_draw_of_the_question_so_the_demonstrations_repeat(world_index):
    """The warm start keeps a clone under a digest of its demonstrations: a shortcut drawn in
    call order would make them differ whenever concurrent plays finish in another order."""
    world, index = world_index
    box = Toolbox(LocalSearch(index, "bm25"), LocalReader(index), ToolConfig())
    questions = [q for q in world.questions if q.hops == 2][:12]

    def texts(order, seed):
        expert = ExpertScript(world.questions, shortcut_rate=0.5, seed=seed)
        played = {}
        for question in order:
            _, steps = play(question, ScriptedEngine(expert), InProcessToolClient(box),
                            AgentConfig(turns="single_call"))  # fmt: skip
            played[question.question] = [s.text for s in steps]
        return played

    forward = texts(questions, seed=3)
    assert texts(list(reversed(questions)), seed=3) == forward
    # Another seed draws other stops: the draw is the seed's, not fixed by the question alone.
    assert texts(questions, seed=4) != forward


def _right_answer_notes(expert: ExpertScript, question, box: Toolbox) -> list[str]:
    """The notes of the expert's calls after its first, once it has answered `question` right."""
    finished, steps = play(question, ScriptedEngine(expert), InProcessToolClient(box),
                           AgentConfig(turns="single_call"))  # fmt: skip
    assert finished.reward == 1.0, [s.text for s in steps]
    return [s.text.partition("</think>")[0].strip() for s in steps[1:]]


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_quoting_the_expert_copies_the_sentence_it_acts_on_and_still_answers(world_index, hops):
    world, index = world_index
    box = Toolbox(LocalSearch(index, "bm25"), LocalReader(index), ToolConfig())
    expert = ExpertScript(world.questions, quote=True)
    for question in [q for q in world.questions if q.hops == hops][:10]:
        notes = _right_answer_notes(expert, question, box)
        # Each note after a page is a sentence of that page holding the next link or the answer.
        needles = [*(f"({url})" for url in question.supporting_urls[1:]), question.answers[0]]
        assert len(notes) == hops + 1 and all(
            needle in note for needle, note in zip(needles, notes[1:], strict=True)
        ), notes


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_cue_notes_lead_to_what_the_expert_acts_on_and_nothing_else(world_index, hops):
    world, index = world_index
    box = Toolbox(LocalSearch(index, "bm25"), LocalReader(index), ToolConfig())
    expert = ExpertScript(world.questions, cue=True)
    for question in [q for q in world.questions if q.hops == hops][:10]:
        notes = _right_answer_notes(expert, question, box)
        # After the search, the result's own URL line; after each page, the link to open next,
        # then the answer, each after the words that lead to it.
        assert notes[0].endswith(f"URL: {question.supporting_urls[0]}"), notes
        needles = [*(f"({url})" for url in question.supporting_urls[1:]), question.answers[0]]
        assert len(notes) == hops + 1 and all(
            needle in note and not note.startswith(needle)
            for needle, note in zip(needles, notes[1:], strict=True)
        ), notes


def test_a_cue_span_is_the_fewest_words_that_lead_to_the_target_alone() -> None:
    text = "Geite lies on the Vemsu River, the longest. Geite is home to [A](u1) and [B](u2)."
    assert cue_span(text, "Vemsu River") == "on the Vemsu River"
    assert cue_span(text, "[B](u2)") == "and [B](u2)"
    assert cue_span(text, "[A](u1)") == "to [A](u1)"
    assert cue_span(text, "Tholavia") is None
