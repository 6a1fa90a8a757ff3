"""A trainer in its own process, so a test can SIGKILL it between steps' phases.

Usage: trainer_process.py TRAJECTORIES WEIGHTS METRICS GROUP INSTANCE MODEL_DIR STORE PAUSE_S
"""

from __future__ import annotations

import sys
from pathlib import Path

from asearcher.streams.cluster.settings import kafka_settings
from asearcher.streams.wire.codec import EventCodec
from asearcher.trainer.policy.batching import BatchingConfig
from asearcher.trainer.runtime.config import TrainerConfig, TrainerTopics
from asearcher.trainer.runtime.service import TrainerService
from asearcher.trainer.runtime.weight_publisher import WeightStore


def main(trajectories, weights, metrics, group, instance, model_dir, store, pause) -> None:
    config = TrainerConfig(
        topics=TrainerTopics(trajectories=trajectories, weights=weights, metrics=metrics),
        group_id=group, instance=instance, keep_last=100,
        batching=BatchingConfig(groups_per_batch=2, eta=10, micro_batch_tokens=40),
        pause_before_commit_s=float(pause),
    )  # fmt: skip
    service = TrainerService(
        kafka_settings(), EventCodec(), config, Path(model_dir), WeightStore(store),
        **{"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
    )  # fmt: skip
    print(f"serving at v{service.version}", flush=True)
    steps = service.run()
    service.close()
    print(f"stopped after {steps} steps", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
