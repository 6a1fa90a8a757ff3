"""Optimiser steps with DeepSpeed on the tiny model: rewarded tokens become more likely."""

from __future__ import annotations

from pathlib import Path

import pytest

from asearcher.trainer.policy.objective import ObjectiveConfig
from asearcher.trainer.policy.sequences import rows_batch
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
