"""The agent loop with a scripted engine and the real toolbox over the synthetic world."""

from __future__ import annotations

import asyncio

import pytest

from asearcher.consumers.reward import RewardConfig
from asearcher.consumers.toolbox import LocalReader, LocalSearch, Toolbox, ToolConfig
from asearcher.producers.agent import AgentConfig, check_request, run_trajectory
from asearcher.producers.engine import CharTokenizer, ScriptedEngine
from asearcher.producers.expert import ExpertScript
from asearcher.producers.tool_router import InProcessToolClient
from asearcher.producers.trajectory import NOT_GENERATED, rebuild_from_steps
from asearcher.streams.events import (
    GenerationStep,
    RolloutRequested,
    SamplingSettings,
    ToolCallRequested,
    ToolResultReady,
)


class Steps:
    def __init__(self) -> None:
        self.events: list[GenerationStep] = []

    def emit(self, event: GenerationStep) -> None:
        self.events.append(event)


class RecordingEngine(ScriptedEngine):
    """Also remembers the length of every context it was given."""

    def __init__(self, script, **kwargs) -> None:
        super().__init__(script, **kwargs)
        self.context_lengths: list[int] = []

    async def generate(self, prompt_ids, params):
        self.context_lengths.append(len(prompt_ids))
        return await super().generate(prompt_ids, params)


@pytest.fixture(scope="module")
def toolbox(world_index) -> Toolbox:
    _, index = world_index
    config = ToolConfig(chunk_chars=2_000)
    return Toolbox(LocalSearch(index, "bm25"), LocalReader(index), config)


def request_for(question, **sampling) -> RolloutRequested:
    return RolloutRequested(
        question_id=question.id,
        group_id=f"g-{question.id}",
        question=question.question,
        gold_answers=question.answers,
        sampling=SamplingSettings(**sampling),
        group_size=1,
    )


def play(request, engine, tools, config=None):
    steps = Steps()
    finished = asyncio.run(
        run_trajectory(request, 0, engine, tools, steps, config or AgentConfig())
    )
    return finished, steps.events


def test_three_hop_question_is_answered_through_search_browse_answer(world_index, toolbox):
    world, _ = world_index
    question = next(q for q in world.questions if q.hops == 3)
    engine = ScriptedEngine(ExpertScript(world.questions))
    finished, steps = play(request_for(question), engine, InProcessToolClient(toolbox))

    actions = [s.text.split("</think>\n")[1].split(">")[0] for s in steps]
    assert actions == ["<search", "<access", "<access", "<access", "<answer"]
    assert finished.finish_reason == "answer"
    assert finished.answer == question.answers[0]
    assert finished.reward == 1.0
    assert finished.reward_parts["format"] == 1.0 and finished.reward_parts["em"] == 1.0
    rebuilt = rebuild_from_steps(steps)
    assert rebuilt.token_ids == finished.token_ids
    assert rebuilt.loss_mask == finished.loss_mask
    assert rebuilt.token_versions == finished.token_versions
    assert rebuilt.logprobs == finished.logprobs
    generated = sum(len(s.token_ids) for s in steps)
    assert sum(finished.loss_mask) == generated
    assert finished.token_versions.count(0) == generated
    assert finished.token_versions.count(NOT_GENERATED) == len(finished.token_ids) - generated
    text = CharTokenizer().decode(finished.token_ids)
    assert text.count("<information>\n") == 4 and question.question in text


def test_malformed_action_is_a_format_failure(toolbox):
    engine = ScriptedEngine(lambda prompt: "The answer is probably Paris.")
    request = RolloutRequested(
        question_id="q", group_id="g", question="Where?", gold_answers=["Paris"]
    )
    finished, steps = play(request, engine, InProcessToolClient(toolbox))
    assert finished.finish_reason == "format_error"
    assert finished.format_error.startswith("no action")
    assert finished.reward == 0.0 and finished.reward_parts["format"] == 0.0
    assert len(steps) == 1


def test_unknown_tool_tag_is_a_format_failure_and_unknown_tool_an_observation(toolbox):
    engine = ScriptedEngine(lambda prompt: "<python>1+1</python>")
    request = RolloutRequested(question_id="q", group_id="g", question="2?", gold_answers=["2"])
    finished, _ = play(request, engine, InProcessToolClient(toolbox))
    assert finished.finish_reason == "format_error" and finished.reward == 0.0
    call = ToolCallRequested(call_id="c", trajectory_id="t", tool="python", arguments={})
    result = asyncio.run(InProcessToolClient(toolbox).call(call))
    assert "unknown tool 'python'" in result.error


class NeverAnswers:
    async def call(self, request: ToolCallRequested) -> ToolResultReady:
        return ToolResultReady(
            call_id=request.call_id, trajectory_id=request.trajectory_id, tool=request.tool,
            error=f"{request.tool} timed out: no result within {request.timeout_s:g} s",
        )  # fmt: skip


def test_tool_timeout_comes_back_as_an_observation_and_the_agent_goes_on():
    def script(prompt: str) -> str:
        return "<answer>Avalon</answer>" if "timed out" in prompt else "<search>x</search>"

    request = RolloutRequested(question_id="q", group_id="g", question="?", gold_answers=["Avalon"])
    finished, steps = play(request, ScriptedEngine(script), NeverAnswers())
    assert finished.finish_reason == "answer" and finished.reward == 1.0
    assert "Error: search timed out" in CharTokenizer().decode(steps[1].context_token_ids)


def test_overlong_page_is_cut_and_the_trajectory_finishes(world_index, toolbox):
    world, _ = world_index
    url = world.pages[0].url

    def script(prompt: str) -> str:
        return "<answer>done</answer>" if "<information>\n" in prompt else f"<access>{url}</access>"

    config = AgentConfig(observation_chars=300)
    request = RolloutRequested(question_id="q", group_id="g", question="?", gold_answers=["done"])
    finished, steps = play(request, ScriptedEngine(script), InProcessToolClient(toolbox), config)
    observation = CharTokenizer().decode(steps[1].context_token_ids)
    assert "more characters not shown]" in observation
    assert len(observation) < 300 + 120
    assert finished.finish_reason == "answer" and finished.reward == 1.0


def test_turn_limit_ends_the_trajectory_without_an_answer(toolbox):
    engine = ScriptedEngine(lambda prompt: "<search>anything</search>")
    request = RolloutRequested(
        question_id="q", group_id="g", question="?", gold_answers=["x"],
        sampling=SamplingSettings(max_turns=3),
    )  # fmt: skip
    finished, steps = play(request, engine, InProcessToolClient(toolbox))
    assert finished.finish_reason == "max_turns" and len(steps) == 3
    assert finished.reward == 0.0 and finished.format_error == "no answer"


def test_token_budget_ends_the_trajectory(toolbox):
    engine = ScriptedEngine(lambda prompt: "<search>" + "word " * 50 + "</search>")
    request = RolloutRequested(question_id="q", group_id="g", question="?", gold_answers=["x"])
    budget = 1_200
    finished, _ = play(
        request, engine, InProcessToolClient(toolbox), AgentConfig(token_budget=budget)
    )
    assert finished.finish_reason == "token_budget"
    assert len(finished.token_ids) <= budget


def test_history_is_cut_to_the_newest_segments(toolbox):
    engine = RecordingEngine(lambda prompt: "<search>city</search>")
    request = RolloutRequested(
        question_id="q", group_id="g", question="?", sampling=SamplingSettings(max_turns=6)
    )
    config = AgentConfig(history_chars=1_500)
    finished, steps = play(request, engine, InProcessToolClient(toolbox), config)
    assert finished.history_truncations > 0
    assert max(engine.context_lengths) < len(finished.token_ids)
    prompt_length = finished.prompt_length
    assert all(n - prompt_length <= 1_500 + 2_100 for n in engine.context_lengths)
    assert rebuild_from_steps(steps).token_ids == finished.token_ids


def test_invalid_requests_are_named():
    bad = RolloutRequested(
        question_id="q", group_id="g", question="?", sampling=SamplingSettings(max_turns=0)
    )
    with pytest.raises(ValueError, match="max_turns"):
        check_request(bad)
    many = RolloutRequested(
        question_id="q", group_id="g", question="?", sampling=SamplingSettings(max_turns=128)
    )
    check_request(many)


def test_reward_metric_is_configurable(world_index, toolbox):
    world, _ = world_index
    question = next(q for q in world.questions if q.hops == 1)
    config = AgentConfig(reward=RewardConfig(metric="cem"))
    engine = ScriptedEngine(ExpertScript(world.questions))
    finished, _ = play(request_for(question), engine, InProcessToolClient(toolbox), config)
    assert finished.reward == finished.reward_parts["cem"] == 1.0


def test_expert_with_the_policy_tokenizer_answers_with_tokens_inside_the_vocabulary(
    world_index, toolbox, tmp_path
) -> None:
    import json

    from asearcher.consumers.world import write_world
    from asearcher.producers.engines import make_engine
    from tests.trainer_support import tiny_model_dir

    world, _ = world_index
    files = write_world(world, tmp_path / "world")
    model_dir = tiny_model_dir(tmp_path / "policy")
    engine = make_engine("expert", model_dir, qa_file=files["qa_train"])
    question = next(q for q in world.questions if q.hops == 2 and q.split == "train")
    finished, steps = play(request_for(question), engine, InProcessToolClient(toolbox))
    assert finished.reward == 1.0, (finished.answer, [s.text for s in steps])
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    assert all(0 <= token < vocab for token in finished.token_ids)
