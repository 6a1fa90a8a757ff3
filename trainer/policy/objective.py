"""The RL objective: advantages as AReaL computes them and AReaL's decoupled PPO loss.

Advantages (`ObjectiveConfig.advantages`): "batch_tokens", AReaL's default as ASearcher trains,
subtracts each group's mean reward, then normalises over every loss token of the whole batch
(token-weighted mean and biased variance, float64, summed over data-parallel ranks, ε = 1e-5):
a trajectory with more trained tokens weighs more, and the normaliser is shared by all groups.
"group_std" divides each group's centred rewards by the group's std instead (plain GRPO).

Inputs are per-token tensors the trainer assembles for a micro-batch: log-probs of the policy being
trained (with grad), proximal log-probs (the same weights recomputed before the step, constants),
behaviour log-probs (what the rollout engine reported when it sampled, from `TrajectoryFinished`),
token advantages and the loss mask. The output is a scalar loss and `LossStats` for logging.

The decoupled objective (AReaL, "fully asynchronous RL") separates two policies that plain PPO
conflates: the PPO trust region is taken around the *proximal* policy, while the off-policy gap
between the proximal and the *behaviour* policy (a sample may be up to η versions old) is corrected
by an importance weight that never carries gradient; tokens whose weight exceeds a cap are dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Literal, get_args

import msgspec
from msgspec import Meta

if TYPE_CHECKING:
    import torch  # imported where a loss is computed: the CLI loads this config without torch

AdvantageMode = Literal["batch_tokens", "group_std"]
LossAverage = Literal["tokens", "sequences"]


class ObjectiveConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Settings of the decoupled PPO objective."""

    clip_eps: Annotated[
        float,
        Meta(description="PPO clipping ε around the proximal policy (the paper's configs: 0.4)"),
    ] = 0.2
    behaviour_weight_cap: Annotated[
        float | None,
        Meta(
            description=(
                "Tokens with exp(proximal - behaviour) above this are masked out; None "
                "disables the cap."
            )
        ),
    ] = 5.0
    advantages: Annotated[
        AdvantageMode,
        Meta(
            description=(
                '"batch_tokens": group-centred rewards normalised over the batch\'s loss '
                'tokens (AReaL\'s default); "group_std": group-centred rewards over the '
                "group's std (see `divide_by_std`)."
            )
        ),
    ] = "batch_tokens"
    divide_by_std: Annotated[
        bool, Meta(description='"group_std" only: false leaves the group-centred rewards as is')
    ] = True
    kl_coef: Annotated[
        float, Meta(description="k3 KL penalty to a reference policy; 0 = none, as in the paper")
    ] = 0.0
    minibatches: Annotated[
        int,
        Meta(
            description=(
                "optimiser steps per batch (AReaL's ppo_n_minibatches): the batch split into this"
                " many parts of about equal tokens, each a step against the proximal log-probs"
                " taken before the first; 1: one step, the proximal policy the current one"
            )
        ),
    ] = 1
    loss_average: Annotated[
        LossAverage,
        Meta(
            description=(
                "\"tokens\": the loss is the mean over the batch's trained tokens (AReaL's), so a"
                ' longer trajectory weighs more; "sequences": each trajectory\'s token mean, then'
                " the mean over trajectories (GRPO's), so every trajectory weighs the same"
            )
        ),
    ] = "tokens"

    def __post_init__(self) -> None:
        if not 0.0 < self.clip_eps < 1.0:
            raise ValueError(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        cap = self.behaviour_weight_cap
        if cap is not None and not cap > 1.0:
            raise ValueError(f"behaviour_weight_cap must be > 1 or None, got {cap}")
        if self.advantages not in get_args(AdvantageMode):
            raise ValueError(
                f"advantages must be batch_tokens or group_std, got {self.advantages!r}"
            )
        if self.advantages == "batch_tokens" and not self.divide_by_std:
            raise ValueError("divide_by_std = false needs advantages = 'group_std'")
        if not self.kl_coef >= 0.0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.minibatches < 1:
            raise ValueError(f"minibatches must be at least 1, got {self.minibatches}")
        if self.loss_average not in get_args(LossAverage):
            raise ValueError(f"loss_average must be tokens or sequences, got {self.loss_average!r}")


class LossStats(msgspec.Struct):
    """What one loss evaluation did, over the tokens of the loss mask."""

    loss: float  # the returned loss value
    clip_fraction: float  # share of tokens whose clipped term was the one used
    capped_fraction: float  # share of tokens masked out by the behaviour-weight cap
    mean_ratio: float  # mean of exp(logprobs - proximal)
    tokens: int  # tokens in the loss mask


def group_advantages(
    rewards: Sequence[float], divide_by_std: bool = True, eps: float = 1e-6
) -> list[float]:
    """GRPO advantages of one group: reward minus the group mean, over (population std + eps)."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    centred = [reward - mean for reward in rewards]
    if not divide_by_std:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / len(centred))
    return [c / (std + eps) for c in centred]


BATCH_NORM_EPS = 1e-5  # AReaL's masked_normalization


def token_moments(values: Sequence[float], tokens: Sequence[int]) -> list[float]:
    """[N, Σ n·a, Σ n·a²] of per-sequence `values` a weighted by their loss `tokens` n: the sums
    a rank contributes to the batch's token mean and variance (add them across ranks)."""
    count = float(sum(tokens))
    total = math.fsum(n * a for a, n in zip(values, tokens, strict=True))
    squares = math.fsum(n * a * a for a, n in zip(values, tokens, strict=True))
    return [count, total, squares]


def normalise_by_tokens(
    values: Sequence[float], moments: Sequence[float], eps: float = BATCH_NORM_EPS
) -> list[float]:
    """`values` minus the token mean, over (the biased token std + eps), from summed moments."""
    count, total, squares = moments
    if count <= 0:
        return [0.0 for _ in values]
    mean = total / count
    # E[a²] - E[a]² as AReaL computes it; clamped since rounding can leave it just below 0.
    variance = max(squares / count - mean * mean, 0.0)
    return [(value - mean) / (math.sqrt(variance) + eps) for value in values]


def sequence_mean_scales(trained_tokens: Sequence[int]) -> list[float]:
    """Per trajectory, the factor on its advantages that turns a token mean over all of them
    into the mean of each one's token mean: total tokens / (trajectories · its tokens)."""
    total, count = sum(trained_tokens), len(trained_tokens)
    return [total / (count * tokens) if tokens else 0.0 for tokens in trained_tokens]


def token_advantages(advantage: float, loss_mask: Sequence[int]) -> list[float]:
    """One trajectory's advantage on each token in its loss mask, 0 on the others."""
    return [advantage if mask else 0.0 for mask in loss_mask]


def decoupled_ppo_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: ObjectiveConfig,
    normalizer: float | None = None,
    reference_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """AReaL's decoupled PPO loss, summed over the loss mask and divided by `normalizer`.

    Per token: ratio = exp(logprobs - proximal), pg = max(-A·ratio, -A·clip(ratio, 1±ε)), scaled by
    the behaviour weight w = exp(proximal - behaviour); tokens with w > cap are left out. All
    tensors share one shape; only `logprobs` carries grad. `normalizer` defaults to the number of
    tokens in the loss mask (a token mean); pass the whole batch's count when the batch is split
    into micro-batches so that their gradients add up to the batch's token mean. With
    `config.kl_coef > 0`, `reference_logprobs` must be given and a k3 KL term is added.
    """
    import torch

    _check_shapes(logprobs, proximal_logprobs, behaviour_logprobs, advantages, loss_mask)
    mask = loss_mask.bool()
    tokens = int(mask.sum().item())
    if normalizer is None:
        normalizer = float(max(tokens, 1))
    elif not normalizer > 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer}")

    # float32 even when the model runs in bf16: a bf16 log-ratio is too coarse for clipping.
    logp = logprobs.float()
    proximal = proximal_logprobs.detach().float()
    behaviour = behaviour_logprobs.detach().float()
    adv = torch.where(mask, advantages.detach().float(), 0.0)

    # Zero the log-ratios off the mask *before* exp(): padding may hold anything, and an inf there
    # would turn into NaN gradients even behind a torch.where.
    ratio = torch.exp(torch.where(mask, logp - proximal, 0.0))
    clipped = torch.clamp(ratio, 1.0 - config.clip_eps, 1.0 + config.clip_eps)
    unclipped_term, clipped_term = -adv * ratio, -adv * clipped
    pg = torch.maximum(unclipped_term, clipped_term)

    weight = torch.exp(torch.where(mask, proximal - behaviour, 0.0))
    kept = (
        mask
        if config.behaviour_weight_cap is None
        else mask & (weight <= config.behaviour_weight_cap)
    )
    # Zero the weights of dropped tokens before multiplying: 0 · inf in the backward pass is NaN.
    loss = (pg * torch.where(kept, weight, 0.0)).sum() / normalizer
    if config.kl_coef > 0:
        loss = loss + config.kl_coef * _k3_kl(logp, reference_logprobs, mask) / normalizer

    stats = _stats(loss, mask, kept, ratio, clipped_term > unclipped_term, tokens)
    return loss, stats


def _check_shapes(*tensors: torch.Tensor) -> None:
    shapes = {tuple(tensor.shape) for tensor in tensors}
    if len(shapes) != 1:
        raise ValueError(f"decoupled_ppo_loss needs tensors of one shape, got {sorted(shapes)}")


def _k3_kl(logp: torch.Tensor, reference: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
    """Masked sum of the k3 estimator of KL(policy ‖ reference): e^d - d - 1, d = ref - logp."""
    import torch

    if reference is None:
        raise ValueError("kl_coef > 0 needs reference_logprobs")
    delta = torch.where(mask, reference.detach().float() - logp, 0.0)
    return (torch.exp(delta) - delta - 1.0).sum()


def _stats(
    loss: torch.Tensor,
    mask: torch.Tensor,
    kept: torch.Tensor,
    ratio: torch.Tensor,
    clip_chosen: torch.Tensor,
    tokens: int,
) -> LossStats:
    import torch

    # Shares are over the loss mask (AReaL's convention), so capped tokens count in the denominator.
    denominator = max(tokens, 1)
    with torch.no_grad():
        return LossStats(
            loss=float(loss.item()),
            clip_fraction=int((clip_chosen & mask).sum().item()) / denominator,
            capped_fraction=int((mask & ~kept).sum().item()) / denominator,
            mean_ratio=float(torch.where(mask, ratio, 0.0).sum().item()) / denominator,
            tokens=tokens,
        )
