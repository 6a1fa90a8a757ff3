"""Agents plug into the rollout service as workflows: the registry, and a user's own workflow
run by the real service over Kafka, including trajectories it does not deliver."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from asearcher.producers.agents import workflows
from asearcher.producers.agents.agent import AgentConfig, AsearcherWorkflow
from asearcher.producers.engines.base import GenerateParams, ScriptedEngine
from asearcher.producers.rollout.service import (
    RolloutConfig,
    RolloutService,
    delivered_group,
    load_rollout_config,
)
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.events import (
    DeadLetter,
    GenerationStep,
    RolloutRequested,
    TrajectoryFinished,
)
from asearcher.trainer.policy.batching import BatchingConfig, GroupCollector
from tests.support.rollout import FAST_GROUP, events_of, fresh_topics


class TinyWorkflow:
    """One call per trajectory, no tools; member 0 of a group delivers nothing, and so does
    every member of a request whose metadata says `deliver = none`."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config

    async def run(self, engine, tools, steps, request, index):
        if index == 0 or request.metadata.get("deliver") == "none":
            return None
        prompt = engine.tokenizer.encode(request.question)
        generation = await engine.generate(prompt, GenerateParams(max_new_tokens=8))
        trajectory_id = f"{request.group_id}-{index}"
        steps.emit(
            GenerationStep(
                trajectory_id=trajectory_id, group_id=request.group_id, turn=0,
                token_ids=generation.token_ids, logprobs=generation.logprobs,
                policy_version=generation.version, context_token_ids=prompt,
            )
        )  # fmt: skip
        ids = prompt + generation.token_ids
        return TrajectoryFinished(
            trajectory_id=trajectory_id, group_id=request.group_id,
            question_id=request.question_id, token_ids=ids,
            logprobs=[0.0] * len(prompt) + generation.logprobs,
            loss_mask=[0] * len(prompt) + [1] * len(generation.token_ids),
            token_versions=[-1] * len(prompt) + [generation.version] * len(generation.token_ids),
            prompt_length=len(prompt), reward=float(index), num_turns=1, finish_reason="tiny",
            request_id=request.event_id, group_size=request.group_size,
        )  # fmt: skip


workflows.register("tiny-test", TinyWorkflow)


def test_the_registry_knows_asearcher_and_registered_and_importable_workflows(tmp_path: Path):
    assert "asearcher" in workflows.names() and "tiny-test" in workflows.names()
    assert isinstance(workflows.build("asearcher", AgentConfig()), AsearcherWorkflow)
    # Imported by name (pytest may have imported this file under another module name).
    assert workflows.get("tests.test_workflows:TinyWorkflow").__qualname__ == "TinyWorkflow"

    @workflows.register("decorated-test")
    class Decorated(TinyWorkflow):
        pass

    assert workflows.get("decorated-test") is Decorated
    config = tmp_path / "rollout.toml"
    config.write_text('workflow = "tests.test_workflows:TinyWorkflow"\n')
    assert load_rollout_config(config).workflow == "tests.test_workflows:TinyWorkflow"


def test_unknown_workflows_fail_with_one_line_naming_the_field():
    with pytest.raises(ValueError, match=r"^workflow must be one of .*asearcher.*, got 'nope'$"):
        RolloutConfig(workflow="nope")
    with pytest.raises(ValueError, match="workflow 'tests.test_workflows:Missing' cannot be"):
        RolloutConfig(workflow="tests.test_workflows:Missing")
    with pytest.raises(ValueError, match="has no run"):
        workflows.build("tests.test_workflows:not_a_workflow", AgentConfig())
    with pytest.raises(ValueError, match="without ':'"):
        workflows.register("a:b", TinyWorkflow)


def not_a_workflow(config: AgentConfig) -> object:
    return object()


def test_a_group_with_missing_members_says_how_many_it_delivered():
    def made(index: int) -> TrajectoryFinished:
        return TrajectoryFinished(
            trajectory_id=f"t{index}", group_id="g", question_id="q", token_ids=[],
            logprobs=[], loss_mask=[], token_versions=[], group_size=3,
        )  # fmt: skip

    whole = [made(0), made(1), made(2)]
    assert delivered_group(whole) == whole
    partial = delivered_group([None, made(1), made(2)])
    assert [t.trajectory_id for t in partial] == ["t1", "t2"]
    assert [t.group_size for t in partial] == [2, 2]
    assert delivered_group([None, None]) == []


def test_a_users_workflow_runs_in_the_rollout_service_over_kafka(settings, codec, make_topic):
    topics = fresh_topics(make_topic)
    partial = RolloutRequested(question_id="q1", group_id="partial", question="one?", group_size=3)
    empty = RolloutRequested(
        question_id="q2", group_id="empty", question="two?", group_size=2,
        metadata={"deliver": "none"},
    )  # fmt: skip
    with EventProducer(settings, codec) as producer:
        for request in (partial, empty):
            producer.send(topics.requests, request)
    engine = ScriptedEngine(lambda prompt: "fine")
    config = RolloutConfig(
        topics=topics, group_id=f"rollout-{uuid.uuid4().hex[:6]}",
        workflow="tests.test_workflows:TinyWorkflow",
    )  # fmt: skip
    rollout = RolloutService(settings, codec, engine, config, **FAST_GROUP)
    stats = rollout.run(max_groups=2, timeout=60)
    rollout.close()
    assert stats.groups == 2 and stats.trajectories == 2

    finished = events_of(settings, codec, topics.trajectories)
    assert sorted(t.trajectory_id for t in finished) == ["partial-1", "partial-2"]
    assert all(t.group_size == 2 for t in finished)
    collector = GroupCollector(BatchingConfig(groups_per_batch=1))
    completed = [collector.add(t) for t in finished]
    assert completed[0] is None and completed[1] is not None  # the trainer sees it complete
    steps = [e for e in events_of(settings, codec, topics.steps) if isinstance(e, GenerationStep)]
    assert sorted(s.trajectory_id for s in steps) == ["partial-1", "partial-2"]

    letters = [
        e for e in events_of(settings, codec, "dead.letters", skip_undecodable=True)
        if isinstance(e, DeadLetter) and e.origin_topic == topics.requests
    ]  # fmt: skip
    # Nothing delivered: the request is set aside, which frees the feeder's slot for it.
    assert len(letters) == 1 and letters[0].key == b"empty"
    assert "delivered no trajectory" in letters[0].reason
    assert rollout.gate.started == 1  # the empty group gave its staleness capacity back
