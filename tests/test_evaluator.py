"""The rollout service as an evaluator: pinned weight versions, addressing, requests set aside."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest
import torch
from confluent_kafka import Consumer, TopicPartition

from asearcher.cli.eval import evaluator_config
from asearcher.consumers.evaluation.benchmarks import BenchmarkQuestion, eval_requests
from asearcher.producers.agents.agent import AgentConfig
from asearcher.producers.engines.base import InferenceEngine, ScriptedEngine
from asearcher.producers.engines.hf_engine import TransformersEngine, tensor_checksum
from asearcher.producers.rollout.service import RolloutConfig, RolloutService, RolloutTopics
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.events import (
    DeadLetter,
    GenerationStep,
    RolloutRequested,
    SamplingSettings,
    TrajectoryFinished,
    WeightsPublished,
)
from asearcher.streams.wire.topics import EVAL_REQUESTS, TRAJECTORIES
from asearcher.trainer.runtime.weight_publisher import WeightStore
from tests.conftest import read_raw
from tests.support.evaluation import (
    eval_topics,
)
from tests.support.rollout import FAST_GROUP, events_of, fresh_topics
from tests.support.trainer import tiny_model_dir
from tests.support.waiting import wait_for

K = 2  # samples per question
ONE_PARTITION = "evaluator-test"  # one key for all requests of a test: read in the order sent
ANSWER = "<think>easy</think><answer>x</answer>"
QUICK = SamplingSettings(max_new_tokens_per_turn=24, max_turns=3, temperature=1.0, seed=11)


# ---------------------------------------------------------------- helpers


def evaluator(
    settings, codec, engine: InferenceEngine, topics: RolloutTopics, store_url: str, **config
) -> RolloutService:
    """An evaluator as `eval serve` configures one, on private topics and its own group."""
    base = evaluator_config(None, group_id=f"eval-{uuid.uuid4().hex[:6]}", store=store_url)
    rollout = msgspec.structs.replace(base, topics=topics, **config)
    return RolloutService(settings, codec, engine, rollout, **FAST_GROUP)


def questions(count: int, prefix: str = "q") -> list[BenchmarkQuestion]:
    return [
        BenchmarkQuestion(id=f"{prefix}{i}", question=f"Who founded city {i}?", answers=["x"])
        for i in range(count)
    ]


def pinned(
    qs: Sequence[BenchmarkQuestion], version: int, evaluator: str = "", k: int = K
) -> list[RolloutRequested]:
    """Evaluation requests for `qs` at `version`, from a fresh evaluation."""
    return eval_requests(
        qs, eval_id=f"ev-{uuid.uuid4().hex[:6]}", benchmark="world", k=k,
        policy_version=version, sampling=QUICK, evaluator=evaluator,
    )  # fmt: skip


def send(settings, codec, topic: str, requests: Sequence[RolloutRequested]) -> None:
    with EventProducer(settings, codec) as producer:
        for request in requests:
            producer.send(topic, request, key=ONE_PARTITION)


def letters_from(settings, codec, origin: str) -> list[DeadLetter]:
    """The shared dead letters whose record came from topic `origin`."""
    return [
        e for e in events_of(settings, codec, "dead.letters")
        if isinstance(e, DeadLetter) and e.origin_topic == origin
    ]  # fmt: skip


def trajectories_of(settings, codec, topic: str) -> list[TrajectoryFinished]:
    return [e for e in events_of(settings, codec, topic) if isinstance(e, TrajectoryFinished)]


def generated_versions(trajectory: TrajectoryFinished) -> list[int]:
    """The policy version of every token the policy wrote (loss mask 1)."""
    pairs = zip(trajectory.token_versions, trajectory.loss_mask, strict=True)
    return [version for version, mask in pairs if mask == 1]


def committed_on(settings, group: str, topic: str, partition: int) -> int:
    """The offset consumer group `group` has committed on `topic`'s `partition` (<0: none)."""
    consumer = Consumer(settings.client(**{"group.id": group, "enable.auto.commit": False}))
    try:
        [found] = consumer.committed([TopicPartition(topic, partition)], timeout=30)
    finally:
        consumer.close()
    return found.offset


def requests_in(codec, letters: Sequence[DeadLetter]) -> list[RolloutRequested]:
    """The requests dead letters hold."""
    events = [codec.decode(letter.payload, None, (RolloutRequested,)) for letter in letters]
    assert all(isinstance(e, RolloutRequested) for e in events)
    return events  # type: ignore[return-value]


def scripted() -> ScriptedEngine:
    return ScriptedEngine(lambda prompt: ANSWER)


@contextmanager
def serving(service: RolloutService, timeout: float) -> Iterator[RolloutService]:
    """`service` running in a thread; stopped, joined and closed on the way out."""
    thread = threading.Thread(target=service.run, kwargs={"timeout": timeout}, daemon=True)
    thread.start()
    try:
        yield service
    finally:
        service.stop()
        thread.join(120)
        service.close()
    assert not thread.is_alive(), "the evaluator did not stop"


# ---------------------------------------------------------------- pinned versions, real engine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("policy"))


@pytest.fixture
def engine(model_dir: Path) -> Iterator[TransformersEngine]:
    """The real CPU engine on the tiny policy (version 0), closed after the test."""
    engine = TransformersEngine.from_pretrained(model_dir)
    yield engine
    asyncio.run(engine.close())


def perturbed(engine: TransformersEngine, seed: int) -> dict[str, torch.Tensor]:
    """The engine's weights plus noise: a distinct version (lm_head is tied to embeddings)."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: tensor + 0.05 * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
        for name, tensor in engine.model.state_dict().items()
        if name != "lm_head.weight"
    }


def checksum_of(state: dict[str, torch.Tensor]) -> str:
    return tensor_checksum({**state, "lm_head.weight": state["model.embed_tokens.weight"]})


@pytest.mark.slow
def test_each_group_is_played_with_exactly_the_version_it_names_and_announcements_are_ignored(
    settings, codec, make_topic, engine: TransformersEngine, tmp_path: Path
) -> None:
    topics = eval_topics(make_topic)
    store = WeightStore((tmp_path / "weights").as_uri())
    states = {version: perturbed(engine, seed=version) for version in (1, 2, 3)}
    for version in (1, 2):
        store.publish_state_dict(version, version, version - 1, states[version])
    # v2 requests queue behind the v1 ones (one partition): the switch must wait for v1 to end.
    # Groups of different lengths, so slots free up while later v1 groups still play.
    first = [
        msgspec.structs.replace(r, sampling=msgspec.structs.replace(QUICK, max_turns=turns))
        for r, turns in zip(pinned(questions(4, "a"), version=1), (1, 1, 6, 1), strict=True)
    ]
    queued = pinned(questions(2, "b"), version=2)
    send(settings, codec, topics.requests, first + queued)
    # Two groups at a time, so v1 groups are still in flight when v3 is announced.
    service = evaluator(
        settings, codec, engine, topics, store.root_url, concurrency=4,
        agent=AgentConfig(tool_timeout_s=1.0),
    )  # fmt: skip
    with serving(service, timeout=150), EventProducer(settings, codec) as publisher:
        wait_for("the first v1 group to generate", lambda: service.stats.turns > 0, 90, every=0.1)
        v3 = store.publish_state_dict(3, 3, 2, states[3])
        publisher.send(
            topics.weights,
            WeightsPublished(version=3, uri=v3.uri, sha256=v3.sha256, step=3),
        )
        publisher.flush()
        played_when_announced = service.stats.groups
        later = pinned(questions(2, "c"), version=2)
        send(settings, codec, topics.requests, later)
        second = queued + later
        wait_for(
            "every group", lambda: service.stats.groups >= len(first) + len(second), 120, every=0.1
        )
        time.sleep(1)  # anything extra would be played now
        assert service.stats.groups == len(first) + len(second)
        assert engine.version == 2
        assert engine.state_dict_checksum() == checksum_of(states[2]) != checksum_of(states[1])
    # The test's premise: v3 was announced before the v1 groups were all played.
    assert played_when_announced < len(first)
    assert store.versions() == [1, 2, 3]  # v3 was loadable: only the evaluator ignored it

    requests = {r.group_id: r for r in first + second}
    finished = trajectories_of(settings, codec, topics.trajectories)
    by_group: dict[str, list[TrajectoryFinished]] = defaultdict(list)
    for trajectory in finished:
        by_group[trajectory.group_id].append(trajectory)
    assert set(by_group) == set(requests)
    steps = [e for e in events_of(settings, codec, topics.steps) if isinstance(e, GenerationStep)]
    step_versions: dict[str, set[int]] = defaultdict(set)
    for step in steps:
        step_versions[step.trajectory_id].add(step.policy_version)
    for group_id, members in by_group.items():
        request = requests[group_id]
        wanted = request.policy_version
        assert sorted(t.sample_index for t in members) == list(range(K))
        for trajectory in members:
            generated = generated_versions(trajectory)
            assert generated, "every trajectory has tokens the policy wrote"
            assert set(generated) == {wanted}, (group_id, set(generated))
            assert step_versions[trajectory.trajectory_id] == {wanted}
            assert trajectory.metadata == request.metadata
            assert trajectory.purpose == "eval" and trajectory.transcript
            assert trajectory.request_id == request.event_id
            assert trajectory.group_size == K
    # One version at a time: every v1 call ended before the first v2 call.
    v1_ends = max(s.created_at for s in steps if s.policy_version == 1)
    assert v1_ends <= min(s.created_at for s in steps if s.policy_version == 2)
    all_generated = {v for t in finished for v in generated_versions(t)}
    assert all_generated == {1, 2}  # v3 never played
    # Nothing reached training: the default trajectories topic has none of these groups.
    leaked = [t for t in trajectories_of(settings, codec, TRAJECTORIES) if t.group_id in requests]
    assert leaked == []


# ---------------------------------------------------------------- unloadable versions, addressing


def tiny_store(root: Path, *versions: int) -> WeightStore:
    """A store holding `versions` (a scripted engine loads nothing from them)."""
    store = WeightStore((root / "weights").as_uri())
    for version in versions:
        store.publish_state_dict(version, version, version - 1, {"w": torch.full((2,), version)})
    return store


def test_a_version_the_store_lacks_is_set_aside_and_the_next_request_is_played(
    settings, codec, make_topic, tmp_path: Path
) -> None:
    topics = eval_topics(make_topic)
    store = tiny_store(tmp_path, 1)
    [missing] = pinned(questions(1, "m"), version=7)
    [again] = pinned(questions(1, "r"), version=7)
    [playable] = pinned(questions(1, "p"), version=1)
    send(settings, codec, topics.requests, [missing, playable, again])
    engine = scripted()
    service = evaluator(settings, codec, engine, topics, store.root_url)
    try:
        stats = service.run(max_groups=1, timeout=60)
        service.run(timeout=2)  # the second request for v7, after the played one
    finally:
        service.close()
    assert stats.groups == 1
    finished = trajectories_of(settings, codec, topics.trajectories)
    assert {t.group_id for t in finished} == {playable.group_id} and len(finished) == K
    assert all(set(generated_versions(t)) == {1} for t in finished)
    v1 = store.get(1)
    assert engine.loaded == [(v1.uri, 1, v1.sha256)] and engine.version == 1
    letters = letters_from(settings, codec, topics.requests)
    assert len(letters) == 2, [letter.reason for letter in letters]
    assert [r.group_id for r in requests_in(codec, letters)] == [missing.group_id, again.group_id]
    for letter in letters:
        assert letter.reason.startswith("weight version 7 cannot be loaded: "), letter.reason
        assert letter.error_type == "Unplayable"
    group, partition = service.config.group_id, letters[0].origin_partition
    assert committed_on(settings, group, topics.requests, partition) == 3  # all three done


def test_version_zero_after_another_version_is_set_aside_with_why(
    settings, codec, make_topic, tmp_path: Path
) -> None:
    topics = eval_topics(make_topic)
    store = tiny_store(tmp_path, 1)
    [first] = pinned(questions(1, "f"), version=0)
    [later] = pinned(questions(1, "v"), version=1)
    [back] = pinned(questions(1, "b"), version=0)
    send(settings, codec, topics.requests, [first, later, back])
    service = evaluator(settings, codec, scripted(), topics, store.root_url)
    try:
        stats = service.run(max_groups=2, timeout=60)
        service.run(timeout=2)
    finally:
        service.close()
    assert stats.groups == 2
    played = {t.group_id for t in trajectories_of(settings, codec, topics.trajectories)}
    assert played == {first.group_id, later.group_id}
    [letter] = letters_from(settings, codec, topics.requests)
    assert "version 0 is the initial policy" in letter.reason and "left for v1" in letter.reason


def test_a_request_addressed_to_another_evaluator_group_is_skipped(
    settings, codec, make_topic, tmp_path: Path
) -> None:
    topics = eval_topics(make_topic)
    store = tiny_store(tmp_path)
    service = evaluator(settings, codec, scripted(), topics, store.root_url)
    group = service.config.group_id
    # Version 0 is what a fresh engine has: nothing is loaded, addressing alone decides.
    [other] = pinned(questions(1, "o"), version=0, evaluator="some-other-evaluators")
    [mine] = pinned(questions(1, "m"), version=0, evaluator=group)
    [anyone] = pinned(questions(1, "a"), version=0, evaluator="")
    send(settings, codec, topics.requests, [other, mine, anyone])
    try:
        stats = service.run(max_groups=2, timeout=60)
    finally:
        service.close()
    assert stats.groups == 2
    finished = trajectories_of(settings, codec, topics.trajectories)
    assert {t.group_id for t in finished} == {mine.group_id, anyone.group_id}
    assert len(finished) == 2 * K
    assert letters_from(settings, codec, topics.requests) == []  # skipped, not set aside
    steps = events_of(settings, codec, topics.steps)
    assert other.group_id not in {s.group_id for s in steps if isinstance(s, GenerationStep)}
    [partition] = {m.partition() for m in read_raw(settings, topics.requests)}  # one key
    assert committed_on(settings, group, topics.requests, partition) == 3


# ---------------------------------------------------------------- purposes


def train_request(question_id: str) -> RolloutRequested:
    return RolloutRequested(
        question_id=question_id, group_id=f"train-{uuid.uuid4().hex[:8]}",
        question="Who founded city 1?", gold_answers=["x"], group_size=1, sampling=QUICK,
    )  # fmt: skip


def test_a_training_producer_sets_evaluation_requests_aside(
    settings, codec, make_topic, tmp_path: Path
) -> None:
    topics = fresh_topics(make_topic)
    [evaluation] = pinned(questions(1, "e"), version=0)
    train = train_request("t")
    send(settings, codec, topics.requests, [evaluation, train])
    config = RolloutConfig(
        topics=topics, group_id=f"rollout-{uuid.uuid4().hex[:6]}",
        store=tiny_store(tmp_path).root_url,
    )  # fmt: skip
    service = RolloutService(settings, codec, scripted(), config, **FAST_GROUP)
    try:
        stats = service.run(max_groups=1, timeout=60)
    finally:
        service.close()
    assert stats.groups == 1
    finished = trajectories_of(settings, codec, topics.trajectories)
    assert [t.group_id for t in finished] == [train.group_id]
    [letter] = letters_from(settings, codec, topics.requests)
    assert f"an evaluation request: evaluators read {EVAL_REQUESTS}" in letter.reason
    assert [r.group_id for r in requests_in(codec, [letter])] == [evaluation.group_id]


def test_an_evaluator_sets_training_and_unpinned_requests_aside(
    settings, codec, make_topic, tmp_path: Path
) -> None:
    topics = eval_topics(make_topic)
    train = train_request("t")
    [unpinned] = pinned(questions(1, "u"), version=0)
    unpinned = msgspec.structs.replace(unpinned, policy_version=None)
    [evaluation] = pinned(questions(1, "e"), version=0)
    send(settings, codec, topics.requests, [train, unpinned, evaluation])
    service = evaluator(settings, codec, scripted(), topics, tiny_store(tmp_path).root_url)
    try:
        stats = service.run(max_groups=1, timeout=60)
    finally:
        service.close()
    assert stats.groups == 1
    finished = trajectories_of(settings, codec, topics.trajectories)
    assert {t.group_id for t in finished} == {evaluation.group_id} and len(finished) == K
    letters = letters_from(settings, codec, topics.requests)
    assert len(letters) == 2, [letter.reason for letter in letters]
    set_aside = zip(requests_in(codec, letters), letters, strict=True)
    by_group = {request.group_id: letter for request, letter in set_aside}
    assert set(by_group) == {train.group_id, unpinned.group_id}
    assert "an evaluator plays evaluation requests only" in by_group[train.group_id].reason
    assert "purpose 'train'" in by_group[train.group_id].reason
    assert "names its weight version, got None" in by_group[unpinned.group_id].reason
