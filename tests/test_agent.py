"""The ASearcher agent with a scripted engine and the real toolbox over the synthetic world."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from asearcher.consumers.formats.prompt_templates import PromptTemplates
from asearcher.consumers.scoring.reward import RewardConfig
from asearcher.consumers.tools.toolbox import LocalReader, LocalSearch, Toolbox, ToolConfig
from asearcher.producers.agents.actions import STOP_STRINGS, THINK_STOP
from asearcher.producers.agents.agent import (
    AgentConfig,
    AsearcherWorkflow,
    check_request,
    run_trajectory,
)
from asearcher.producers.agents.expert import ExpertScript
from asearcher.producers.agents.prompt import (
    VALID_INSTRUCTION,
    eval_prompt,
    training_prompt,
    valid_instruction_for,
)
from asearcher.producers.engines.base import CharTokenizer, ScriptedEngine
from asearcher.producers.rollout.tool_router import InProcessToolClient
from asearcher.producers.rollout.trajectory import NOT_GENERATED, rebuild_from_steps
from asearcher.streams.wire.events import (
    SCORING_KEY,
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
    """Also remembers every context (as text) and the stop strings of every call."""

    def __init__(self, script, **kwargs) -> None:
        super().__init__(script, **kwargs)
        self.contexts: list[str] = []
        self.stops: list[tuple[str, ...]] = []

    async def generate(self, prompt_ids, params):
        self.contexts.append(self.tokenizer.decode(prompt_ids))
        self.stops.append(params.stop)
        return await super().generate(prompt_ids, params)


@pytest.fixture(scope="module")
def toolbox(world_index) -> Toolbox:
    _, index = world_index
    config = ToolConfig(chunk_chars=2_000)
    return Toolbox(LocalSearch(index, "bm25"), LocalReader(index), config)


def request_for(question, group_id: str | None = None, **sampling) -> RolloutRequested:
    return RolloutRequested(
        question_id=question.id,
        group_id=group_id or f"g-{question.id}",
        question=question.question,
        gold_answers=question.answers,
        sampling=SamplingSettings(**sampling),
        group_size=1,
    )


def simple_request(golds=("x",), group_id: str = "g", **sampling) -> RolloutRequested:
    return RolloutRequested(
        question_id="q", group_id=group_id, question="Where?", gold_answers=list(golds),
        sampling=SamplingSettings(**sampling),
    )  # fmt: skip


def play(request, engine, tools, config=None):
    steps = Steps()
    finished = asyncio.run(
        run_trajectory(request, 0, engine, tools, steps, config or AgentConfig())
    )
    return finished, steps.events


def action_of(text: str) -> str | None:
    for tag in ("search", "access", "answer"):
        if f"<{tag}>" in text:
            return tag
    return None


def assert_rebuilds(finished, steps) -> None:
    rebuilt = rebuild_from_steps(steps)
    assert rebuilt.token_ids == finished.token_ids
    assert rebuilt.loss_mask == finished.loss_mask
    assert rebuilt.token_versions == finished.token_versions
    assert rebuilt.logprobs == finished.logprobs
    assert rebuilt.sequence_starts == finished.sequence_starts


def test_three_hop_question_first_call_acts_then_each_action_costs_a_think_and_an_act_call(
    world_index, toolbox
):
    world, _ = world_index
    question = next(q for q in world.questions if q.hops == 3)
    engine = RecordingEngine(ExpertScript(world.questions))
    finished, steps = play(request_for(question), engine, InProcessToolClient(toolbox))

    # Pages of this world fit in one 2,000-character chunk or a few: one think call each.
    actions = [action_of(s.text) for s in steps]
    assert [a for a in actions if a] == ["search", "access", "access", "access", "answer"]
    assert actions[0] == "search" and "</think>" in steps[0].text  # think + act in one call
    for step, stop in zip(steps, engine.stops, strict=True):
        if stop == THINK_STOP:
            assert step.text.endswith("</think>") and action_of(step.text) is None
        else:
            assert stop == STOP_STRINGS and action_of(step.text) is not None
    think_calls = engine.stops.count(THINK_STOP)
    assert think_calls >= 4 and len(steps) == 5 + think_calls == finished.num_turns
    for context, stop in zip(engine.contexts, engine.stops, strict=True):
        primed = context.endswith("</information>\n<think>\n")
        assert primed == (stop == THINK_STOP)  # each observation is followed by the priming
    assert finished.finish_reason == "answer" and finished.answer == question.answers[0]
    assert finished.reward == 1.0
    assert finished.reward_parts["format"] == 1.0 and finished.reward_parts["em"] == 1.0
    assert_rebuilds(finished, steps)
    generated = sum(len(s.token_ids) for s in steps)
    assert sum(finished.loss_mask) == generated
    assert finished.token_versions.count(0) == generated
    assert finished.token_versions.count(NOT_GENERATED) == len(finished.token_ids) - generated
    assert question.question in CharTokenizer().decode(finished.token_ids)


def test_single_call_turns_act_in_every_call(world_index, toolbox):
    world, _ = world_index
    question = next(q for q in world.questions if q.hops == 2)
    engine = RecordingEngine(ExpertScript(world.questions))
    config = AgentConfig(turns="single_call", tool_timeout_s=5)
    finished, steps = play(request_for(question), engine, InProcessToolClient(toolbox), config)
    assert set(engine.stops) == {STOP_STRINGS}
    acted = [action_of(s.text) for s in steps]
    assert [a for a in acted if a] == ["search", "access", "access", "answer"]
    assert finished.reward == 1.0 and finished.num_turns == len(steps)


def test_a_call_without_an_action_goes_on_from_the_models_own_output(toolbox):
    def script(context: str) -> str:
        if "probably Paris" in context:
            return "<answer>Paris</answer>"
        return "I guess the answer is probably Paris, but let me think more about it"

    engine = RecordingEngine(script)
    request = simple_request(["Paris"], max_new_tokens_per_turn=40)
    finished, steps = play(request, engine, InProcessToolClient(toolbox))
    assert finished.finish_reason == "answer" and finished.answer == "Paris"
    assert len(steps) == 2 and steps[0].finish_reason == "length"
    assert engine.contexts[1].endswith(steps[0].text)  # continued, nothing appended
    assert engine.stops[1] == STOP_STRINGS

    strict = AgentConfig(stop_on_format_error=True)
    finished, steps = play(request, RecordingEngine(script), InProcessToolClient(toolbox), strict)
    assert finished.finish_reason == "format_error" and len(steps) == 1
    assert finished.format_error.startswith("no action") and finished.reward == 0.0


def test_output_ended_by_the_model_without_an_action_ends_the_trajectory(toolbox):
    engine = ScriptedEngine(lambda context: "<python>1+1</python>")
    finished, steps = play(simple_request(["2"]), engine, InProcessToolClient(toolbox))
    assert finished.finish_reason == "eos" and len(steps) == 1 and finished.reward == 0.0
    assert finished.format_error.startswith("no action")
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
    def script(context: str) -> str:
        if context.endswith("</think>"):
            return "\n<answer>Avalon</answer>"
        if "timed out" in context:
            return "The search failed; I know it anyway.</think>"
        return "Search.</think>\n<search>x</search>"

    finished, steps = play(simple_request(["Avalon"]), ScriptedEngine(script), NeverAnswers())
    assert finished.finish_reason == "answer" and finished.reward == 1.0
    assert len(steps) == 3
    assert "Error: search timed out" in CharTokenizer().decode(steps[1].context_token_ids)


def test_overlong_observation_is_cut_and_the_trajectory_finishes(world_index, toolbox):
    world, _ = world_index
    url = world.pages[0].url

    def script(context: str) -> str:
        if "<information>\n" in context.partition("\n\nAssistant:")[2]:
            return "<answer>done</answer>"
        return f"Open.</think>\n<access>{url}</access>"

    config = AgentConfig(observation_chars=300)
    finished, steps = play(
        simple_request(["done"]), ScriptedEngine(script), InProcessToolClient(toolbox), config
    )
    observation = CharTokenizer().decode(steps[1].context_token_ids)
    assert "more characters not shown]" in observation
    assert len(observation) < 300 + 120
    assert finished.finish_reason == "answer" and finished.reward == 1.0


def test_turn_limit_counts_every_call(toolbox):
    engine = RecordingEngine(lambda context: "<search>anything</search>")
    request = simple_request(max_turns=3)
    finished, steps = play(request, engine, InProcessToolClient(toolbox))
    assert finished.finish_reason == "max_turns" and len(steps) == 3
    assert engine.stops == [STOP_STRINGS, THINK_STOP, THINK_STOP]  # results keep coming
    assert finished.reward == 0.0


def test_token_budget_ends_the_trajectory(toolbox):
    engine = RecordingEngine(lambda context: "<search>" + "word " * 50 + "</search>")
    budget = 1_800
    finished, _ = play(
        simple_request(), engine, InProcessToolClient(toolbox), AgentConfig(token_budget=budget)
    )
    assert finished.finish_reason == "token_budget"
    assert len(engine.contexts) >= 2 and all(len(c) < budget for c in engine.contexts)


def test_history_is_cut_to_the_newest_segments(toolbox):
    engine = RecordingEngine(lambda context: "<search>city</search>")
    request = simple_request(max_turns=6)
    config = AgentConfig(history_chars=1_500)
    finished, steps = play(request, engine, InProcessToolClient(toolbox), config)
    assert finished.history_truncations > 0
    prompt_length = finished.prompt_length
    assert all(len(c) - prompt_length <= 1_500 + 2_100 for c in engine.contexts)
    assert_rebuilds(finished, steps)


def test_invalid_requests_are_named():
    with pytest.raises(ValueError, match="max_turns"):
        check_request(simple_request(max_turns=0))
    check_request(simple_request(max_turns=128))
    with pytest.raises(ValueError, match="turns must be one of"):
        AgentConfig(turns="three_calls")
    with pytest.raises(ValueError, match="valid_instruction_ratio"):
        AgentConfig(valid_instruction_ratio=float("nan"))


def test_reward_metric_is_configurable(world_index, toolbox):
    world, _ = world_index
    question = next(q for q in world.questions if q.hops == 1)
    config = AgentConfig(reward=RewardConfig(metric="cem"))
    engine = ScriptedEngine(ExpertScript(world.questions))
    finished, _ = play(request_for(question), engine, InProcessToolClient(toolbox), config)
    assert finished.reward == finished.reward_parts["cem"] == 1.0


def group_with(valid: bool, ratio: float) -> str:
    return next(
        g for g in (f"group-{i}" for i in range(1000)) if valid_instruction_for(g, ratio) == valid
    )


@pytest.mark.parametrize("valid", [True, False])
def test_the_valid_instruction_is_chosen_per_group_and_passed_to_the_reward(toolbox, valid):
    engine = RecordingEngine(
        lambda context: "Hm.</think>\n<answer>the question is invalid</answer>"
    )
    group = group_with(valid, 0.3)
    request = simple_request(["Paris"], group_id=group)
    config = AgentConfig(valid_instruction_ratio=0.3)
    finished, _ = play(request, engine, InProcessToolClient(toolbox), config)
    expected = training_prompt("Where?", valid_instruction=valid, tools="search_access")
    assert engine.contexts[0] == expected
    assert finished.reward_parts["valid_instruction"] == float(valid)
    # ASearcher's penalty: calling the question invalid costs only when told to find an answer.
    assert finished.reward == (-0.5 if valid else 0.0)
    again, _ = play(request, RecordingEngine(engine._script), InProcessToolClient(toolbox), config)
    assert again.reward_parts == finished.reward_parts  # every member of the group alike


def test_evaluation_requests_get_the_evaluation_prompt(toolbox):
    engine = RecordingEngine(lambda context: "Easy.</think>\n<answer>Paris</answer>")
    request = RolloutRequested(
        question_id="q", group_id="g", question="Where?", gold_answers=["Paris"], purpose="eval"
    )
    finished, _ = play(request, engine, InProcessToolClient(toolbox))
    assert engine.contexts[0] == eval_prompt("Where?")
    assert finished.reward == 1.0 and finished.reward_parts["valid_instruction"] == 1.0
    # In the "training" style the evaluation plays the training prompt, valid instruction on.
    engine = RecordingEngine(lambda context: "Easy.</think>\n<answer>Paris</answer>")
    finished, _ = play(
        request, engine, InProcessToolClient(toolbox), AgentConfig(eval_prompt="training")
    )
    expected = training_prompt("Where?", valid_instruction=True, tools="search_access")
    assert engine.contexts[0] == expected and finished.reward == 1.0


def test_expert_with_the_policy_tokenizer_answers_with_tokens_inside_the_vocabulary(
    world_index, toolbox, tmp_path
) -> None:
    import json

    from asearcher.consumers.world.world import write_world
    from asearcher.producers.engines.registry import make_engine
    from tests.support.trainer import tiny_model_dir

    world, _ = world_index
    files = write_world(world, tmp_path / "world")
    model_dir = tiny_model_dir(tmp_path / "policy")
    engine = make_engine("expert", model_dir, qa_file=files["qa_train"])
    question = next(q for q in world.questions if q.hops == 2 and q.split == "train")
    finished, steps = play(request_for(question), engine, InProcessToolClient(toolbox))
    assert finished.reward == 1.0, (finished.answer, [s.text for s in steps])
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    assert all(0 <= token < vocab for token in finished.token_ids)


def test_the_agent_plays_prompts_and_think_priming_from_template_files(toolbox, tmp_path):
    training = tmp_path / "train.txt"
    training.write_text("<|user|>{instruction} Q: {question} {{braces}}<|assistant|><think>")
    evaluation = tmp_path / "eval.txt"
    evaluation.write_text("Evaluate: {question}\n<think>")
    priming = tmp_path / "priming.txt"
    priming.write_text("\n\n<think>")  # the project's is "\n<think>\n"
    templates = PromptTemplates(
        training=str(training), evaluation=str(evaluation), think_priming=str(priming)
    )
    config = AgentConfig(templates=templates, valid_instruction_ratio=1.0)
    calls = iter(["</think><search>x</search>", "ok</think>", "<answer>Paris</answer>"])
    engine = RecordingEngine(lambda context: next(calls))
    finished, _ = play(simple_request(["Paris"]), engine, InProcessToolClient(toolbox), config)

    prompt = f"<|user|>{VALID_INSTRUCTION} Q: Where? {{braces}}<|assistant|><think>"
    assert engine.contexts[0] == prompt
    # The observation is followed by the user's priming, not the project's.
    assert engine.contexts[1].endswith("</information>\n\n<think>")
    assert finished.reward == 1.0, (finished.answer, finished.format_error, engine.contexts)
    engine = RecordingEngine(lambda context: "<answer>Paris</answer>")
    request = msgspec.structs.replace(simple_request(["Paris"]), purpose="eval")
    play(request, engine, InProcessToolClient(toolbox), config)
    assert engine.contexts[0] == "Evaluate: Where?\n<think>"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("no placeholder", "never places {question}"),
        ("{question} {answer}", "uses {answer}; it may use {question}, {instruction}"),
        ("{question} {", "not a template"),
    ],
)
def test_a_bad_template_is_a_one_line_error_naming_the_setting(tmp_path, text, why) -> None:
    path = tmp_path / "t.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match="templates.training") as caught:
        PromptTemplates(training=str(path))
    assert why in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="templates.evaluation: cannot read"):
        PromptTemplates(evaluation=str(tmp_path / "absent.txt"))


def test_the_brief_prompt_is_the_question_alone_and_the_expert_still_answers(
    world_index, toolbox
) -> None:
    world, _ = world_index
    question = next(q for q in world.questions if q.hops == 2)
    engine = RecordingEngine(ExpertScript(world.questions))
    config = AgentConfig(turns="single_call", brief_prompt=True, tool_timeout_s=5)
    finished, _ = play(request_for(question), engine, InProcessToolClient(toolbox), config)
    assert engine.contexts[0] == f"User: {question.question}\n\nAssistant: \n<think>\n"
    assert finished.reward == 1.0
    full = training_prompt(question.question, valid_instruction=True, tools="search_access")
    assert len(engine.contexts[0]) * 5 < len(full)


def test_short_observations_show_only_the_newest_observation_in_full(world_index, toolbox) -> None:
    world, _ = world_index
    question = next(q for q in world.questions if q.hops == 2)
    engine = RecordingEngine(ExpertScript(world.questions))
    config = AgentConfig(turns="single_call", short_observations=True, tool_timeout_s=5)
    finished, steps = play(request_for(question), engine, InProcessToolClient(toolbox), config)
    assert finished.reward == 1.0
    results = engine.contexts[1].rsplit("<information>\n", 1)[1]  # the search results, full
    assert len(results) > 300
    later = engine.contexts[-1]  # the answer call: the results and the first page cut
    blocks = [b.split("\n</information>")[0] for b in later.split("<information>\n")[1:]]
    assert [len(b) <= 100 + len(">>>> Page 1 >>>>\n\n") for b in blocks] == [True, True, False]
    assert blocks[0] == results.split("\n</information>")[0][:100]
    full = RecordingEngine(ExpertScript(world.questions))
    play(request_for(question), full, InProcessToolClient(toolbox), msgspec.structs.replace(
        config, short_observations=False))  # fmt: skip
    assert len(later) < len(full.contexts[-1]) - 1000
    assert_rebuilds(finished, steps)


def test_the_page_reward_follows_the_supporting_pages_the_agent_opened(world_index, toolbox):
    world, _ = world_index
    question = next(q for q in world.questions if q.hops == 2)
    request = msgspec.structs.replace(
        request_for(question), supporting_urls=list(question.supporting_urls)
    )
    config = AgentConfig(reward=RewardConfig(page_reward=0.2), tool_timeout_s=5)
    expert = ExpertScript(world.questions)
    full, _ = play(request, ScriptedEngine(expert), InProcessToolClient(toolbox), config)
    assert full.reward == pytest.approx(1.2) and full.reward_parts["pages_read"] == 1.0

    def stops_after_the_first_page(context: str) -> str:
        text = expert(context)
        return text.replace(f"<access> {question.supporting_urls[1]} </access>",
                            "<answer>nobody</answer>")  # fmt: skip

    engine = ScriptedEngine(stops_after_the_first_page)
    half, steps = play(request, engine, InProcessToolClient(toolbox), config)
    assert [a for a in (action_of(s.text) for s in steps) if a] == ["search", "access", "answer"]
    assert half.reward == pytest.approx(0.1) and half.reward_parts["pages_read"] == 0.5
    # Evaluation pays for the answer alone, under the training scoring rules too.
    for metadata in ({}, {SCORING_KEY: "training"}):
        scored, _ = play(msgspec.structs.replace(request, purpose="eval", metadata=metadata),
                         ScriptedEngine(expert), InProcessToolClient(toolbox), config)  # fmt: skip
        assert scored.reward == 1.0 and "page_bonus" not in scored.reward_parts


def test_a_page_reward_over_questions_that_name_no_pages_is_said_once(toolbox, caplog) -> None:
    workflow = AsearcherWorkflow(AgentConfig(reward=RewardConfig(page_reward=0.2)))
    engine = ScriptedEngine(lambda context: "Easy.</think>\n<answer>Paris</answer>")
    for group in ("g1", "g2"):
        request = simple_request(["Paris"], group_id=group)
        played = workflow.run(engine, InProcessToolClient(toolbox), Steps(), request, 0)
        finished = asyncio.run(played)
        assert finished.reward == 1.0 and "pages_read" not in finished.reward_parts
    assert caplog.text.count("page_reward 0.2 is set but question q names no supporting") == 1
