"""Everything `asearcher train serve` can be told, with defaults, loaded from TOML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from asearcher.streams.config_file import load_config
from asearcher.streams.topics import SERVICE_STATUS, TRAINER_METRICS, TRAJECTORIES, WEIGHTS
from asearcher.trainer.batching import BatchingConfig
from asearcher.trainer.objective import ObjectiveConfig


class TrainerTopics(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Topic names, overridable for tests and side-by-side deployments."""

    trajectories: str = TRAJECTORIES
    weights: str = WEIGHTS
    metrics: str = TRAINER_METRICS
    status: str = SERVICE_STATUS


class TimedStep(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A stand-in for the step's compute, to model a trainer on a device of its own: the step
    waits `fixed_s + per_sample_s * samples` instead of running the optimiser. The weights do
    not change; versions are published and committed as usual."""

    fixed_s: float = 1.0
    per_sample_s: float = 0.0

    def __post_init__(self) -> None:
        if self.fixed_s < 0 or self.per_sample_s < 0:
            raise ValueError("timed_step: fixed_s and per_sample_s must be >= 0")


class TrainerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The trainer service's settings. Every field has a default."""

    model_dir: str | None = None  # the initial policy (Hugging Face dir); default <home>/model
    store: str | None = None  # weight store URL; default $ASEARCHER_WEIGHT_STORE or <home>/weights
    model: str = "policy"  # the name versions are announced under on the weights topic
    group_id: str = "asearcher-trainer"  # consumer group on the trajectories topic
    instance: str = "trainer"  # stable: a restarted trainer fences its dead predecessor
    deepspeed: dict[str, Any] = {}  # merged over the default DeepSpeed config (see docs/trainer.md)
    batching: BatchingConfig = msgspec.field(default_factory=BatchingConfig)
    objective: ObjectiveConfig = msgspec.field(default_factory=ObjectiveConfig)
    keep_last: int = 5  # versions kept in the store: the newest keep_last ...
    keep_every: int = 0  # ... and every keep_every-th (0: none)
    seed: int = 0
    log_every_s: float = 10.0  # period of the waiting log line between steps
    stall_after_s: float = 30.0  # without a step this long, say why in logs and status
    status_every_s: float = 5.0  # period of the heartbeat on service.status
    # Fault injection for tests: sleep between writing a version and committing its step.
    pause_before_commit_s: float = 0.0
    # Benchmarks of the topology: the step only waits (see TimedStep); None: real steps.
    timed_step: TimedStep | None = None
    topics: TrainerTopics = msgspec.field(default_factory=TrainerTopics)

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {self.keep_last}")
        if self.keep_every < 0:
            raise ValueError(f"keep_every must be >= 0, got {self.keep_every}")
        for name in ("log_every_s", "stall_after_s", "status_every_s"):
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")


def load_trainer_config(path: Path | None, **overrides: Any) -> TrainerConfig:
    """The trainer config in TOML file `path` (or the defaults), with `overrides`."""
    return load_config(TrainerConfig, "trainer config", path, **overrides)
