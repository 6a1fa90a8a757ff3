"""Live weight updates and the staleness bound, with the real CPU model and the real store."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from asearcher.consumers.world.world import generate_world, write_world
from asearcher.producers.engines.hf_engine import TransformersEngine, tensor_checksum
from asearcher.producers.policy.model_init import init_model
from asearcher.producers.rollout.service import RolloutConfig, RolloutService
from asearcher.producers.rollout.staleness import StalenessConfig
from asearcher.producers.rollout.trajectory import NOT_GENERATED
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.events import GenerationStep, WeightsPublished
from asearcher.trainer.runtime.weight_publisher import WeightStore
from tests.support.rollout import FAST_GROUP, events_of, fresh_topics, send_requests
from tests.support.waiting import wait_for

GROUP_SIZE = 4
ETA = 1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    world = generate_world(seed=2, entities=60, questions=20)
    corpus = write_world(world, tmp_path_factory.mktemp("world"))["corpus"]
    return init_model(tmp_path_factory.mktemp("model"), corpus, hidden_size=64, layers=2)


def perturbed(engine: TransformersEngine, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        name: tensor + 0.05 * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
        for name, tensor in engine.model.state_dict().items()
        if name != "lm_head.weight"  # tied to the embeddings
    }


def versions_by_trajectory(steps: list[GenerationStep]) -> dict[str, set[int]]:
    versions: dict[str, set[int]] = defaultdict(set)
    for step in steps:
        versions[step.trajectory_id].add(step.policy_version)
    return versions


@pytest.mark.slow
def test_weights_published_mid_flight_are_loaded_and_staleness_is_bounded(
    settings, codec, make_topic, model_dir: Path, tmp_path: Path
) -> None:
    topics = fresh_topics(make_topic)
    questions = [
        type("Q", (), {"id": f"q{i}", "question": f"Who founded city {i}?", "answers": ["x"]})()
        for i in range(4)
    ]
    send_requests(
        settings, codec, topics.requests, questions, GROUP_SIZE,
        max_new_tokens_per_turn=96, temperature=1.0, seed=7,
    )  # fmt: skip
    engine = TransformersEngine.from_pretrained(model_dir)
    # One step's worth (a group) per version, bound 1: two groups may start at v0.
    store = WeightStore((tmp_path / "weights").as_uri())
    config = RolloutConfig(
        topics=topics, group_id=f"rollout-{uuid.uuid4().hex[:6]}", concurrency=4,
        store=store.root_url,
        staleness=StalenessConfig(eta=ETA, batch_groups=1),
    )  # fmt: skip
    service = RolloutService(settings, codec, engine, config, **FAST_GROUP)
    thread = threading.Thread(target=service.run, kwargs={"timeout": 240}, daemon=True)
    thread.start()
    publisher = EventProducer(settings, codec)

    def publish(version: int) -> str:
        state = perturbed(engine, seed=version)
        out = store.publish_state_dict(version, version, version - 1, state)
        publisher.send(
            topics.weights,
            WeightsPublished(version=version, uri=out.uri, sha256=out.sha256, step=version),
        )
        publisher.flush()
        return tensor_checksum({**state, "lm_head.weight": state["model.embed_tokens.weight"]})

    try:
        wait_for("two groups at v0", lambda: service.stats.groups >= 2, 120, every=0.1)
        time.sleep(2)
        assert service.stats.groups == 2, "the staleness bound should hold the third group back"
        assert service.stats.blocked_by_staleness_s > 0
        expected_v1 = publish(1)
        wait_for(
            "the third group to start", lambda: service.stats.turns > 2 * GROUP_SIZE, 60, every=0.1
        )
        expected_v2 = publish(2)  # while the third group is in flight
        wait_for("all four groups", lambda: service.stats.groups >= 4, 120, every=0.1)
        assert engine.version == 2
        assert engine.state_dict_checksum() == expected_v2 != expected_v1
    finally:
        service.stop()
        thread.join(120)
        service.close()
        publisher.close()

    steps = [e for e in events_of(settings, codec, topics.steps) if isinstance(e, GenerationStep)]
    finished = events_of(settings, codec, topics.trajectories)
    by_group: dict[str, list] = defaultdict(list)
    for trajectory in finished:
        by_group[trajectory.group_id].append(trajectory)
    assert sorted(len(g) for g in by_group.values()) == [GROUP_SIZE] * 4
    versions = versions_by_trajectory(steps)
    for trajectory_id in versions:
        turns = sorted(
            (s.turn, s.policy_version) for s in steps if s.trajectory_id == trajectory_id
        )
        assert [v for _, v in turns] == sorted(v for _, v in turns)  # versions never go back
    started = sorted(by_group, key=lambda g: min(s.created_at for s in steps if s.group_id == g))
    group_versions = [
        {v for t in by_group[g] for v in t.token_versions if v != NOT_GENERATED} for g in started
    ]
    assert group_versions[0] == group_versions[1] == {0}  # before any publish
    assert min(group_versions[2]) >= 1 and min(group_versions[3]) >= 1  # held back until v1
    assert 2 in group_versions[2] | group_versions[3]  # v2 arrived while they were in flight
    for trajectory in finished:
        generated = [v for v in trajectory.token_versions if v != NOT_GENERATED]
        assert set(generated) == versions[trajectory.trajectory_id]
        # Trained at the latest version (2) at the latest: within the bound of its oldest token.
        assert 2 - min(generated) <= ETA + 1
