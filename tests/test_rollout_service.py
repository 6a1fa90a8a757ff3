"""The rollout producer over Kafka: real tool workers, exactly one group per request."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from asearcher.producers.agents.agent import MAX_GROUP_SIZE, AgentConfig
from asearcher.producers.agents.expert import ExpertScript
from asearcher.producers.engines.base import ScriptedEngine
from asearcher.producers.rollout.service import RolloutConfig, RolloutService
from asearcher.producers.rollout.staleness import StalenessConfig
from asearcher.producers.rollout.trajectory import rebuild_from_steps
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.io.replay import ReplayRange, read_range, redrive
from asearcher.streams.wire.events import (
    DeadLetter,
    GenerationStep,
    RolloutRequested,
    SamplingSettings,
    ToolCallRequested,
    ToolResultReady,
    TrajectoryFinished,
)
from tests.conftest import worker_command
from tests.support.rollout import (
    FAST_GROUP,
    ToolWorkerThread,
    events_of,
    fresh_topics,
    send_requests,
)


def service(settings, codec, engine, topics, **config) -> RolloutService:
    rollout = RolloutConfig(topics=topics, group_id=f"rollout-{uuid.uuid4().hex[:6]}", **config)
    return RolloutService(settings, codec, engine, rollout, **FAST_GROUP)


def test_three_hop_question_over_kafka_and_the_topics_rebuild_the_trajectory(
    settings, codec, make_topic, world_index, tmp_path: Path
) -> None:
    world, index = world_index
    question = next(q for q in world.questions if q.hops == 3)
    topics = fresh_topics(make_topic)
    [request] = send_requests(settings, codec, topics.requests, [question], group_size=2)
    engine = ScriptedEngine(ExpertScript(world.questions))
    rollout = service(settings, codec, engine, topics)
    with ToolWorkerThread(settings, codec, topics, index.directory, (tmp_path / "r").as_uri()):
        stats = rollout.run(max_groups=1, timeout=90)
    rollout.close()
    assert stats.groups == 1 and stats.trajectories == 2

    finished = [e for e in events_of(settings, codec, topics.trajectories)]
    assert len(finished) == 2 and all(isinstance(t, TrajectoryFinished) for t in finished)
    steps = [e for e in events_of(settings, codec, topics.steps) if isinstance(e, GenerationStep)]
    calls = events_of(settings, codec, topics.tool_calls)
    results = events_of(settings, codec, topics.tool_results)
    for trajectory in finished:
        assert trajectory.group_id == request.group_id
        assert trajectory.request_id == request.event_id
        assert trajectory.reward == 1.0 and trajectory.answer == question.answers[0]
        mine = [s for s in steps if s.trajectory_id == trajectory.trajectory_id]
        # The first call searches; each later action is a think call and an action call.
        assert [s.turn for s in mine] == list(range(9)) and trajectory.num_turns == 9
        rebuilt = rebuild_from_steps(mine)
        assert rebuilt.token_ids == trajectory.token_ids
        assert rebuilt.loss_mask == trajectory.loss_mask
        assert rebuilt.token_versions == trajectory.token_versions
        assert rebuilt.logprobs == trajectory.logprobs
        assert rebuilt.sequence_starts == trajectory.sequence_starts
        my_calls = [c for c in calls if c.trajectory_id == trajectory.trajectory_id]
        assert [c.tool for c in my_calls] == ["search", "browse", "browse", "browse"]
        assert [c.arguments.get("url") for c in my_calls[1:]] == question.supporting_urls
        answered = {r.call_id for r in results if isinstance(r, ToolResultReady)}
        assert {c.call_id for c in my_calls} <= answered


def test_a_tool_nobody_answers_times_out_into_an_observation(
    settings, codec, make_topic, world_index
) -> None:
    world, _ = world_index
    question = next(q for q in world.questions if q.hops == 1)
    topics = fresh_topics(make_topic)
    send_requests(settings, codec, topics.requests, [question], group_size=1)
    engine = ScriptedEngine(ExpertScript(world.questions))
    rollout = service(settings, codec, engine, topics, agent=AgentConfig(tool_timeout_s=0.5))
    stats = rollout.run(max_groups=1, timeout=60)  # no tool worker is running
    rollout.close()
    [trajectory] = events_of(settings, codec, topics.trajectories)
    assert stats.groups == 1 and rollout.tools.timeouts == 1
    assert trajectory.finish_reason == "answer" and trajectory.answer == "unknown"
    assert trajectory.reward == 0.0 and trajectory.reward_parts["format"] == 1.0
    [call] = events_of(settings, codec, topics.tool_calls)
    assert isinstance(call, ToolCallRequested) and call.timeout_s == 0.5


def test_bad_requests_go_to_the_dead_letter_topic(settings, codec, make_topic) -> None:
    topics = fresh_topics(make_topic)
    bad = RolloutRequested(
        question_id="q", group_id="bad", question="?", sampling=SamplingSettings(max_turns=0)
    )
    too_big = RolloutRequested(
        question_id="q", group_id="big", question="?", group_size=MAX_GROUP_SIZE + 1
    )
    good = RolloutRequested(question_id="q", group_id="good", question="?", group_size=1)
    with EventProducer(settings, codec) as producer:
        for request in (bad, too_big, good):
            producer.send(topics.requests, request, key="same-partition")
        producer.send_raw(topics.requests, b"\x00garbage", key="same-partition")
    engine = ScriptedEngine(lambda prompt: "<think>easy</think><answer>x</answer>")
    staleness = StalenessConfig(batch_groups=1, eta=1)
    rollout = service(settings, codec, engine, topics, staleness=staleness)
    stats = rollout.run(max_groups=1, timeout=60)
    time.sleep(1)
    rollout.run(timeout=2)  # the garbage record after the good one
    rollout.close()
    assert stats.groups == 1
    [finished] = events_of(settings, codec, topics.trajectories)
    assert finished.group_id == "good"
    letters = [
        e for e in events_of(settings, codec, "dead.letters")
        if isinstance(e, DeadLetter) and e.origin_topic == topics.requests
    ]  # fmt: skip
    reasons = sorted(letter.reason for letter in letters)
    assert len(letters) == 3, reasons
    assert any("max_turns" in r for r in reasons)
    assert any(f"group_size must be in 1..{MAX_GROUP_SIZE}" in r for r in reasons)


def test_a_request_sent_twice_or_re_driven_by_replay_is_played_once(
    settings, codec, make_topic
) -> None:
    topics = fresh_topics(make_topic)
    request = RolloutRequested(question_id="q", group_id="once", question="?", group_size=2)
    with EventProducer(settings, codec) as producer:
        producer.send(topics.requests, request)
        producer.send(topics.requests, request)  # a producer's retry: the same event again
    engine = ScriptedEngine(lambda prompt: "<think>easy</think><answer>x</answer>")
    group = f"rollout-{uuid.uuid4().hex[:6]}"
    config = RolloutConfig(topics=topics, group_id=group, instance="once")
    first = RolloutService(settings, codec, engine, config, **FAST_GROUP)
    assert first.run(max_groups=1, timeout=60).groups == 1
    first.run(timeout=3)  # time for the copy to be handed out, were it to be
    assert first.intake.played is not None and first.intake.played.duplicates == 1
    first.close()

    # Re-driven from the topic itself by `replay` (both copies), to a restarted producer.
    records = read_range(settings, codec, [topics.requests], ReplayRange())
    with EventProducer(settings, codec) as producer:
        assert redrive(records, producer, topics.requests) == 2
    second = RolloutService(settings, codec, engine, config, **FAST_GROUP)
    assert second.run(timeout=8).groups == 0
    assert second.intake.played is not None and second.intake.played.duplicates == 2
    second.close()
    finished = events_of(settings, codec, topics.trajectories)
    assert Counter(t.group_id for t in finished) == Counter({"once": 2})


def rollout_process(env, topics, group: str, instance: str, delay: float) -> subprocess.Popen:
    args = [topics.requests, topics.trajectories, topics.steps, group, instance, str(delay)]
    return subprocess.Popen(
        worker_command("rollout_producer.py", *args), env=env, stdout=subprocess.PIPE, text=True
    )


@pytest.mark.slow
def test_a_producer_killed_mid_group_still_yields_exactly_one_group_per_request(
    settings, codec, make_topic, worker_env
) -> None:
    topics = fresh_topics(make_topic)
    questions = [
        type("Q", (), {"id": f"q{i}", "question": f"question {i}?", "answers": ["yes"]})()
        for i in range(12)
    ]
    requests = send_requests(settings, codec, topics.requests, questions, group_size=3)
    group = f"rollout-{uuid.uuid4().hex[:6]}"
    victim = rollout_process(worker_env, topics, group, "victim", delay=0.4)
    survivor = rollout_process(worker_env, topics, group, "survivor", delay=0.4)
    try:
        for process in (victim, survivor):
            assert process.stdout.readline().strip() == "serving"
        wait_steps = time.monotonic() + 60
        while time.monotonic() < wait_steps:
            steps = events_of(settings, codec, topics.steps)
            finished = events_of(settings, codec, topics.trajectories)
            if len(finished) >= 6 and len(steps) > len(finished) + 2:
                break  # some groups committed, others mid-flight
            time.sleep(0.5)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        restarted = rollout_process(worker_env, topics, group, "victim", delay=0.4)
        assert restarted.stdout.readline().strip() == "serving"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            finished = events_of(settings, codec, topics.trajectories)
            if len({t.group_id for t in finished}) == len(requests):
                break
            time.sleep(1)
        time.sleep(3)  # anything extra would show up now
        finished = events_of(settings, codec, topics.trajectories)
    finally:
        for process in (victim, survivor, locals().get("restarted")):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(60)
    per_group = Counter(t.group_id for t in finished)
    assert per_group == Counter({r.group_id: 3 for r in requests})
    steps = events_of(settings, codec, topics.steps)
    trajectories = {t.trajectory_id for t in finished}
    orphans = {s.trajectory_id for s in steps} - trajectories
    assert orphans, "the kill should have cut some trajectories short"
