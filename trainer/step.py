"""One optimiser step on a batch of GRPO groups with DeepSpeed.

Advantages are normalised within each group; sequences are packed into micro-batches by a token
budget; every micro-batch's loss is a share of the token mean over the whole batch (one
normaliser), so the accumulated gradient is that of the batch's token-mean loss however it was
packed. The trainer owns the accumulation boundary: DeepSpeed reduces and steps once, after the
last micro-batch. One update per batch, so the proximal policy of the decoupled objective is the
current one and the behaviour importance weights carry the off-policyness.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from asearcher.streams.events import TrajectoryFinished
from asearcher.trainer.batching import Group, pack_micro_batches
from asearcher.trainer.objective import ObjectiveConfig, decoupled_ppo_loss, group_advantages
from asearcher.trainer.sequences import micro_batch, token_logprobs


@dataclass
class StepResult:
    """What one step trained on and how the loss looked."""

    samples: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    reward_mean: float = 0.0
    loss: float = 0.0
    clip_fraction: float = 0.0
    capped_fraction: float = 0.0
    seconds: float = 0.0


def flatten(
    groups: list[Group], divide_by_std: bool
) -> tuple[list[TrajectoryFinished], list[float]]:
    """The batch's trajectories and each one's group-normalised advantage."""
    trajectories: list[TrajectoryFinished] = []
    advantages: list[float] = []
    for group in groups:
        rewards = [t.reward for t in group.trajectories]
        trajectories += group.trajectories
        advantages += group_advantages(rewards, divide_by_std=divide_by_std)
    return trajectories, advantages


def train_on_batch(
    engine: Any, groups: list[Group], objective: ObjectiveConfig, micro_batch_tokens: int
) -> StepResult:
    """Accumulate the decoupled PPO loss over the batch's micro-batches, then step once."""
    started = time.perf_counter()
    trajectories, advantages = flatten(groups, objective.divide_by_std)
    packs = pack_micro_batches([len(t.token_ids) for t in trajectories], micro_batch_tokens)
    # Position 0 is never trained (see sequences.micro_batch), so it is not counted either.
    normalizer = max(1, sum(sum(t.loss_mask[1:]) for t in trajectories))
    result = StepResult(samples=len(trajectories))
    engine.train()
    for number, pack in enumerate(packs):
        batch = micro_batch([trajectories[i] for i in pack], [advantages[i] for i in pack])
        batch = batch.to(engine.device)
        engine.set_gradient_accumulation_boundary(number == len(packs) - 1)
        logprobs = token_logprobs(engine, batch)
        loss, stats = decoupled_ppo_loss(
            logprobs, logprobs.detach(), batch.behaviour_logprobs, batch.advantages,
            batch.loss_mask, objective, normalizer=float(normalizer),
        )  # fmt: skip
        engine.backward(loss, scale_wrt_gas=False)
        share = stats.tokens / normalizer
        result.loss += float(loss.detach())
        result.clip_fraction += stats.clip_fraction * share
        result.capped_fraction += stats.capped_fraction * share
        result.tokens += batch.tokens
        result.trained_tokens += stats.tokens
    engine.step()
    result.reward_mean = sum(t.reward for t in trajectories) / max(1, len(trajectories))
    result.seconds = time.perf_counter() - started
    return result
