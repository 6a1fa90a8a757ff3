"""The decoupled PPO loss and GRPO advantages against hand-computed values."""

from __future__ import annotations

import math

import msgspec
import pytest
import torch

from asearcher.trainer.policy.objective import (
    LossStats,
    ObjectiveConfig,
    decoupled_ppo_loss,
    group_advantages,
    normalise_by_tokens,
    token_advantages,
    token_moments,
)

LN = math.log
NO_CAP = ObjectiveConfig(clip_eps=0.2, behaviour_weight_cap=None)


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def loss_of(
    log_ratio: list[float],
    advantages: list[float],
    behaviour_gap: list[float] | None = None,
    mask: list[int] | None = None,
    config: ObjectiveConfig = NO_CAP,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, LossStats, torch.Tensor]:
    """The loss for tokens given by log(ratio) and log(behaviour weight); also the logprobs leaf."""
    n = len(log_ratio)
    proximal = t(*[-1.0 - 0.25 * i for i in range(n)])  # arbitrary, only differences matter
    logprobs = (proximal + t(*log_ratio)).requires_grad_()
    behaviour = proximal - t(*(behaviour_gap or [0.0] * n))
    loss_mask = torch.tensor(mask or [1] * n)
    loss, stats = decoupled_ppo_loss(
        logprobs, proximal, behaviour, t(*advantages), loss_mask, config, normalizer
    )
    return loss, stats, logprobs


# --- the loss ------------------------------------------------------------------------------------


def test_loss_clips_positive_and_negative_advantages_by_hand():
    # ε = 0.2, behaviour = proximal (w = 1). Per token, pg = max(-A·r, -A·clip(r, 0.8, 1.2)):
    #   r=1.5 A=+1: max(-1.5, -1.2) = -1.2  (clipped term chosen)
    #   r=0.5 A=+1: max(-0.5, -0.8) = -0.5
    #   r=1.5 A=-1: max( 1.5,  1.2) =  1.5
    #   r=0.5 A=-1: max( 0.5,  0.8) =  0.8  (clipped term chosen)
    # sum = 0.6, token mean over 4 tokens = 0.15; clip fraction 2/4;
    # mean ratio (1.5 + 0.5 + 1.5 + 0.5) / 4 = 1.
    loss, stats, _ = loss_of([LN(1.5), LN(0.5), LN(1.5), LN(0.5)], [1.0, 1.0, -1.0, -1.0])
    assert loss.item() == pytest.approx(0.15, abs=1e-6)
    assert stats.loss == pytest.approx(0.15, abs=1e-6)
    assert stats.clip_fraction == pytest.approx(0.5)
    assert stats.mean_ratio == pytest.approx(1.0, abs=1e-6)
    assert stats.capped_fraction == 0.0
    assert stats.tokens == 4


def test_loss_scales_tokens_by_behaviour_weight_by_hand():
    # r = 1 everywhere, so pg = -A: [-1, 2, -0.5]. Behaviour weights w = exp(prox - behav) =
    # [2, 0.5, 4] (all under the cap of 5) give [-2, 1, -2]; sum -3 over 3 tokens = -1.
    config = ObjectiveConfig(clip_eps=0.2, behaviour_weight_cap=5.0)
    loss, stats, _ = loss_of(
        [0.0, 0.0, 0.0], [1.0, -2.0, 0.5], [LN(2), LN(0.5), LN(4)], None, config
    )
    assert loss.item() == pytest.approx(-1.0, abs=1e-6)
    assert stats.capped_fraction == 0.0
    assert stats.clip_fraction == 0.0


def test_loss_masks_tokens_over_the_cap_but_keeps_them_in_the_mean():
    # A = 1, r = 1, so pg = -1; w = [2, 6, 4]. Cap 5 drops the middle token: (-2 + -4) / 3 = -2
    # (the token mean stays over the loss mask, as in AReaL). Without a cap: (-2-6-4)/3 = -4.
    capped = ObjectiveConfig(clip_eps=0.2, behaviour_weight_cap=5.0)
    gaps = [LN(2), LN(6), LN(4)]
    loss, stats, _ = loss_of([0.0] * 3, [1.0] * 3, gaps, None, capped)
    assert loss.item() == pytest.approx(-2.0, abs=1e-5)
    assert stats.capped_fraction == pytest.approx(1 / 3)
    assert stats.tokens == 3
    uncapped, stats, _ = loss_of([0.0] * 3, [1.0] * 3, gaps, None, NO_CAP)
    assert uncapped.item() == pytest.approx(-4.0, abs=1e-5)
    assert stats.capped_fraction == 0.0


def test_loss_keeps_token_just_under_the_cap():
    # w just under 5 with cap 5 is kept: pg·w ≈ -1·5, over 1 token.
    config = ObjectiveConfig(behaviour_weight_cap=5.0)
    loss, stats, _ = loss_of([0.0], [1.0], [LN(5.0) - 1e-7], None, config)
    assert loss.item() == pytest.approx(-5.0, abs=1e-4)
    assert stats.capped_fraction == 0.0


def test_loss_ignores_tokens_outside_the_mask_even_with_garbage_values():
    # Mask [1, 0, 1, 0]. Kept: r=1.5 A=+1 -> -1.2; r=1 A=-1 -> 1. Sum -0.2 over 2 tokens = -0.1.
    # The masked-out tokens hold values that would dominate (or be inf/NaN) if they leaked in.
    proximal = t(-1.0, -1.0, -2.0, -1.0)
    logprobs = t(-1.0 + LN(1.5), 30.0, -2.0, -math.inf).requires_grad_()
    behaviour = t(-1.0, -math.inf, -2.0, -50.0)
    advantages = t(1.0, 100.0, -1.0, 5.0)
    loss_mask = torch.tensor([1, 0, 1, 0])
    loss, stats = decoupled_ppo_loss(
        logprobs, proximal, behaviour, advantages, loss_mask, ObjectiveConfig()
    )
    assert loss.item() == pytest.approx(-0.1, abs=1e-6)
    assert stats.tokens == 2
    assert stats.clip_fraction == pytest.approx(0.5)
    assert stats.capped_fraction == 0.0
    loss.backward()
    assert torch.isfinite(logprobs.grad).all()
    assert logprobs.grad[1].item() == 0.0 and logprobs.grad[3].item() == 0.0


def test_loss_gradient_stays_finite_when_a_capped_token_has_infinite_weight():
    # Behaviour log-prob -inf gives w = inf: capped, so only the other token counts: -1 / 2.
    proximal = t(-1.0, -1.0)
    logprobs = proximal.clone().requires_grad_()
    behaviour = t(-math.inf, -1.0)
    mask = torch.tensor([1, 1])
    loss, stats = decoupled_ppo_loss(
        logprobs, proximal, behaviour, t(1.0, 1.0), mask, ObjectiveConfig()
    )
    loss.backward()
    assert loss.item() == pytest.approx(-0.5, abs=1e-6)
    assert stats.capped_fraction == pytest.approx(0.5)
    assert logprobs.grad.tolist() == pytest.approx([0.0, -0.5], abs=1e-6)


def test_loss_with_explicit_normalizer_divides_the_sum_by_it():
    # Same tokens as the clipping case: sum 0.6, over normalizer 10 = 0.06.
    loss, _, _ = loss_of(
        [LN(1.5), LN(0.5), LN(1.5), LN(0.5)], [1.0, 1.0, -1.0, -1.0], normalizer=10.0
    )
    assert loss.item() == pytest.approx(0.06, abs=1e-6)


def test_loss_split_into_micro_batches_with_batch_normalizer_equals_whole_batch():
    log_ratio = [LN(1.5), LN(0.5), LN(1.1), LN(0.9), 0.3, -0.2]
    advantages = [1.0, 1.0, -1.0, -1.0, 0.5, -2.0]
    gaps = [0.1, -0.3, 0.0, 0.5, 0.2, -0.1]
    mask = [1, 1, 0, 1, 1, 1]  # 5 tokens in the whole batch's mask
    whole, _, whole_logp = loss_of(log_ratio, advantages, gaps, mask)
    whole.backward()
    first, _, first_logp = loss_of(log_ratio[:3], advantages[:3], gaps[:3], mask[:3], normalizer=5)
    second, _, second_logp = loss_of(
        log_ratio[3:], advantages[3:], gaps[3:], mask[3:], normalizer=5
    )
    (first + second).backward()
    assert (first + second).item() == pytest.approx(whole.item(), abs=1e-6)
    split_grad = torch.cat([first_logp.grad, second_logp.grad])
    assert torch.allclose(split_grad, whole_logp.grad, atol=1e-7)


def test_loss_gradient_raises_logprob_of_positive_advantage_token():
    # Inside the trust region d(loss)/d(logp) = -A·r·w / N: here -(1)(1)(1)/2 = -0.5 for A = +1
    # and -(-1)(1)(1)/2 = +0.5 for A = -1; a descent step raises the first token's logprob.
    loss, _, logprobs = loss_of([0.0, 0.0], [1.0, -1.0])
    loss.backward()
    assert logprobs.grad.tolist() == pytest.approx([-0.5, 0.5], abs=1e-6)
    with torch.no_grad():
        higher, _, _ = loss_of([0.1, 0.0], [1.0, -1.0])
    assert higher.item() < loss.item()


def test_loss_gradient_is_zero_on_clipped_tokens():
    # r = 1.5 with A = +1 uses the constant clipped term 1.2: no gradient; r = 1 with A = +1
    # gets -1/2. The behaviour weight 2 on the second token doubles it: -1.
    loss, _, logprobs = loss_of([LN(1.5), 0.0], [1.0, 1.0], [0.0, LN(2)])
    loss.backward()
    assert logprobs.grad.tolist() == pytest.approx([0.0, -1.0], abs=1e-6)


def test_loss_accepts_batch_by_sequence_tensors():
    # The clipping case laid out as [2, 2]: same 0.15.
    proximal = t(-1.0, -1.0, -1.0, -1.0).view(2, 2)
    logprobs = (proximal + t(LN(1.5), LN(0.5), LN(1.5), LN(0.5)).view(2, 2)).requires_grad_()
    advantages = t(1.0, 1.0, -1.0, -1.0).view(2, 2)
    mask = torch.ones(2, 2, dtype=torch.bool)
    loss, stats = decoupled_ppo_loss(logprobs, proximal, proximal, advantages, mask, NO_CAP)
    assert loss.item() == pytest.approx(0.15, abs=1e-6)
    assert stats.tokens == 4


def test_loss_with_empty_mask_is_zero():
    loss, stats, _ = loss_of([0.5, -0.5], [1.0, -1.0], mask=[0, 0])
    assert loss.item() == 0.0
    assert stats.tokens == 0 and stats.clip_fraction == 0.0


def test_loss_with_kl_coef_adds_k3_term_by_hand():
    # d = ref - logp = -ln 2 on one token: k3 = e^d - d - 1 = 0.5 + ln 2 - 1 ≈ 0.193147.
    # pg = -A·r = 0 (A = 0), so loss = 0.1 · 0.193147 / 1.
    config = ObjectiveConfig(kl_coef=0.1)
    logprobs = t(-1.0).requires_grad_()
    reference = t(-1.0 - LN(2))
    args = (logprobs, t(-1.0), t(-1.0), t(0.0), torch.tensor([1]), config)
    loss, _ = decoupled_ppo_loss(*args, reference_logprobs=reference)
    assert loss.item() == pytest.approx(0.1 * (0.5 + LN(2) - 1), abs=1e-6)
    with pytest.raises(ValueError, match="reference_logprobs"):
        decoupled_ppo_loss(*args)


def test_loss_rejects_mismatched_shapes_and_bad_normalizer():
    with pytest.raises(ValueError, match="one shape"):
        decoupled_ppo_loss(t(0.0, 0.0), t(0.0), t(0.0), t(0.0), torch.tensor([1]), NO_CAP)
    with pytest.raises(ValueError, match="normalizer"):
        loss_of([0.0], [1.0], normalizer=0.0)


# --- advantages ----------------------------------------------------------------------------------


def test_group_advantages_with_std_by_hand():
    # rewards [1, 0, 0, 0]: mean 0.25, centred [0.75, -0.25, -0.25, -0.25],
    # population variance (0.5625 + 3·0.0625) / 4 = 0.1875, std = √3/4 ≈ 0.4330.
    # 0.75 / 0.4330 = √3, -0.25 / 0.4330 = -1/√3.
    advantages = group_advantages([1.0, 0.0, 0.0, 0.0])
    root3 = math.sqrt(3)
    assert advantages == pytest.approx([root3, -1 / root3, -1 / root3, -1 / root3], abs=1e-4)


def test_group_advantages_without_std_is_centred_reward():
    assert group_advantages([1.0, 0.0, 0.0, 0.0], divide_by_std=False) == pytest.approx(
        [0.75, -0.25, -0.25, -0.25]
    )


def test_group_advantages_flat_group_is_all_zeros():
    assert group_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]
    assert group_advantages([0.3, 0.3, 0.3], divide_by_std=False) == [0.0, 0.0, 0.0]
    assert group_advantages([]) == []


def test_token_moments_weigh_each_value_by_its_tokens():
    # values [1, -2] over 3 and 1 tokens: N = 4, Σ n·a = 3 - 2 = 1, Σ n·a² = 3 + 4 = 7.
    assert token_moments([1.0, -2.0], [3, 1]) == [4.0, 1.0, 7.0]
    assert token_moments([], []) == [0.0, 0.0, 0.0]


def test_normalise_by_tokens_by_hand():
    # moments [4, 1, 7]: mean 1/4, E[a²] = 7/4, biased variance 7/4 - 1/16 = 27/16, std √27/4.
    std = math.sqrt(27) / 4
    assert normalise_by_tokens([1.0, -2.0], [4.0, 1.0, 7.0]) == pytest.approx(
        [0.75 / (std + 1e-5), -2.25 / (std + 1e-5)], abs=1e-12
    )


def test_normalise_by_tokens_equal_values_and_no_tokens_give_zeros():
    # All tokens share one value: variance 0, so (a - mean) / (0 + ε) = 0, not NaN.
    assert normalise_by_tokens([0.5, 0.5], token_moments([0.5, 0.5], [2, 3])) == [0.0, 0.0]
    assert normalise_by_tokens([0.5], [0.0, 0.0, 0.0]) == [0.0]


def test_normalise_by_tokens_uses_epsilon_1e5():
    # Two tokens of ±1e-5: std 1e-5, so a / (std + ε) = ±1/2 with ε = 1e-5.
    values = [1e-5, -1e-5]
    assert normalise_by_tokens(values, token_moments(values, [1, 1])) == pytest.approx(
        [0.5, -0.5], rel=1e-6
    )


def test_token_advantages_follow_the_loss_mask():
    assert token_advantages(0.5, [0, 0, 1, 1, 0, 1]) == [0.0, 0.0, 0.5, 0.5, 0.0, 0.5]


# --- config --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"clip_eps": 0.0}, "clip_eps"),
        ({"clip_eps": 1.0}, "clip_eps"),
        ({"clip_eps": -0.1}, "clip_eps"),
        ({"behaviour_weight_cap": 1.0}, "behaviour_weight_cap"),
        ({"behaviour_weight_cap": 0.5}, "behaviour_weight_cap"),
        ({"kl_coef": -0.01}, "kl_coef"),
        ({"divide_by_std": False}, "divide_by_std"),
        ({"advantages": "group"}, "advantages"),
    ],
)
def test_objective_config_invalid_value_names_the_field(fields, named):
    with pytest.raises(ValueError, match=named):
        ObjectiveConfig(**fields)
    with pytest.raises(msgspec.ValidationError, match=named):
        msgspec.convert(fields, ObjectiveConfig)


def test_objective_config_defaults_and_unknown_field():
    config = ObjectiveConfig()
    assert (config.clip_eps, config.behaviour_weight_cap, config.kl_coef) == (0.2, 5.0, 0.0)
    assert config.advantages == "batch_tokens"
    assert not ObjectiveConfig(advantages="group_std", divide_by_std=False).divide_by_std
    assert ObjectiveConfig(behaviour_weight_cap=None).behaviour_weight_cap is None
    with pytest.raises(msgspec.ValidationError, match="clip_epsilon"):
        msgspec.convert({"clip_epsilon": 0.3}, ObjectiveConfig)
