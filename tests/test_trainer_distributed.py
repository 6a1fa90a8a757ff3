"""Two trainer processes (data parallel, ZeRO-2, gloo on CPU) take the same steps as one."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
import torch

from asearcher.streams.storage.weight_reader import load_state_dict
from asearcher.trainer.runtime.weight_publisher import WeightStore
from tests.conftest import DISTRIBUTED_VARIABLES, free_port_pair, worker_command
from tests.support.rollout import FAST_GROUP, events_of
from tests.support.trainer import rewarded_groups, tiny_model_dir
from tests.support.trainer_service import send, trainer_topics
from tests.workers.trainer_rank import config


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("distributed"))


def single_topic_topics(make_topic):
    topics = trainer_topics(make_topic)
    return type(topics)(trajectories=make_topic(like="trajectories", partitions=1),
                        weights=topics.weights, metrics=topics.metrics)  # fmt: skip


@pytest.mark.slow
def test_two_ranks_train_like_one_process(
    settings, codec, make_topic, model_dir: Path, tmp_path: Path, worker_env
) -> None:
    from transformers import AutoModelForCausalLM

    from asearcher.trainer.runtime.service import TrainerService

    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    groups, _, _ = rewarded_groups(reference, groups=4, seed=11)
    data = [t for g in groups for t in g.trajectories]

    two = single_topic_topics(make_topic)
    send(settings, codec, two.trajectories, data)
    group, store_two = f"dp-{uuid.uuid4().hex[:6]}", (tmp_path / "two").as_uri()
    env = {k: v for k, v in worker_env.items() if k not in DISTRIBUTED_VARIABLES}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port_pair()), WORLD_SIZE="2")
    args = [two.trajectories, two.weights, two.metrics, group, str(model_dir), store_two, "2"]
    ranks = [
        subprocess.Popen(
            worker_command("trainer_rank.py", *args),
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in range(2)
    ]
    outputs = [rank.communicate(timeout=280)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    checksums = [
        line for out in outputs for line in out.splitlines() if line.startswith("checksum")
    ]
    assert len(checksums) == 2 and checksums[0] == checksums[1]  # the ranks stayed identical

    one = single_topic_topics(make_topic)
    send(settings, codec, one.trajectories, data)
    store_one = WeightStore((tmp_path / "one").as_uri())
    settings_one = config(one.trajectories, one.weights, one.metrics, f"sp-{uuid.uuid4().hex[:6]}")
    single = TrainerService(settings, codec, settings_one, model_dir, store_one, **FAST_GROUP)
    assert single.run(max_steps=2, timeout=240) == 2
    single.close()

    published_two = WeightStore(store_two).get(2)
    published_one = store_one.get(2)
    _, weights_two = load_state_dict(published_two.uri, published_two.sha256)
    _, weights_one = load_state_dict(published_one.uri, published_one.sha256)
    start = reference.state_dict()
    for name, tensor in weights_one.items():
        assert torch.allclose(tensor, weights_two[name], atol=1e-5), name
    assert not torch.allclose(weights_two["model.norm.weight"], start["model.norm.weight"])
    steps = events_of(settings, codec, two.metrics)
    assert sorted(t for s in steps for t in s.trained_ids) == sorted(t.trajectory_id for t in data)
