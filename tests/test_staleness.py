"""AReaL's staleness rule per producer, and capacity given back for what is never trained."""

from __future__ import annotations

import uuid

from asearcher.producers.engine import ScriptedEngine
from asearcher.producers.service import RolloutConfig, RolloutService
from asearcher.producers.staleness import StalenessConfig, StalenessGate
from asearcher.streams.events import GenerationStep, WeightsPublished
from asearcher.streams.producer import EventProducer
from tests.rollout_support import FAST_GROUP, events_of, fresh_topics, send_requests


def test_capacity_grows_with_the_trainer_version_and_drops_are_given_back() -> None:
    gate = StalenessGate(StalenessConfig(eta=1, batch_trajectories=8, producers=2), base_version=3)
    assert gate.capacity(3) == 8  # (0 + 1 + 1) * 4
    assert gate.admits(4, 3) and not gate.admits(9, 3)
    gate.record_start(8)
    assert not gate.admits(1, 3) and gate.admits(4, 4)
    gate.track(["a", "b", "c"])
    assert gate.dropped_by_trainer(["b", "c", "someone-else's"]) == 2
    assert gate.started == 6 and gate.admits(2, 3)
    assert gate.dropped_by_trainer(["b"]) == 0  # given back once only
    gate.give_back(100)
    assert gate.started == 0
    assert StalenessGate(StalenessConfig(enabled=False), 0).admits(10**6, 0)


def test_a_producer_joins_at_the_newest_announced_version(
    settings, codec, make_topic, tmp_path
) -> None:
    import torch

    from asearcher.streams.weight_store import WeightStore

    topics = fresh_topics(make_topic)
    store = WeightStore((tmp_path / "weights").as_uri())
    with EventProducer(settings, codec) as producer:
        for version in (1, 2):
            out = store.publish_state_dict(version, version, version - 1, {"w": torch.zeros(1)})
            producer.send(topics.weights, WeightsPublished(
                version=version, uri=out.uri, sha256=out.sha256, step=version,
            ))  # fmt: skip
    questions = [type("Q", (), {"id": "q", "question": "Which?", "answers": ["x"]})()]
    send_requests(settings, codec, topics.requests, questions, group_size=2)
    engine = ScriptedEngine(lambda prompt: "<think>x</think><answer>x</answer>")
    config = RolloutConfig(
        topics=topics, group_id=f"join-{uuid.uuid4().hex[:6]}", store=store.root_url,
        staleness=StalenessConfig(eta=0, batch_trajectories=2),
    )  # fmt: skip
    service = RolloutService(settings, codec, engine, config, **FAST_GROUP)
    stats = service.run(max_groups=1, timeout=60)
    service.close()
    assert stats.groups == 1
    assert engine.loaded == [(out.uri, 2, out.sha256)]  # the newest, once
    assert service.gate.base_version == 2  # staleness counted from the join, not from v0
    steps = [e for e in events_of(settings, codec, topics.steps) if isinstance(e, GenerationStep)]
    assert steps and {s.policy_version for s in steps} == {2}
