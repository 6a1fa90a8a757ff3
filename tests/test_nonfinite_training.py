"""A non-finite loss or gradient never reaches the optimiser; NaN weights are never published."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import torch

import asearcher.trainer.policy.step as step_module
from asearcher.streams.wire.events import TrajectoriesDropped, WeightsPublished
from asearcher.trainer.policy.objective import ObjectiveConfig
from asearcher.trainer.policy.step import train_on_batch
from asearcher.trainer.runtime.deepspeed_setup import full_state_dict
from asearcher.trainer.runtime.service import TrainerService
from asearcher.trainer.runtime.weight_publisher import WeightStore
from tests.support.rollout import FAST_GROUP, events_of
from tests.support.trainer import rewarded_groups, tiny_model_dir
from tests.support.trainer_engine import engine_for
from tests.support.trainer_service import send, trainer_config, trainer_topics


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("nonfinite"))


def snapshot(engine) -> dict[str, torch.Tensor]:
    """Copies: on CPU the state dict's tensors are the live parameters."""
    return {k: v.clone() for k, v in full_state_dict(engine).items()}


def finite(state: dict[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in state.values())


def poisoned_loss(kind: str):
    """The real loss made non-finite in value ("loss") or only in its gradient ("gradient")."""
    real = step_module.decoupled_ppo_loss

    def loss(logprobs, *args, **kwargs):
        value, stats = real(logprobs, *args, **kwargs)
        if kind == "loss":
            return value * float("nan"), msgspec.structs.replace(stats, loss=float("nan"))
        # sqrt'(0) is infinite: the value stays finite, the gradient becomes NaN.
        return value + torch.sqrt(logprobs.sum() * 0.0), stats

    return loss


@pytest.mark.parametrize("kind", ["loss", "gradient"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_step_with_a_non_finite_loss_or_gradient_is_skipped_and_the_weights_stay_finite(
    model_dir: Path, stage: int, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_for(model_dir, stage)
    groups, _, _ = rewarded_groups(engine.module, groups=2)
    before = snapshot(engine)
    with monkeypatch.context() as patch:
        patch.setattr(step_module, "decoupled_ppo_loss", poisoned_loss(kind))
        result = train_on_batch(engine, groups, ObjectiveConfig(), micro_batch_tokens=40)
    after = snapshot(engine)
    assert finite(after) and all(torch.equal(before[k], after[k]) for k in before)
    assert result.skipped

    # The next, healthy step is taken as usual: nothing of the skipped one lingers.
    healthy = train_on_batch(engine, groups, ObjectiveConfig(), micro_batch_tokens=40)
    stepped = full_state_dict(engine)
    assert not healthy.skipped and finite(stepped)
    assert any(not torch.equal(after[k], stepped[k]) for k in after)


def test_trainer_with_an_overflowing_behaviour_weight_skips_the_step_and_announces_nothing(
    settings, codec, make_topic, model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    topics = trainer_topics(make_topic)
    store = WeightStore((tmp_path / "weights").as_uri())
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    groups, _, _ = rewarded_groups(reference, groups=4, seed=21)
    # A behaviour log-prob of -1e30 is finite and <= 0, so intake lets it through; without a
    # cap its importance weight exp(proximal + 1e30) is infinite, and so is the loss.
    winner = groups[0].trajectories[0]
    logprobs = [*winner.logprobs[:-1], -1e30]
    poisoned = [msgspec.structs.replace(winner, logprobs=logprobs), groups[0].trajectories[1],
                *groups[1].trajectories]  # fmt: skip
    send(settings, codec, topics.trajectories, poisoned)
    objective = ObjectiveConfig(behaviour_weight_cap=None)
    config = trainer_config(topics, objective=objective)
    service = TrainerService(settings, codec, config, model_dir, store, **FAST_GROUP)
    initial = snapshot(service.engine)
    try:
        assert service.run(max_steps=1, timeout=15) == 0
        assert service.skipped_steps == 1 and service.version == 0
        kept = full_state_dict(service.engine)
        assert finite(kept) and all(torch.equal(initial[k], kept[k]) for k in initial)
        assert store.versions() == []
        assert not [e for e in events_of(settings, codec, topics.weights)
                    if isinstance(e, WeightsPublished)]  # fmt: skip
        [dropped] = [e for e in events_of(settings, codec, topics.metrics)
                     if isinstance(e, TrajectoriesDropped)]  # fmt: skip
        assert sorted(dropped.dropped_ids) == sorted(t.trajectory_id for t in poisoned)

        # Healthy trajectories afterwards are trained into v1, with finite weights.
        send(settings, codec, topics.trajectories, [t for g in groups[2:] for t in g.trajectories])
        assert service.run(max_steps=1, timeout=120) == 1 and service.version == 1
    finally:
        service.close()
    assert store.versions() == [1] and finite(store_state(store, 1))


def store_state(store: WeightStore, version: int) -> dict[str, torch.Tensor]:
    from asearcher.streams.storage.weight_reader import load_state_dict

    published = store.get(version)
    return load_state_dict(published.uri, published.sha256)[1]


def test_trainer_stops_rather_than_publish_non_finite_weights(
    settings, codec, make_topic, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM

    import asearcher.trainer.runtime.service as service_module

    topics = trainer_topics(make_topic)
    store = WeightStore((tmp_path / "weights").as_uri())
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    groups, _, _ = rewarded_groups(reference, groups=2, seed=22)
    send(settings, codec, topics.trajectories, [t for g in groups for t in g.trajectories])

    def stepped_into_nan(engine, *args, **kwargs):
        # What an optimiser without an overflow check would leave behind.
        result = train_on_batch(engine, *args, **kwargs)
        with torch.no_grad():
            next(engine.module.parameters()).fill_(float("nan"))
        return result

    monkeypatch.setattr(service_module, "train_on_batch", stepped_into_nan)
    service = TrainerService(
        settings, codec, trainer_config(topics), model_dir, store, **FAST_GROUP
    )
    try:
        with pytest.raises(RuntimeError, match="v1 not published: its weights are not finite"):
            service.run(max_steps=1, timeout=120)
    finally:
        service.close()
    assert store.versions() == []
    assert events_of(settings, codec, topics.weights) == []
