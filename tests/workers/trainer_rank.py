"""One rank of a two-process trainer, started the way DeepSpeed's launcher starts it (RANK,
WORLD_SIZE, MASTER_ADDR/PORT in the environment). Prints the final weights' checksum.

Usage: trainer_rank.py TRAJECTORIES WEIGHTS METRICS GROUP MODEL_DIR STORE STEPS
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from asearcher.producers.engines.hf_engine import tensor_checksum
from asearcher.streams.cluster.settings import kafka_settings
from asearcher.streams.wire.codec import EventCodec
from asearcher.trainer.policy.batching import BatchingConfig
from asearcher.trainer.runtime.collectives import broadcast
from asearcher.trainer.runtime.config import TrainerConfig, TrainerTopics
from asearcher.trainer.runtime.deepspeed_setup import ensure_distributed, full_state_dict
from asearcher.trainer.runtime.distributed import follow_rank_zero
from asearcher.trainer.runtime.service import TrainerService, build_engine
from asearcher.trainer.runtime.weight_publisher import WeightStore


def config(trajectories, weights, metrics, group) -> TrainerConfig:
    return TrainerConfig(
        topics=TrainerTopics(trajectories=trajectories, weights=weights, metrics=metrics),
        group_id=group, instance=group, keep_last=100,
        batching=BatchingConfig(groups_per_batch=2, micro_batch_tokens=40),
        deepspeed={"zero_optimization": {"stage": 2}, "optimizer": {"params": {"lr": 1e-3}}},
    )  # fmt: skip


def main(trajectories, weights, metrics, group, model_dir, store, steps) -> None:
    settings = config(trajectories, weights, metrics, group)
    if int(os.environ["RANK"]) == 0:
        service = TrainerService(
            kafka_settings(), EventCodec(), settings, Path(model_dir), WeightStore(store),
            **{"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
        )  # fmt: skip
        service.run(max_steps=int(steps), timeout=240)
        service.close()
        engine = service.engine
    else:
        ensure_distributed()
        engine = build_engine(Path(model_dir), broadcast(None), settings, None)
        follow_rank_zero(engine, settings.objective, settings.batching.micro_batch_tokens)
    print(f"checksum {tensor_checksum(full_state_dict(engine))}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
