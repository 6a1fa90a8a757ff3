"""Re-training from the log: a run's steps fed again, batch by batch, through the trainer's step.

Input: the run's `TrainerStepFinished` events (each names the trajectories it trained, in the
order it used them, the version it started from, whether its optimiser was fresh, its thread and
rank counts and its weights' checksum) and the `TrajectoryFinished` events they name. Output: the
same versions, rebuilt by the same code (`build_engine`, `train_on_batch`), published in another
store. With the run's own settings, every rebuilt model file is byte for byte the original's;
anything else a step depended on would be a hole in the log.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asearcher.streams.storage.weight_reader import MODEL_FILE, PublishedVersion
from asearcher.streams.wire.events import TrainerStepFinished, TrajectoryFinished
from asearcher.trainer.policy.batching import Group
from asearcher.trainer.policy.step import StepResult, train_on_batch
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


def check_replayable(steps: list[TrainerStepFinished], fingerprint: str | None) -> None:
    """Raise unless `steps` form one chain recorded fully enough to rebuild, on one process;
    with a `fingerprint`, also unless every step was trained with those settings."""
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
        if step.ranks != 1:
            raise RetrainError(
                f"v{step.version} was trained by {step.ranks} processes; re-training replays "
                "one-process trainers only"
            )
        if fingerprint is not None and step.settings_sha256 != fingerprint:
            raise RetrainError(
                f"v{step.version} was trained with other trainer settings than the run config "
                f"holds now (fingerprint {step.settings_sha256}, the config's {fingerprint})"
            )


class Retrainer:
    """Rebuilds versions step by step into `store`, from `start` (None: the initial policy)."""

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
            # seeds reset and the optimiser empty, as the service does.
            self._engine = build_engine(
                self.model_dir, self.current, self.config, self.store.storage_options
            )
        if step.threads:
            torch.set_num_threads(step.threads)
        result = train_on_batch(
            self._engine, batch, self.config.objective, self.config.batching.micro_batch_tokens
        )
        if result.skipped:
            raise RetrainError(f"v{step.version}: the re-trained step's loss was not finite")
        published = self.store.publish_state_dict(
            step.version, step=step.version, parent_version=step.parent_version,
            state_dict=full_state_dict(self._engine), config=self._model_config,
            tokenizer_dir=self.model_dir, trained_ids=step.trained_ids, model=self.config.model,
        )  # fmt: skip
        self.current = published
        return published, result


def model_sha256(version: PublishedVersion) -> str:
    """The checksum of a version's model file (what `--verify` compares)."""
    return version.manifest.files[MODEL_FILE]
