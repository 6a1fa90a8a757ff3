"""A behaviour-cloning run: trajectories replayed from a topic in, one announced version out.

`training_set` reads every committed trajectory of a topic (e.g. an expert's, made by rollout
producers) and keeps those worth imitating: of the purpose "train", rewarded at least
`min_reward`, each once, each one the trainer itself would accept. `SftJob` trains the policy
on them through the trainer's DeepSpeed code (`sft.sft_on_batch`), starting from the newest
version the run announced (or the initial policy), then publishes the result as the next version
in the weight store, with a recipe in its manifest that says what it was trained on, and
announces it on the weights topic. The run's trainer resumes from it and its rollout producers
load it: a warm start. It must run while the run's trainer is stopped (both would write the
next version).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from asearcher.consumers.scoring.reward import answer_reward
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.io.tail import read_to_end
from asearcher.streams.service.log import get_logger
from asearcher.streams.storage.weight_reader import PublishedVersion
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import TrajectoryFinished, WeightsPublished
from asearcher.streams.wire.topics import TRAJECTORIES, WEIGHTS
from asearcher.trainer.policy.step import StepResult
from asearcher.trainer.runtime.config import TrainerConfig
from asearcher.trainer.runtime.validation import reason_to_refuse
from asearcher.trainer.runtime.weight_publisher import WeightStore
from asearcher.trainer.sft.cloning import sft_on_batch

log = get_logger(__name__)


class SftConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a behaviour-cloning run trains on and how."""

    topic: Annotated[str, Meta(description="where the trajectories to imitate are")] = TRAJECTORIES
    weights_topic: str = WEIGHTS
    model: Annotated[str, Meta(description="the run whose next version this becomes")] = "policy"
    run: Annotated[
        str | None,
        Meta(description='imitate only trajectories requested for this run (metadata "run")'),
    ] = None
    min_reward: Annotated[
        float,
        Meta(
            description=(
                "imitate only trajectories whose answer earned at least this (a reward for "
                "opening pages, page_reward, left out)"
            )
        ),
    ] = 1.0
    limit: Annotated[int | None, Meta(description="at most this many trajectories (None: all)")] = (
        None
    )
    epochs: int = 2
    trajectories_per_step: int = 8
    micro_batch_tokens: int = 16_384
    lr: float = 1e-3
    lr_decay: Annotated[
        bool,
        Meta(
            description=(
                "the rate rises over the first 5 % of steps, then falls linearly to 0 by the "
                "last: the clone ends where small steps settled it, not where the last few "
                "batches at full rate pushed it"
            )
        ),
    ] = False
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("epochs", "trajectories_per_step", "micro_batch_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be at least 1, got {self.limit}")
        if not 0.0 < self.lr < 1.0:
            raise ValueError(f"lr must be in (0, 1), got {self.lr}")


@dataclass
class TrainingSet:
    """The trajectories kept from a topic, and why the others were not."""

    trajectories: list[TrajectoryFinished]
    read: int = 0
    left_out: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        reasons = ", ".join(f"{n} {why}" for why, n in self.left_out.most_common())
        return f"{len(self.trajectories)} of {self.read} trajectories" + (
            f" (left out: {reasons})" if reasons else ""
        )


def training_set(
    settings: KafkaSettings, codec: EventCodec, config: SftConfig, vocab_size: int
) -> TrainingSet:
    """The trajectories of `config.topic` to imitate, ordered by what they hold (question,
    sample, tokens), not by when they arrived: the seeded shuffle must start from the same list
    every time for the same demonstrations to train the same way twice (seen in CI: the same
    test's SFT taught the format or not; seen in runs: the expert's finishing order, which
    changes from run to run, decided which clones a run's warm start got)."""
    kept = TrainingSet([])
    seen: set[str] = set()
    records = read_to_end(settings, codec, config.topic, timeout_s=300.0)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        event = record.event
        if not isinstance(event, TrajectoryFinished):
            continue
        kept.read += 1
        why = _reason_to_leave_out(event, config, vocab_size, seen)
        if why is not None:
            kept.left_out[why] += 1
            continue
        seen.add(event.trajectory_id)
        kept.trajectories.append(event)
    kept.trajectories.sort(key=lambda t: (t.question_id, t.sample_index, t.token_ids))
    if config.limit is not None and len(kept.trajectories) > config.limit:
        kept.left_out["over the limit"] += len(kept.trajectories) - config.limit
        kept.trajectories = kept.trajectories[: config.limit]
    return kept


def _reason_to_leave_out(
    t: TrajectoryFinished, config: SftConfig, vocab_size: int, seen: set[str]
) -> str | None:
    if t.trajectory_id in seen:
        return "read twice"
    if t.purpose != "train":
        return f"purpose {t.purpose}"
    if config.run is not None and t.metadata.get("run") != config.run:
        return "another run's"
    # A reward for opening pages (`page_reward`) makes no answer right.
    if answer_reward(t.reward, t.reward_parts) < config.min_reward:
        return f"reward below {config.min_reward:g}"
    if reason_to_refuse(t, vocab_size) is not None:
        return "not trainable"
    return None


Progress = Callable[[int, int, StepResult], None]


def sft_deepspeed(config: SftConfig, total_steps: int) -> dict[str, Any]:
    """The DeepSpeed overrides of a cloning run of `total_steps` optimiser steps: its rate, and
    with `lr_decay` DeepSpeed's warm-up-then-linear-decay schedule over exactly those steps."""
    overrides: dict[str, Any] = {"optimizer": {"params": {"lr": config.lr}}}
    if config.lr_decay:
        warmup = max(1, total_steps // 20)
        overrides["scheduler"] = {
            "type": "WarmupDecayLR",
            "params": {
                "total_num_steps": max(total_steps, warmup + 1), "warmup_num_steps": warmup,
                "warmup_min_lr": 0.0, "warmup_max_lr": config.lr, "warmup_type": "linear",
            },
        }  # fmt: skip
    return overrides


class SftJob:
    """One behaviour-cloning run of a policy in a weight store."""

    def __init__(
        self,
        settings: KafkaSettings,
        codec: EventCodec,
        config: SftConfig,
        model_dir: Path,
        store: WeightStore,
    ) -> None:
        from asearcher.trainer.runtime.service import last_announced

        self.settings, self.codec, self.config = settings, codec, config
        self.model_dir, self.store = model_dir, store
        self.model_config: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
        self.start = last_announced(settings, codec, config.weights_topic, config.model, store)
        self.version = self.start.version if self.start is not None else 0
        # Weights kept by `train` at the steps asked for, by step.
        self.snapshots: dict[int, dict[str, Any]] = {}
        newer = [v for v in store.versions() if v > self.version]
        if newer:
            raise ValueError(
                f"the store {store.root_url} holds versions {newer} after v{self.version}, the "
                f"last announced one: is the run's trainer running? Stop it first"
            )

    def data(self) -> TrainingSet:
        """The trajectories this job trains on."""
        vocab = int(self.model_config["vocab_size"])
        return training_set(self.settings, self.codec, self.config, vocab)

    def steps(self, data: TrainingSet) -> int:
        """How many optimiser steps `train` takes over `data`."""
        return -(-len(data.trajectories) // self.config.trajectories_per_step) * self.config.epochs

    def train(
        self, data: TrainingSet, progress: Progress | None = None, keep_at: Collection[int] = ()
    ) -> list[StepResult]:
        """Every epoch of `data`, shuffled with the seed, a step per `trajectories_per_step`;
        the weights after each step in `keep_at` are kept in `snapshots`, by step."""
        from asearcher.trainer.runtime.service import build_engine

        config = self.config
        per_step = config.trajectories_per_step
        total = self.steps(data)
        self.snapshots = {}
        trainer = TrainerConfig(seed=config.seed, deepspeed=sft_deepspeed(config, total))
        self.engine = build_engine(self.model_dir, self.start, trainer, self.store.storage_options)
        order = random.Random(config.seed)
        results: list[StepResult] = []
        for _ in range(config.epochs):
            shuffled = list(data.trajectories)
            order.shuffle(shuffled)
            for first in range(0, len(shuffled), per_step):
                batch = shuffled[first : first + per_step]
                results.append(sft_on_batch(self.engine, batch, config.micro_batch_tokens))
                if len(results) in keep_at:
                    # On CPU the state dict holds the live parameters: copy them.
                    state = self.state_dict().items()
                    self.snapshots[len(results)] = {k: v.clone() for k, v in state}
                if progress is not None:
                    progress(len(results), total, results[-1])
        return results

    def state_dict(self) -> dict[str, Any]:
        """The weights `train` left, on CPU (e.g. to score them before publishing)."""
        from asearcher.trainer.runtime.deepspeed_setup import full_state_dict

        return full_state_dict(self.engine)

    def publish(
        self, data: TrainingSet, losses: list[float], notes: dict[str, Any] | None = None,
        weights: dict[str, Any] | None = None,
    ) -> PublishedVersion:  # fmt: skip
        """The trained weights (or `weights`, e.g. a snapshot) as the next version, announced,
        with the cloning `losses` per step that made them; its manifest says what made it (the
        recipe, with `notes` added, e.g. how this clone was chosen)."""
        config = self.config
        version = self.version + 1
        recipe = {
            "kind": "sft", "topic": config.topic, "run": config.run,
            "trajectories": len(data.trajectories),
            "min_reward": config.min_reward, "epochs": config.epochs,
            "steps": len(losses), "lr": config.lr, "lr_decay": config.lr_decay,
            "seed": config.seed,
            "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None, **(notes or {}),
        }  # fmt: skip
        published = self.store.publish_state_dict(
            version, step=version, parent_version=self.version,
            state_dict=self.state_dict() if weights is None else weights,
            config=self.model_config,
            tokenizer_dir=self.model_dir, model=config.model, recipe=recipe,
            trained_ids=[t.trajectory_id for t in data.trajectories],
        )  # fmt: skip
        announcement = WeightsPublished(
            model=config.model, version=version, uri=published.uri,
            sha256=published.sha256, step=version,
            metrics={"sft_loss": losses[-1]} if losses else {},
        )  # fmt: skip
        with EventProducer(self.settings, self.codec) as producer:
            producer.send(config.weights_topic, announcement)
            producer.flush()
        self.store.mark_announced(version)
        log.info("published and announced %s v%d (%s)", config.model, version, data.summary())
        return published
