"""AReaL's staleness rule per producer, and capacity given back for what is never trained."""

from __future__ import annotations

import uuid

import pytest

from asearcher.producers.engines.base import ScriptedEngine
from asearcher.producers.rollout.service import RolloutConfig, RolloutService
from asearcher.producers.rollout.staleness import StalenessConfig, StalenessGate
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.events import GenerationStep, WeightsPublished
from tests.support.rollout import FAST_GROUP, events_of, fresh_topics, send_requests


def test_capacity_counts_groups_and_grows_with_the_trainer_version() -> None:
    gate = StalenessGate(StalenessConfig(eta=1, batch_groups=4, producers=2), base_version=3)
    assert gate.capacity(3) == 4  # (0 + 1 + 1) versions * a share of 2 groups
    for _ in range(4):
        assert gate.admits(3)
        gate.record_start()
    assert not gate.admits(3) and gate.admits(4)
    assert StalenessGate(StalenessConfig(enabled=False), 0).admits(0)


def test_a_group_is_given_back_once_all_its_members_are_dropped() -> None:
    gate = StalenessGate(StalenessConfig(eta=0, batch_groups=2), base_version=0)
    gate.record_start()
    gate.record_start()
    gate.track("g1", ["a", "b", "c"])
    gate.track("g2", ["d", "e"])
    assert gate.dropped_by_trainer(["a", "someone-else's"]) == 0  # g1 is still trained
    assert gate.started == 2
    assert gate.dropped_by_trainer(["b", "c", "d"]) == 1  # nothing of g1 is left
    assert gate.started == 1 and gate.admits(0)
    assert gate.dropped_by_trainer(["b", "c"]) == 0  # given back once only
    assert gate.dropped_by_trainer(["e"]) == 1
    gate.give_back()
    assert gate.started == 0  # never below zero


@pytest.mark.parametrize("group_size", [1, 2, 4, 8, 16])
def test_groups_of_any_size_never_deadlock_producer_and_trainer(group_size: int) -> None:
    """A trainer that takes whole groups and a gate counting trajectories deadlocked once groups
    were larger than expected: counted in groups, the loop goes on whatever their size."""
    groups_per_batch, eta = 2, 1
    gate = StalenessGate(StalenessConfig(eta=eta, batch_groups=groups_per_batch), 0)
    version, waiting_groups = 0, 0
    for _ in range(100):
        while gate.admits(version):
            gate.record_start()
            gate.track(f"g{gate.started}-{version}", [f"t{i}" for i in range(group_size)])
            waiting_groups += 1
        assert waiting_groups >= groups_per_batch, f"deadlock at v{version}"
        waiting_groups -= groups_per_batch
        version += 1
    assert version == 100


def test_a_producer_joins_at_the_newest_announced_version(
    settings, codec, make_topic, tmp_path
) -> None:
    import torch

    from asearcher.trainer.runtime.weight_publisher import WeightStore

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
        staleness=StalenessConfig(eta=0, batch_groups=1),
    )  # fmt: skip
    service = RolloutService(settings, codec, engine, config, **FAST_GROUP)
    stats = service.run(max_groups=1, timeout=60)
    service.close()
    assert stats.groups == 1
    assert engine.loaded == [(out.uri, 2, out.sha256)]  # the newest, once
    assert service.gate.base_version == 2  # staleness counted from the join, not from v0
    steps = [e for e in events_of(settings, codec, topics.steps) if isinstance(e, GenerationStep)]
    assert steps and {s.policy_version for s in steps} == {2}
