"""Everything `asearcher train serve` can be told, with defaults, loaded from TOML."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from asearcher.streams.service.config_file import load_config
from asearcher.streams.wire.topics import SERVICE_STATUS, TRAINER_METRICS, TRAJECTORIES, WEIGHTS
from asearcher.trainer.policy.batching import BatchingConfig
from asearcher.trainer.policy.objective import ObjectiveConfig


class TrainerTopics(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Topic names, overridable for tests and side-by-side deployments."""

    trajectories: Annotated[str, Meta(description="finished groups to train on")] = TRAJECTORIES
    weights: Annotated[str, Meta(description="where versions are announced")] = WEIGHTS
    metrics: Annotated[str, Meta(description="one event per step and per drop")] = TRAINER_METRICS
    status: Annotated[str, Meta(description="heartbeats")] = SERVICE_STATUS


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

    model_dir: Annotated[
        str | None, Meta(description="the initial policy (Hugging Face dir); default <home>/model")
    ] = None
    store: Annotated[
        str | None,
        Meta(description="weight store URL; default $ASEARCHER_WEIGHT_STORE or <home>/weights"),
    ] = None
    model: Annotated[
        str, Meta(description="the name versions are announced under on the weights topic")
    ] = "policy"
    group_id: Annotated[str, Meta(description="consumer group on the trajectories topic")] = (
        "asearcher-trainer"
    )
    instance: Annotated[
        str, Meta(description="stable: a restarted trainer fences its dead predecessor")
    ] = "trainer"
    deepspeed: Annotated[
        dict[str, Any],
        Meta(description="merged over the default DeepSpeed config (see docs/trainer.md)"),
    ] = {}
    batching: BatchingConfig = msgspec.field(default_factory=BatchingConfig)
    objective: ObjectiveConfig = msgspec.field(default_factory=ObjectiveConfig)
    keep_last: Annotated[
        int, Meta(description="versions kept in the store: the newest keep_last ...")
    ] = 5
    keep_every: Annotated[int, Meta(description="... and every keep_every-th (0: none)")] = 0
    seed: Annotated[int, Meta(description="seed of the trainer's random number generators")] = 0
    log_every_s: Annotated[
        float, Meta(description="period of the waiting log line between steps")
    ] = 10.0
    stall_after_s: Annotated[
        float, Meta(description="without a step this long, say why in logs and status")
    ] = 30.0
    status_every_s: Annotated[
        float, Meta(description="period of the heartbeat on service.status")
    ] = 5.0
    pause_before_commit_s: Annotated[
        float,
        Meta(
            description=(
                "Fault injection for tests: sleep between writing a version and committing "
                "its step."
            )
        ),
    ] = 0.0
    timed_step: Annotated[
        TimedStep | None,
        Meta(
            description=(
                "Benchmarks of the topology: the step only waits (see TimedStep); None: real steps."
            )
        ),
    ] = None
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


def step_fingerprint(config: TrainerConfig) -> str:
    """A fingerprint of the settings that shape what a step computes from its batch (objective,
    packing, DeepSpeed overrides, seed); the code's defaults are not in it. Every step event
    carries it, so re-training can tell a step trained with other settings than it has."""
    shaping = {
        "objective": config.objective, "micro_batch_tokens": config.batching.micro_batch_tokens,
        "deepspeed": config.deepspeed, "seed": config.seed, "timed_step": config.timed_step,
    }  # fmt: skip
    return hashlib.sha256(msgspec.json.encode(shaping, order="deterministic")).hexdigest()[:16]


def load_trainer_config(path: Path | None, **overrides: Any) -> TrainerConfig:
    """The trainer config in TOML file `path` (or the defaults), with `overrides`."""
    return load_config(TrainerConfig, "trainer config", path, **overrides)
