"""Behaviour cloning: one optimiser step of next-token loss on trajectories' policy tokens.

The same rows, micro-batches and accumulation as an RL step (`step.py`), with the negative
log-likelihood of the loss-mask tokens (what the policy wrote, never the prompt or the tools'
observations) in place of the PPO objective. Log-probs are taken at temperature 1, whatever the
trajectory was sampled with: cloning fits the distribution itself, sampling settings are applied
on top of it later. The loss is the token mean over the whole batch however it was packed.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

import torch

from asearcher.streams.wire.events import TrajectoryFinished
from asearcher.trainer.policy.batching import pack_micro_batches
from asearcher.trainer.policy.sequences import rows_batch, token_logprobs, training_rows
from asearcher.trainer.policy.step import StepResult, batch_stats, step_if_finite
from asearcher.trainer.runtime.collectives import rank_and_world, sum_across_ranks


def sft_on_batch(
    engine: Any, trajectories: list[TrajectoryFinished], micro_batch_tokens: int
) -> StepResult:
    """Accumulate the token-mean NLL of `trajectories`' policy tokens, then step once."""
    started = time.perf_counter()
    rank, world = rank_and_world()
    rows = training_rows(trajectories, [0.0] * len(trajectories))
    packs = pack_micro_batches([row.length for row in rows], micro_batch_tokens)
    # A rank with no micro-batch still joins the gradient reduction, with a zero-weighted pass.
    mine, weight = (packs[rank::world], 1.0) if packs[rank::world] else ([[0]], 0.0)
    normalizer = max(1, sum(row.trained_tokens for row in rows))
    loss_sum, tokens, trained = 0.0, 0, 0
    finite = True
    engine.train()
    for number, pack in enumerate(mine):
        batch = rows_batch([rows[i] for i in pack])
        batch = replace(batch, temperatures=torch.ones_like(batch.temperatures)).to(engine.device)
        engine.set_gradient_accumulation_boundary(number == len(mine) - 1)
        logprobs = token_logprobs(engine, batch, trained_only=True)
        loss = -(logprobs * batch.loss_mask).sum() * (weight / normalizer)
        # DeepSpeed averages gradients over ranks: the world size makes it the batch's mean.
        engine.backward(loss * world, scale_wrt_gas=False)
        value = float(loss.detach())
        finite = finite and math.isfinite(value)
        loss_sum += value
        tokens += batch.tokens if weight else 0
        trained += int(batch.loss_mask.sum()) if weight else 0
    stepped = step_if_finite(engine, finite)
    loss_sum, tokens, trained = sum_across_ranks([loss_sum, float(tokens), float(trained)])
    stats = batch_stats(
        trajectories, tokens=int(tokens), trained_tokens=int(trained), loss=loss_sum,
        seconds=time.perf_counter() - started,
    )  # fmt: skip
    return StepResult(stats, skipped=not stepped)
