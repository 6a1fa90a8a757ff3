"""The reasoning web agent (workflow "asearcher-reasoning") against a scripted OpenAI-compatible
endpoint, with the real toolbox over the synthetic world."""

from __future__ import annotations

import asyncio
import re

import pytest

from asearcher.consumers.scoring.chat_endpoint import ChatEndpointConfig
from asearcher.consumers.tools.toolbox import LocalReader, LocalSearch, Toolbox, ToolConfig
from asearcher.producers.agents import workflows
from asearcher.producers.agents.agent import AgentConfig
from asearcher.producers.agents.reasoning_agent import fallback_answer
from asearcher.producers.agents.reasoning_config import ReasoningConfig
from asearcher.producers.rollout.tool_router import InProcessToolClient
from asearcher.streams.wire.events import RolloutRequested
from tests.chat_server import chat_servers


class Steps:
    def emit(self, event) -> None:
        pass


@pytest.fixture(scope="module")
def tools(world_index) -> InProcessToolClient:
    _, index = world_index
    toolbox = Toolbox(LocalSearch(index, "bm25"), LocalReader(index), ToolConfig())
    return InProcessToolClient(toolbox)


def scripted_researcher(gold: str, log: list[str]):
    """A reasoning model: search, open the first result, answer early (not yet allowed), then
    answer when the answer action is offered. Reading calls keep one fact."""

    def reply(prompt: str) -> tuple[int, str]:
        log.append(prompt)
        if prompt.startswith("You are a research agent reading"):
            return 200, "<thought>This mentions the subject.</thought>"
        if "<answer> answer </answer>" in prompt:
            return 200, f"<thought>Checked twice.</thought>\n<answer>{gold}</answer>"
        urls = re.findall(r"URL: (https?://\S+)", prompt)
        if not urls:
            question = prompt.split("Question:\n", 1)[1].split("\n", 1)[0]
            return 200, f"<thought>Look it up.</thought>\n<search>{question}</search>"
        if "Page 1" not in prompt:
            return 200, f"<thought>Open it.</thought>\n<access>{urls[0]}</access>"
        return 200, f"<thought>I think I know.</thought>\n<answer>{gold}</answer>"

    return reply


def researcher_settings(url: str) -> ReasoningConfig:
    """The scripted researcher's endpoint; the answer phase from call 8, 400-character chunks."""
    return ReasoningConfig(
        model=ChatEndpointConfig(base_url=url, model="qwq-32b", backoff_s=0.0),
        answer_after_acts=7, max_acts=12, chunk_chars=400, max_chunks=2,
    )  # fmt: skip


def test_the_reasoning_agent_searches_reads_every_chunk_and_answers_in_the_answer_phase(
    world_index, tools
) -> None:
    world, _ = world_index
    question = next(q for q in world.questions if q.hops == 1)
    log: list[str] = []
    with chat_servers() as start:
        server = start(scripted_researcher(question.answers[0], log))
        reasoning = researcher_settings(server.url)
        workflow = workflows.build("asearcher-reasoning", AgentConfig(reasoning=reasoning))
        request = RolloutRequested(
            question_id=question.id, group_id="g", question=question.question,
            gold_answers=question.answers, purpose="eval", group_size=1,
        )  # fmt: skip
        finished = asyncio.run(workflow.run(None, tools, Steps(), request, 0))

    kinds = ["read" if p.startswith("You are a research agent reading") else "act" for p in log]
    # search, its results read, access, both chunks read, an early answer (refused), then the
    # answer phase from call 8 on (7 calls made): the answer is taken.
    assert kinds == ["act", "read", "act", "read", "read", "act", "act", "act"], kinds
    assert "<answer> answer </answer>" not in log[5] and "<answer> answer </answer>" in log[7]
    assert finished.answer == question.answers[0] and finished.finish_reason == "answer"
    assert finished.reward == 1.0 and finished.reward_parts["f1"] == 1.0
    assert finished.num_turns == 8 and finished.tool_calls == {"search": 1, "browse": 1}
    # A chunk is read in full once; later prompts show its first 100 characters only.
    chunk = re.search(r"Page 1\n(.*?)\n</information>", log[3], re.DOTALL).group(1)
    assert len(chunk) == 400 and chunk[:100] in log[5] and chunk not in log[5]
    assert finished.transcript and finished.token_ids == []


def test_the_history_window_and_the_call_limit(world_index, tools) -> None:
    world, _ = world_index
    question = next(q for q in world.questions if q.hops == 1)
    log: list[str] = []
    with chat_servers() as start:
        server = start(lambda prompt: (log.append(prompt), (200, "<thought>Hmm.</thought>"))[1])
        reasoning = ReasoningConfig(
            model=ChatEndpointConfig(base_url=server.url, model="m", backoff_s=0.0),
            history_chars=60, max_acts=5,
        )  # fmt: skip
        workflow = workflows.build("asearcher-reasoning", AgentConfig(reasoning=reasoning))
        request = RolloutRequested(question_id="q", group_id="g", question=question.question,
                                   gold_answers=question.answers, purpose="eval")  # fmt: skip
        finished = asyncio.run(workflow.run(None, tools, Steps(), request, 0))
    assert len(log) == 5 and finished.finish_reason == "max_turns" and finished.answer is None
    history = log[-1].split("What happened so far:\n", 1)[1].split("\n\nYour reply", 1)[0]
    assert len(history) == 60 and history.endswith("<think>Hmm.</think>")
    assert finished.reward == 0.0


@pytest.mark.parametrize(("outputs", "answer"), [
    (["<thought>x</thought>", "So the answer is <answer>Rome</answer> I think"], "Rome"),
    (["The answer: Rome", "nothing"], "The answer: Rome"),
    (["<think>a</think>Rome"], "Rome"),
    (["<thought>a</thought> Rome "], "Rome"),
    (["<thought>a</thought>"], None),
    ([], None),
])  # fmt: skip
def test_a_run_without_an_accepted_answer_falls_back_as_the_reference_does(outputs, answer):
    assert fallback_answer(outputs) == answer


def test_bad_reasoning_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="reasoning.chunk_chars must be at least 1"):
        ReasoningConfig(chunk_chars=0)


def test_an_evaluator_plays_the_reasoning_agent_against_an_endpoint_end_to_end(
    settings, codec, make_topic, world_index, tmp_path
) -> None:
    """`eval serve --engine endpoint` with workflow asearcher-reasoning: requests from Kafka,
    tool calls through a real tool worker, the model behind an HTTP endpoint, scored results."""
    import msgspec

    from asearcher.cli.eval import evaluator_config
    from asearcher.consumers.evaluation.benchmarks import BenchmarkQuestion, eval_requests
    from asearcher.producers.engines.registry import make_engine
    from asearcher.producers.rollout.service import RolloutService
    from asearcher.streams.io.producer import EventProducer
    from asearcher.streams.wire.events import SamplingSettings, TrajectoryFinished
    from tests.support.evaluation import eval_topics
    from tests.support.rollout import FAST_GROUP, ToolWorkerThread, events_of

    world, index = world_index
    question = next(q for q in world.questions if q.hops == 1)
    topics = eval_topics(make_topic)
    log: list[str] = []
    with chat_servers() as start:
        server = start(scripted_researcher(question.answers[0], log))
        reasoning = researcher_settings(server.url)
        base = evaluator_config(None, group_id="reasoning-eval", store=(tmp_path / "w").as_uri())
        config = msgspec.structs.replace(
            base, topics=topics, workflow="asearcher-reasoning",
            agent=AgentConfig(reasoning=reasoning),
        )  # fmt: skip
        requests = eval_requests(
            [BenchmarkQuestion(id=question.id, question=question.question,
                               answers=question.answers)],
            eval_id="reasoning-1", benchmark="world", k=2, policy_version=0,
            sampling=SamplingSettings(max_turns=64, max_new_tokens_per_turn=4096),
        )  # fmt: skip
        with EventProducer(settings, codec) as producer:
            producer.send(topics.requests, requests[0])
        engine = make_engine("endpoint", tmp_path / "no-model")
        with ToolWorkerThread(settings, codec, topics, index.directory,
                              (tmp_path / "results").as_uri()):  # fmt: skip
            service = RolloutService(settings, codec, engine, config, **FAST_GROUP)
            try:
                service.run(max_groups=1)
            finally:
                service.close()
    played = [e for e in events_of(settings, codec, topics.trajectories)
              if isinstance(e, TrajectoryFinished)]  # fmt: skip
    assert len(played) == 2 and {t.sample_index for t in played} == {0, 1}
    assert all(t.answer == question.answers[0] and t.reward_parts["f1"] == 1.0 for t in played)
    assert all(t.metadata["eval_id"] == "reasoning-1" and t.transcript for t in played)
    assert len(log) == 16  # 8 calls per sample, every one through the endpoint
