"""One optimiser step on a batch of GRPO groups with DeepSpeed.

Advantages are the group-centred rewards, normalised over the batch's loss tokens (or within
each group, see `ObjectiveConfig.advantages`); each trajectory's training sequences are rows,
packed into micro-batches by a token budget; every micro-batch's loss is a share of the token
mean over the whole batch (one normaliser), so the accumulated gradient is that of the batch's
token-mean loss however it was packed (with `ObjectiveConfig.loss_average = "sequences"` each
trajectory's advantages are scaled so that this token mean is the mean of the trajectories'
token means). The trainer owns the accumulation boundary: DeepSpeed reduces and steps once,
after the last micro-batch. One update per batch by default, so the
proximal policy of the decoupled objective is the current one and the behaviour importance
weights carry the off-policyness. With `ObjectiveConfig.minibatches` = n (AReaL's
`ppo_n_minibatches`) the batch, its advantages normalised as a whole, is split into n
minibatches stepped one after the other, each against the proximal log-probs taken once before
the first: n updates from one batch, within the trust region of the policy that began it.

A non-finite loss or gradient never reaches the optimiser: the step is skipped on every rank
(its gradients dropped, `StepResult.skipped` set) and the weights stay as they were. DeepSpeed's
own optimisers (ZeRO, fp16, bf16) already skip a step whose gradient norm is not finite; a plain
torch optimiser (stage 0 in fp32, the default) would step and turn every weight into NaN.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from asearcher.streams.service.log import get_logger
from asearcher.streams.wire.events import StepStats, TrajectoryFinished
from asearcher.trainer.policy.batching import Group, pack_micro_batches
from asearcher.trainer.policy.objective import (
    ObjectiveConfig,
    decoupled_ppo_loss,
    group_advantages,
    normalise_by_tokens,
    sequence_mean_scales,
    token_moments,
)
from asearcher.trainer.policy.sequences import Row, rows_batch, token_logprobs, training_rows
from asearcher.trainer.runtime.collectives import rank_and_world, sum_across_ranks

log = get_logger(__name__)


@dataclass(frozen=True)
class StepResult:
    """One step's figures (as its `TrainerStepFinished` carries them) and whether it applied."""

    stats: StepStats
    skipped: bool = False  # a loss or gradient was not finite: the weights did not change


def batch_stats(trajectories: list[TrajectoryFinished], **figures: Any) -> StepStats:
    """The statistics of a step on `trajectories`: their count and mean reward, and `figures`."""
    reward_mean = sum(t.reward for t in trajectories) / max(1, len(trajectories))
    return StepStats(samples=len(trajectories), reward_mean=reward_mean, **figures)


def flatten(
    groups: list[Group], objective: ObjectiveConfig
) -> tuple[list[TrajectoryFinished], list[float]]:
    """The batch's trajectories and each one's group advantage: its reward minus the group
    mean, divided by the group's std in the "group_std" mode."""
    divide = objective.advantages == "group_std" and objective.divide_by_std
    trajectories: list[TrajectoryFinished] = []
    advantages: list[float] = []
    for group in groups:
        rewards = [t.reward for t in group.trajectories]
        trajectories += group.trajectories
        advantages += group_advantages(rewards, divide_by_std=divide)
    return trajectories, advantages


def normalised_over_tokens(rows: list[Row], mine: list[int]) -> list[Row]:
    """`rows` with advantages normalised over the loss tokens of the whole batch.

    Each rank passes the indices of the rows it trains; their token moments are summed across
    ranks, so every rank normalises with the batch's mean and std (AReaL's all-reduce)."""
    moments = token_moments(
        [rows[i].advantage for i in mine], [rows[i].trained_tokens for i in mine]
    )
    values = normalise_by_tokens([row.advantage for row in rows], sum_across_ranks(moments))
    return [replace(row, advantage=value) for row, value in zip(rows, values, strict=True)]


def train_on_batch(
    engine: Any, groups: list[Group], objective: ObjectiveConfig, micro_batch_tokens: int
) -> StepResult:
    """Accumulate the decoupled PPO loss over each minibatch's micro-batches and step once per
    minibatch (`objective.minibatches`; one by default)."""
    started = time.perf_counter()
    rank, world = rank_and_world()
    trajectories, advantages = flatten(groups, objective)
    rows = training_rows(trajectories, advantages)  # a row per training sequence
    minibatches = [
        [[part[i] for i in pack] for pack in
         pack_micro_batches([rows[i].length for i in part], micro_batch_tokens)]
        for part in split_rows(rows, objective.minibatches)
    ]  # fmt: skip
    if objective.advantages == "batch_tokens":
        mine = [i for packs in minibatches for pack in packs[rank::world] for i in pack]
        rows = normalised_over_tokens(rows, mine)
    if objective.loss_average == "sequences":
        rows = averaged_per_sequence(rows, [[i for pack in packs for i in pack]
                                            for packs in minibatches])  # fmt: skip
    engine.train()
    # One minibatch: the proximal policy is the one being trained (its log-probs detached);
    # several: it is the policy before the first update, taken once for every row.
    proximal = proximal_logprobs(engine, rows, minibatches) if len(minibatches) > 1 else None
    totals, applied = [0.0] * 5, 0  # loss, clip share, capped share, tokens, trained tokens
    # Position 0 of a row is never trained (see sequences.rows_batch), so it is not counted.
    batch_tokens = max(1, sum(row.trained_tokens for row in rows))
    for packs in minibatches:
        part, stepped = _update(engine, rows, packs, objective, proximal, batch_tokens)
        totals, applied = [a + b for a, b in zip(totals, part, strict=True)], applied + stepped
    if 0 < applied < len(minibatches):
        log.warning("%d of %d minibatch updates skipped: a loss or gradient was not finite",
                    len(minibatches) - applied, len(minibatches))  # fmt: skip
    loss, clip, capped, tokens, trained = sum_across_ranks(totals)
    stats = batch_stats(
        trajectories, tokens=int(tokens), trained_tokens=int(trained), loss=loss,
        clip_fraction=clip, capped_fraction=capped, seconds=time.perf_counter() - started,
    )  # fmt: skip
    return StepResult(stats, skipped=applied == 0)


def averaged_per_sequence(rows: list[Row], parts: list[list[int]]) -> list[Row]:
    """`rows` with advantages scaled so that each minibatch's token-mean loss (the normaliser
    `_update` divides by) becomes the mean over its trajectories of each one's token mean."""
    scaled = list(rows)
    for part in parts:
        tokens: dict[int, int] = {}  # by trajectory (its rows are its sequences)
        for i in part:
            key = id(rows[i].trajectory)
            tokens[key] = tokens.get(key, 0) + rows[i].trained_tokens
        scales = dict(zip(tokens, sequence_mean_scales(list(tokens.values())), strict=True))
        for i in part:
            scale = scales[id(rows[i].trajectory)]
            scaled[i] = replace(rows[i], advantage=rows[i].advantage * scale)
    return scaled


def split_rows(rows: list[Row], parts: int) -> list[list[int]]:
    """Row indices in `parts` minibatches of about equal trained tokens, in order, each whole
    trajectory in one (AReaL splits a batch by sequences the same way); fewer parts when there
    are fewer trajectories."""
    if parts <= 1:
        return [list(range(len(rows)))]
    total = sum(row.trained_tokens for row in rows)
    split: list[list[int]] = [[]]
    done = 0
    for index, row in enumerate(rows):
        new_trajectory = index > 0 and row.trajectory is not rows[index - 1].trajectory
        if new_trajectory and done >= total * len(split) / parts and len(split) < parts:
            split.append([])
        split[-1].append(index)
        done += row.trained_tokens
    return split


def proximal_logprobs(
    engine: Any, rows: list[Row], minibatches: list[list[list[int]]]
) -> dict[int, torch.Tensor]:
    """Per micro-batch this rank trains (keyed by its first row), the log-probs of the weights
    before any update: the proximal policy of every minibatch of the batch."""
    rank, world = rank_and_world()
    taken: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for packs in minibatches:
            for pack in packs[rank::world]:
                batch = rows_batch([rows[i] for i in pack]).to(engine.device)
                taken[pack[0]] = token_logprobs(engine, batch, trained_only=True).detach()
    return taken


def _update(
    engine: Any,
    rows: list[Row],
    packs: list[list[int]],
    objective: ObjectiveConfig,
    proximal: dict[int, torch.Tensor] | None,
    batch_tokens: int,
) -> tuple[list[float], bool]:
    """One optimiser step on a minibatch's micro-batches: its totals (its share of the batch's
    token-mean loss, clip and capped shares of the batch's `batch_tokens` trained tokens,
    tokens, trained tokens) and whether it applied."""
    rank, world = rank_and_world()
    # Every rank takes its share of the micro-batches; one with none still joins the gradient
    # reduction, with a pass over a sequence whose advantages are 0.
    mine = packs[rank::world] or [packs[0][:1]]
    weight = 1.0 if packs[rank::world] else 0.0
    normalizer = max(1, sum(rows[i].trained_tokens for pack in packs for i in pack))
    totals = [0.0] * 5
    finite = True
    for number, pack in enumerate(mine):
        batch = rows_batch(
            [replace(rows[i], advantage=rows[i].advantage * weight) for i in pack]
        ).to(engine.device)
        engine.set_gradient_accumulation_boundary(number == len(mine) - 1)
        logprobs = token_logprobs(engine, batch, trained_only=True)
        before = logprobs.detach() if proximal is None else proximal[pack[0]]
        loss, stats = decoupled_ppo_loss(
            logprobs, before, batch.behaviour_logprobs, batch.advantages,
            batch.loss_mask, objective, normalizer=float(normalizer),
        )  # fmt: skip
        # DeepSpeed averages gradients over ranks; scaling by the world size makes the sum of
        # every rank's part the gradient of the whole minibatch's token mean.
        engine.backward(loss * world, scale_wrt_gas=False)
        finite = finite and math.isfinite(stats.loss)
        if weight:
            share = stats.tokens / batch_tokens
            figures = (float(loss.detach()) * (normalizer / batch_tokens),
                       stats.clip_fraction * share, stats.capped_fraction * share,
                       batch.tokens, stats.tokens)  # fmt: skip
            totals = [a + b for a, b in zip(totals, figures, strict=True)]
    return totals, step_if_finite(engine, finite)


def timed_step(groups: list[Group], fixed_s: float, per_sample_s: float) -> StepResult:
    """Wait what a step on `groups` would take elsewhere, train nothing (see TimedStep)."""
    trajectories = [t for group in groups for t in group.trajectories]
    seconds = fixed_s + per_sample_s * len(trajectories)
    time.sleep(seconds)
    return StepResult(batch_stats(
        trajectories, tokens=sum(len(t.token_ids) for t in trajectories),
        trained_tokens=sum(sum(t.loss_mask) for t in trajectories), seconds=seconds,
    ))  # fmt: skip


def step_if_finite(engine: Any, losses_finite: bool) -> bool:
    """Take the optimiser step unless a loss or gradient is non-finite on any rank; True if the
    weights were updated. Every rank must call this after its last backward pass."""
    finite = losses_finite and _gradients_finite(engine)
    # One vote per rank: ranks that disagreed would step different weights.
    finite = sum_across_ranks([0.0 if finite else 1.0])[0] == 0.0
    if hasattr(engine.optimizer, "overflow"):
        # DeepSpeed's optimisers hold the reduced gradients in their own buffers and skip (and
        # clear) a step whose norm is not finite themselves; only they can drop those buffers.
        engine.step()
        applied = bool(engine.was_step_applied())
        if applied and not finite:
            log.warning("DeepSpeed stepped: a loss was not finite but the gradient norm was")
        return applied
    if not finite:
        engine.zero_grad()
        return False
    engine.step()
    return True


def _gradients_finite(engine: Any) -> bool:
    """Whether the gradients this rank holds (before reduction) are finite, norm included."""
    grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
    if not grads:
        return True  # ZeRO-2/3 moved them into the optimiser, which checks them itself
    # The norm, not just the values: finite gradients can still overflow it, and clipping by an
    # infinite norm zeroes or NaNs them.
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    return bool(torch.isfinite(norm))
