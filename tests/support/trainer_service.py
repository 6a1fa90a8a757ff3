"""A trainer service under test: its private topics, its config, trajectories sent to it."""

from __future__ import annotations

import uuid

from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.events import TrajectoryFinished
from asearcher.trainer.policy.batching import BatchingConfig
from asearcher.trainer.runtime.config import TrainerConfig, TrainerTopics


def trainer_topics(make_topic) -> TrainerTopics:
    return TrainerTopics(
        trajectories=make_topic(like="trajectories", partitions=2),
        weights=make_topic(like="weights"),
        metrics=make_topic(like="trainer.metrics"),
    )


def trainer_config(topics: TrainerTopics, drop_stale: bool = False, **fields) -> TrainerConfig:
    batching = BatchingConfig(
        groups_per_batch=2, eta=1, micro_batch_tokens=40, drop_stale=drop_stale
    )
    return TrainerConfig(
        topics=topics, group_id=f"trainer-{uuid.uuid4().hex[:6]}", instance=uuid.uuid4().hex,
        batching=batching, deepspeed={"optimizer": {"params": {"lr": 1e-3}}}, keep_last=10,
        **fields,
    )  # fmt: skip


def send(settings, codec, topic: str, trajectories: list[TrajectoryFinished]) -> None:
    with EventProducer(settings, codec) as producer:
        for trajectory in trajectories:
            producer.send(topic, trajectory)


def sent_groups(settings, codec, make_topic, model_dir, tmp_path, groups: int, seed: int):
    """Private trainer topics, a weight store, and `groups` rewarded groups of two sent to the
    trajectories topic: (topics, store, the trajectories sent)."""
    import torch
    from transformers import AutoModelForCausalLM

    from asearcher.trainer.runtime.weight_publisher import WeightStore
    from tests.support.trainer import rewarded_groups

    topics = trainer_topics(make_topic)
    store = WeightStore((tmp_path / "weights").as_uri())
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    made, _, _ = rewarded_groups(reference, groups=groups, seed=seed)
    sent = [t for g in made for t in g.trajectories]
    send(settings, codec, topics.trajectories, sent)
    return topics, store, sent
