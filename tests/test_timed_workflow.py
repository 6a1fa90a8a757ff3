"""The timed stand-in workflow: trajectories of a heavy-tailed shape that the trainer accepts,
written with the engine's version, taking the time an engine and tools would."""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest

from asearcher.producers.agents.agent import AgentConfig
from asearcher.producers.agents.timed_workflow import (
    ENV_WORKLOAD,
    TimedWorkflow,
    TimedWorkload,
    workload_from_env,
)
from asearcher.producers.agents.workflows import build
from asearcher.producers.engines.base import ScriptedEngine
from asearcher.streams.wire.events import GenerationStep, RolloutRequested
from asearcher.trainer.runtime.validation import reason_to_refuse

QUICK = {"token_s": 0.0, "tool_median_s": 1e-5, "seed": 3}


class Steps(list):
    def emit(self, event: GenerationStep) -> None:
        self.append(event)


def play(workflow: TimedWorkflow, engine: ScriptedEngine, count: int, steps: Steps | None = None):
    request = RolloutRequested(question_id="q", group_id="run-e0-000001", question="?",
                               group_size=count)  # fmt: skip
    sink = Steps() if steps is None else steps

    async def all_of_them():
        return [await workflow.run(engine, None, sink, request, i) for i in range(count)]

    return asyncio.run(all_of_them())


def test_trajectories_are_trainable_and_carry_the_engines_version() -> None:
    engine = ScriptedEngine(lambda _: "")
    asyncio.run(engine.load_weights("file:///w/v7", 7, "0"))
    played = play(TimedWorkflow(AgentConfig(), TimedWorkload(**QUICK)), engine, 20)
    for t in played:
        assert reason_to_refuse(t, vocab_size=512) is None
        written = [v for v, m in zip(t.token_versions, t.loss_mask, strict=True) if m]
        assert written and set(written) == {7}
        assert t.token_versions[: t.prompt_length] == [-1] * t.prompt_length
    assert {t.reward for t in played} == {0.0, 1.0} and {t.purpose for t in played} == {"train"}
    assert [t.sample_index for t in played] == list(range(20))


def test_lengths_have_a_heavy_tail() -> None:
    workflow = TimedWorkflow(AgentConfig(), TimedWorkload(**QUICK))
    played = play(workflow, ScriptedEngine(lambda _: ""), 400)
    turns = sorted(t.num_turns for t in played)
    tokens = sorted(len(t.token_ids) for t in played)
    assert statistics.median(turns) == pytest.approx(3, abs=1)
    assert turns[int(0.97 * len(turns))] >= 3 * statistics.median(turns)  # the long tail
    assert tokens[-1] >= 8 * statistics.median(tokens)


def test_a_trajectory_takes_the_time_of_its_tokens_and_tool_calls() -> None:
    workload = TimedWorkload(turns_median=2, turns_sigma=0.01, tokens_median=50,
                             tokens_sigma=0.01, token_s=0.002, tool_median_s=0.05,
                             tool_sigma=0.01)  # fmt: skip
    started = time.monotonic()
    [t] = play(TimedWorkflow(AgentConfig(), workload), ScriptedEngine(lambda _: ""), 1)
    assert t.num_turns == 2
    assert time.monotonic() - started == pytest.approx(2 * 50 * 0.002 + 0.05, rel=0.5)


def test_the_workflow_is_chosen_by_name_and_its_workload_by_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(ENV_WORKLOAD, '{"turns_median": 5, "token_s": 0}')
    workflow = build("timed", AgentConfig())
    assert isinstance(workflow, TimedWorkflow) and workflow.workload.turns_median == 5
    monkeypatch.setenv(ENV_WORKLOAD, '{"turns_median": -1}')
    with pytest.raises(ValueError, match=ENV_WORKLOAD):
        workload_from_env()


def test_every_turn_is_a_step_event_and_the_steps_rebuild_the_written_tokens() -> None:
    steps = Steps()
    played = play(TimedWorkflow(AgentConfig(), TimedWorkload(**QUICK)), ScriptedEngine(str), 30,
                  steps)  # fmt: skip
    for t in played:
        mine = [s for s in steps if s.trajectory_id == t.trajectory_id]
        assert [s.turn for s in mine] == list(range(t.num_turns))
        written = [i for i, m in zip(t.token_ids, t.loss_mask, strict=True) if m]
        assert [i for s in mine for i in s.token_ids] == written
        assert mine[0].context_token_ids == t.token_ids[: t.prompt_length]
        assert all(s.group_id == t.group_id for s in mine)


def test_with_engine_writes_the_engine_writes_each_turn() -> None:
    # The script answers "ab" to every prompt: two tokens per turn, whatever was drawn.
    engine = ScriptedEngine(lambda _: "ab")
    workload = TimedWorkload(**QUICK, engine_writes=True)
    steps = Steps()
    played = play(TimedWorkflow(AgentConfig(), workload), engine, 10, steps)
    ab = engine.tokenizer.encode("ab")
    for t in played:
        written = [i for i, m in zip(t.token_ids, t.loss_mask, strict=True) if m]
        assert written == ab * t.num_turns
    assert all(s.token_ids == ab for s in steps)
