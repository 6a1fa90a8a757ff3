"""Re-training from the log: a run's steps fed again, batch by batch, through the trainer's step.

Input: the run's `TrainerStepFinished` events (each names the trajectories it trained, in the
order it used them, the version it started from, whether its optimiser was fresh, its thread and
rank counts and its weights' checksum) and the `TrajectoryFinished` events they name. Output: the
same versions, rebuilt by the same code (`build_engine`, `train_on_batch`), published in another
store. With the run's own settings, every rebuilt model file is byte for byte the original's;
anything else a step depended on would be a hole in the log.

A run trained by several data-parallel processes is rebuilt by as many: this process is rank 0
and broadcasts each engine build and each batch, the others run `follow_retraining`, so every
rank trains its share of the same micro-batches and the gradients are averaged as they were.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from asearcher.streams.storage.weight_reader import MODEL_FILE, PublishedVersion
from asearcher.streams.wire.events import TrainerStepFinished, TrajectoryFinished
from asearcher.trainer.policy.batching import Group
from asearcher.trainer.policy.step import StepResult, train_on_batch
from asearcher.trainer.runtime.collectives import broadcast
from asearcher.trainer.runtime.config import TrainerConfig
from asearcher.trainer.runtime.weight_publisher import WeightStore


class RetrainError(Exception):
    """The log cannot be re-trained as asked (one line, naming the version)."""


def batch_of(step: TrainerStepFinished, trajectories: dict[str, TrajectoryFinished]) -> list[Group]:
    """The step's batch as the trainer held it: its groups in order, members in order (a group's
    members are consecutive in `trained_ids`)."""
    missing = [tid for tid in step.trained_ids if tid not in trajectories]
    if missing:
        raise RetrainError(
            f"v{step.version}: {len(missing)} of its {len(step.trained_ids)} trajectories are not "
            f"in the log (first {missing[0]}): expired by retention, or another topic holds them"
        )
    groups: list[Group] = []
    for tid in step.trained_ids:
        trajectory = trajectories[tid]
        if not groups or groups[-1].group_id != trajectory.group_id:
            groups.append(Group(group_id=trajectory.group_id, trajectories=[]))
        groups[-1].trajectories.append(trajectory)
    return groups


def check_replayable(steps: list[TrainerStepFinished], fingerprint: str | None) -> int:
    """Raise unless `steps` form one chain recorded fully enough to rebuild, by one number of
    processes; with a `fingerprint`, also unless every step was trained with those settings.
    Returns that number of processes."""
    for before, step in zip([None, *steps], steps, strict=False):
        if step.parent_version < 0 or not step.weights_sha256:
            raise RetrainError(
                f"v{step.version} was trained before steps recorded what re-training needs "
                "(their parent version and checksum): this run cannot be rebuilt"
            )
        if before is not None and step.parent_version != before.version:
            raise RetrainError(
                f"v{step.version} starts from v{step.parent_version}, not from the step before "
                f"it (v{before.version}): the log's chain of steps has a gap"
            )
        if step.ranks != steps[0].ranks:
            raise RetrainError(
                f"v{step.version} was trained by {step.ranks} processes, v{steps[0].version} by "
                f"{steps[0].ranks}: re-training replays one number of processes per run"
            )
        if fingerprint is not None and step.settings_sha256 != fingerprint:
            raise RetrainError(
                f"v{step.version} was trained with other trainer settings than the run config "
                f"holds now (fingerprint {step.settings_sha256}, the config's {fingerprint})"
            )
    return steps[0].ranks if steps else 1


class Retrainer:
    """Rebuilds versions step by step into `store`, from `start` (None: the initial policy).
    In a process group of several ranks it is rank 0; `close` releases the others."""

    def __init__(
        self, config: TrainerConfig, model_dir: Path, store: WeightStore,
        start: PublishedVersion | None,
    ) -> None:  # fmt: skip
        from asearcher.trainer.runtime.deepspeed_setup import ensure_distributed

        ensure_distributed()
        self.config, self.model_dir, self.store = config, model_dir, store
        self.current = start
        self._model_config = json.loads((model_dir / "config.json").read_text())
        self._engine: Any = None

    def step(
        self, step: TrainerStepFinished, batch: list[Group]
    ) -> tuple[PublishedVersion, StepResult]:
        """Train `batch` as `step` did and publish the result as `step.version`."""
        import torch

        from asearcher.trainer.runtime.deepspeed_setup import full_state_dict
        from asearcher.trainer.runtime.service import build_engine

        if self._engine is None or step.optimizer_step == 1:
            # A trainer (re)start: its engine built afresh at the version it resumed from, the
            # seeds reset and the optimiser empty, as the service does (on every rank).
            broadcast(_BuildEngine(self.current, self.store.storage_options))
            self._engine = build_engine(
                self.model_dir, self.current, self.config, self.store.storage_options
            )
        broadcast(_TrainBatch(batch, step.threads))
        if step.threads:
            torch.set_num_threads(step.threads)
        result = train_on_batch(
            self._engine, batch, self.config.objective, self.config.batching.micro_batch_tokens
        )
        state = full_state_dict(self._engine)  # a collective under ZeRO-3, as in the service
        if result.skipped:
            raise RetrainError(f"v{step.version}: the re-trained step's loss was not finite")
        published = self.store.publish_state_dict(
            step.version, step=step.version, parent_version=step.parent_version,
            state_dict=state, config=self._model_config,
            tokenizer_dir=self.model_dir, trained_ids=step.trained_ids, model=self.config.model,
        )  # fmt: skip
        self.current = published
        return published, result

    def close(self) -> None:
        """Release the other ranks (nothing to do in one process)."""
        broadcast(None)


class _BuildEngine(NamedTuple):
    """Rank 0 to the others: build the engine afresh at `version` (None: the initial policy)."""

    version: PublishedVersion | None
    storage_options: dict[str, Any] | None


class _TrainBatch(NamedTuple):
    """Rank 0 to the others: train your share of `batch` with `threads` intra-op threads."""

    batch: list[Group]
    threads: int


def follow_retraining(config: TrainerConfig, model_dir: Path) -> int:
    """On ranks > 0 of a re-training: build and train as rank 0 broadcasts, until it
    broadcasts None; the number of steps taken."""
    import torch

    from asearcher.trainer.runtime.deepspeed_setup import ensure_distributed, full_state_dict
    from asearcher.trainer.runtime.service import build_engine

    ensure_distributed()
    engine: Any = None
    steps = 0
    while (message := broadcast(None)) is not None:
        if isinstance(message, _BuildEngine):
            engine = build_engine(model_dir, message.version, config, message.storage_options)
            continue
        if message.threads:
            torch.set_num_threads(message.threads)
        train_on_batch(engine, message.batch, config.objective, config.batching.micro_batch_tokens)
        full_state_dict(engine)
        steps += 1
    return steps


def model_sha256(version: PublishedVersion) -> str:
    """The checksum of a version's model file (what `--verify` compares)."""
    return version.manifest.files[MODEL_FILE]
