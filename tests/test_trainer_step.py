"""Optimiser steps with DeepSpeed on the tiny model: rewarded tokens become more likely."""

from __future__ import annotations

from pathlib import Path

import pytest

from asearcher.trainer.policy.objective import ObjectiveConfig
from asearcher.trainer.policy.sequences import rows_batch, token_logprobs, training_rows
from asearcher.trainer.policy.step import train_on_batch
from asearcher.trainer.runtime.deepspeed_setup import full_state_dict
from tests.support.trainer import rewarded_groups, tail_logprob, tiny_model_dir
from tests.support.trainer_engine import (
    engine_for,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("trainer"))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_steps_raise_the_logprob_of_rewarded_tokens(model_dir: Path, stage: int) -> None:
    engine = engine_for(model_dir, stage)
    groups, good, bad = rewarded_groups(engine.module, groups=4)
    before = [tail_logprob(engine.module, t) for t in good + bad]
    results = [
        train_on_batch(engine, groups, ObjectiveConfig(), micro_batch_tokens=40) for _ in range(3)
    ]
    after = [tail_logprob(engine.module, t) for t in good + bad]
    gains = [a - b for a, b in zip(after, before, strict=True)]
    assert all(g > 0 for g in gains[:4]), gains
    assert all(g < 0 for g in gains[4:]), gains
    assert results[0].stats.samples == 8 and results[0].stats.trained_tokens == 8 * 6
    assert results[0].stats.reward_mean == 0.5
    state = full_state_dict(engine)
    assert "model.embed_tokens.weight" in state and state["model.embed_tokens.weight"].numel() > 0


def test_a_step_trains_each_sequence_of_a_trajectory_as_its_own_row(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import msgspec

    from asearcher.trainer.policy import step as step_module

    lengths: list[int] = []

    def recording(rows):
        lengths.extend(row.length for row in rows)
        return rows_batch(rows)

    monkeypatch.setattr(step_module, "rows_batch", recording)

    engine = engine_for(model_dir, stage=0)
    groups, good, _ = rewarded_groups(engine.module, groups=2)
    # The winner of g0 again as a second sequence of itself: twice the rows, twice the tokens.
    first = good[0]
    doubled = msgspec.structs.replace(
        first,
        token_ids=first.token_ids * 2, logprobs=first.logprobs * 2, loss_mask=first.loss_mask * 2,
        token_versions=first.token_versions * 2, sequence_starts=[len(first.token_ids)],
    )  # fmt: skip
    groups[0].trajectories[0] = doubled
    before = tail_logprob(engine.module, first)
    result = train_on_batch(engine, groups, ObjectiveConfig(), micro_batch_tokens=40)
    assert result.stats.samples == 4 and result.stats.trained_tokens == 5 * 6
    assert result.stats.tokens == 5 * 18  # rows of 18 tokens: the doubled trajectory counts twice
    assert not result.skipped and tail_logprob(engine.module, first) > before
    assert lengths == [18] * 5  # no row spans two sequences


def test_minibatches_step_once_each_against_the_policy_before_the_batch(model_dir: Path) -> None:
    """With one minibatch the proximal policy is the one trained: no token can be clipped.
    With two, the second steps against the log-probs taken before the first update, which
    moved the policy: its ratios leave a narrow trust region and tokens are clipped."""
    narrow = {"clip_eps": 0.01}
    one = engine_for(model_dir, stage=0)
    groups, good, bad = rewarded_groups(one.module, groups=4)
    single = train_on_batch(one, groups, ObjectiveConfig(**narrow), micro_batch_tokens=40)
    assert single.stats.clip_fraction == 0.0 and one.global_steps == 1

    two = engine_for(model_dir, stage=0)
    groups, good, bad = rewarded_groups(two.module, groups=4)
    before = [tail_logprob(two.module, t) for t in good + bad]
    split = train_on_batch(
        two, groups, ObjectiveConfig(**narrow, minibatches=2), micro_batch_tokens=40
    )
    after = [tail_logprob(two.module, t) for t in good + bad]
    assert two.global_steps == 2 and not split.skipped
    assert 0.0 < split.stats.clip_fraction <= 0.5  # only the second half can be clipped
    assert split.stats.samples == 8 and split.stats.trained_tokens == 8 * 6
    gains = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(gains[:4]) > 0 > sum(gains[4:]), gains


def test_minibatches_split_by_trajectory_into_parts_of_about_equal_tokens() -> None:
    from asearcher.trainer.policy.sequences import Row
    from asearcher.trainer.policy.step import split_rows
    from tests.support.trainer import completion

    trajectories = [completion([1] * 4, [2] * n, 1.0, "g", 1) for n in (6, 6, 6, 6, 12, 12)]
    rows = [Row(t, 0, len(t.token_ids), 0.0) for t in trajectories]
    rows.insert(1, Row(trajectories[0], 0, len(trajectories[0].token_ids), 0.0))  # a 2nd sequence
    assert split_rows(rows, 1) == [list(range(7))]
    parts = split_rows(rows, 2)
    assert [i for part in parts for i in part] == list(range(7))  # every row once, in order
    assert parts[0][:2] == [0, 1]  # a trajectory's sequences stay together
    tokens = [sum(rows[i].trained_tokens for i in part) for part in parts]
    assert len(parts) == 2 and abs(tokens[0] - tokens[1]) <= 12
    assert len(split_rows(rows[:2], 4)) == 1  # one trajectory: one part
    with pytest.raises(ValueError, match="minibatches"):
        ObjectiveConfig(minibatches=0)


def _short_winner_long_loser(model) -> list:
    from asearcher.trainer.policy.batching import Group
    from tests.support.trainer import completion, with_behaviour_logprobs

    prompt, size = list(range(1, 13)), 2
    winner = with_behaviour_logprobs(model, completion(prompt, [7] * 6, 1.0, "g", size))
    loser = with_behaviour_logprobs(model, completion(prompt, [9] * 18, 0.0, "g", size))
    return [Group(group_id="g", trajectories=[winner, loser])]


@pytest.mark.parametrize("average", ["tokens", "sequences"])
def test_the_loss_averages_over_tokens_or_over_sequences(model_dir: Path, average: str) -> None:
    """At the first step every ratio is 1, so the loss is minus the mean advantage: over the
    batch's tokens it is 0 (advantages are normalised over tokens); over sequences the short
    winner counts as much as the long loser, and the loss is minus the mean of their two."""
    from asearcher.trainer.policy.objective import normalise_by_tokens, token_moments

    engine = engine_for(model_dir, stage=0)
    groups = _short_winner_long_loser(engine.module)
    result = train_on_batch(
        engine, groups, ObjectiveConfig(loss_average=average), micro_batch_tokens=80
    )
    normalised = normalise_by_tokens([0.5, -0.5], token_moments([0.5, -0.5], [6, 18]))
    expected = 0.0 if average == "tokens" else -sum(normalised) / 2
    assert expected == 0.0 or expected < -0.5
    assert result.stats.loss == pytest.approx(expected, abs=1e-3)
    assert result.stats.trained_tokens == 24 and not result.skipped


def test_sequence_mean_scales_make_the_token_mean_a_mean_of_sequences() -> None:
    from asearcher.trainer.policy.objective import sequence_mean_scales

    tokens, advantages = [4, 12, 0], [1.0, -0.5, 5.0]
    scales = sequence_mean_scales(tokens)
    weighted = [n * a * s for n, a, s in zip(tokens, advantages, scales, strict=True)]
    token_mean = sum(weighted) / sum(tokens)
    assert scales[2] == 0.0  # a trajectory with nothing trained adds nothing
    assert token_mean == pytest.approx((1.0 - 0.5 + 0.0) / 3)
    with pytest.raises(ValueError, match="loss_average"):
        ObjectiveConfig(loss_average="words")  # type: ignore[arg-type]


@pytest.mark.parametrize("stage", [0, 3])
def test_an_engine_runs_the_output_layer_at_trained_positions_unless_it_shards_parameters(
    model_dir: Path, stage: int
) -> None:
    engine = engine_for(model_dir, stage)
    groups, _, _ = rewarded_groups(engine.module, groups=1)
    rows = training_rows(groups[0].trajectories, [1.0] * len(groups[0].trajectories))
    batch = rows_batch(rows)
    head_rows: list[int] = []
    hook = engine.module.get_output_embeddings().register_forward_hook(
        lambda _m, args, _out: head_rows.append(args[0].shape[:-1].numel())
    )
    try:
        token_logprobs(engine, batch, trained_only=True)
    finally:
        hook.remove()
    trained, every = int(batch.loss_mask.sum()), batch.token_ids.numel()
    # ZeRO-3 gathers its shards in the engine's own forward: that path runs every position.
    assert head_rows == ([trained] if stage == 0 else [every])
    assert trained < every
