"""The trainer service over Kafka: versions, drops, the ledger, and the weights it announces."""

from __future__ import annotations

import signal
import subprocess
import uuid
from pathlib import Path

import msgspec
import pytest
import torch

from asearcher.streams.storage.weight_reader import load_state_dict
from asearcher.streams.wire.events import TrainerStepFinished, TrajectoryFinished, WeightsPublished
from asearcher.trainer.runtime.config import TrainerTopics
from asearcher.trainer.runtime.deepspeed_setup import full_state_dict
from asearcher.trainer.runtime.service import TrainerService
from asearcher.trainer.runtime.weight_publisher import WeightStore
from tests.conftest import DISTRIBUTED_VARIABLES, worker_command
from tests.support.rollout import FAST_GROUP, events_of
from tests.support.trainer import completion, rewarded_groups, tiny_model_dir
from tests.support.trainer_service import (
    send,
    sent_groups,
    trainer_config,
    trainer_topics,
)
from tests.support.waiting import wait_for


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("trainer-service"))


def reversioned(trajectory: TrajectoryFinished, version: int) -> TrajectoryFinished:
    versions = [version if v >= 0 else v for v in trajectory.token_versions]
    return msgspec.structs.replace(trajectory, token_versions=versions)


def test_steps_publish_versions_drop_flat_and_stale_and_keep_a_ledger(
    settings, codec, make_topic, model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    topics = trainer_topics(make_topic)
    store = WeightStore((tmp_path / "weights").as_uri())
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    groups, _, _ = rewarded_groups(reference, groups=6, seed=3)
    first = [t for g in groups[:4] for t in g.trajectories]  # two steps at v0 data
    send(settings, codec, topics.trajectories, first)
    service = TrainerService(
        settings, codec, trainer_config(topics, drop_stale=True), model_dir, store, **FAST_GROUP
    )
    assert service.run(max_steps=2, timeout=120) == 2 and service.version == 2

    prompt = groups[0].trajectories[0].token_ids[:12]
    flat = [completion(prompt, [5, 6], 1.0, "flat", 2, version=2) for _ in range(2)]
    stale = [t for t in groups[4].trajectories]  # v0 tokens: 2 - 0 > eta = 1
    fresh = [reversioned(t, 2) for g in groups[5:] for t in g.trajectories]
    later = [reversioned(t, 2) for t in groups[0].trajectories]  # a new group id below
    later = [msgspec.structs.replace(t, group_id="again", trajectory_id=uuid.uuid4().hex)
             for t in later]  # fmt: skip
    send(settings, codec, topics.trajectories, flat + stale + fresh + later)
    assert service.run(max_steps=1, timeout=120) == 1 and service.version == 3
    final_state = full_state_dict(service.engine)
    service.close()

    steps = [e for e in events_of(settings, codec, topics.metrics)]
    assert [s.version for s in steps] == [1, 2, 3]
    assert all(isinstance(s, TrainerStepFinished) for s in steps)
    last = steps[-1]
    assert last.dropped_flat_groups == 1 and last.dropped_stale == 2 and last.late_samples == 0
    assert last.flat_groups == ["flat"]  # named, for the feeder to pass its question over
    assert last.dropped_small_groups == 1  # the stale group, left empty
    everything = {t.trajectory_id for t in first + flat + stale + fresh + later}
    trained = [tid for s in steps for tid in s.trained_ids]
    dropped = [tid for s in steps for tid in s.dropped_ids]
    assert len(trained) == len(set(trained)) == 12
    assert set(trained) | set(dropped) == everything and not set(trained) & set(dropped)

    announced = [e for e in events_of(settings, codec, topics.weights)]
    assert [w.version for w in announced if isinstance(w, WeightsPublished)] == [1, 2, 3]
    assert store.versions() == [1, 2, 3]
    for event in announced:
        manifest = store.get(event.version).manifest
        assert sorted(manifest.trained_ids) == sorted(steps[event.version - 1].trained_ids)
    _, loaded = load_state_dict(announced[-1].uri, announced[-1].sha256)
    assert all(torch.equal(loaded[name], final_state[name]) for name in loaded)
    assert not torch.equal(
        loaded["model.embed_tokens.weight"], reference.state_dict()["model.embed_tokens.weight"]
    )


def test_a_trajectory_finishing_eta_plus_2_versions_late_is_trained_not_dropped(
    settings, codec, make_topic, model_dir: Path, tmp_path: Path
) -> None:
    """AReaL bounds staleness where rollouts start; a late trajectory is trained with the
    decoupled objective's importance weights (behaviour logprobs of v0, proximal of now)."""
    from transformers import AutoModelForCausalLM

    topics = trainer_topics(make_topic)
    store = WeightStore((tmp_path / "weights").as_uri())
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    groups, _, _ = rewarded_groups(reference, groups=8, seed=5)
    send(settings, codec, topics.trajectories, [t for g in groups[:6] for t in g.trajectories])
    config = trainer_config(topics)
    service = TrainerService(settings, codec, config, model_dir, store, **FAST_GROUP)
    assert service.run(max_steps=3, timeout=180) == 3 and service.version == 3

    late = groups[6].trajectories  # v0 tokens at trainer v3: staleness 3 = eta (1) + 2
    fresh = [reversioned(t, 3) for t in groups[7].trajectories]
    send(settings, codec, topics.trajectories, late + fresh)
    assert service.run(max_steps=1, timeout=120) == 1 and service.version == 4
    service.close()

    last = [e for e in events_of(settings, codec, topics.metrics)][-1]
    assert isinstance(last, TrainerStepFinished) and last.version == 4
    assert set(last.trained_ids) == {t.trajectory_id for t in late + fresh}
    assert last.dropped_stale == 0 and last.late_samples == len(late)
    assert last.staleness_counts[3] == len(late) and last.staleness_counts[0] == len(fresh)


def test_a_restarted_trainer_resumes_from_the_last_announced_version(
    settings, codec, make_topic, model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    topics = trainer_topics(make_topic)
    store = WeightStore((tmp_path / "weights").as_uri())
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    groups, _, _ = rewarded_groups(reference, groups=4, seed=5)
    send(settings, codec, topics.trajectories, [t for g in groups for t in g.trajectories])
    config = trainer_config(topics)
    first = TrainerService(settings, codec, config, model_dir, store, **FAST_GROUP)
    assert first.run(max_steps=1, timeout=120) == 1
    after_one = full_state_dict(first.engine)
    first.close()
    # An orphan: a version written but never announced must not survive a restart.
    store.publish_state_dict(2, step=2, parent_version=1, state_dict=after_one)

    second = TrainerService(settings, codec, config, model_dir, store, **FAST_GROUP)
    assert second.version == 1 and store.versions() == [1]
    resumed = full_state_dict(second.engine)
    assert all(torch.equal(resumed[n], after_one[n]) for n in after_one)
    assert second.run(max_steps=1, timeout=120) == 1 and second.version == 2
    second.close()
    steps = events_of(settings, codec, topics.metrics)
    trained = [tid for s in steps for tid in s.trained_ids]
    assert len(trained) == len(set(trained)) == 8


def trainer_process(env, topics: TrainerTopics, group: str, model_dir, store: str, pause: float):
    args = [topics.trajectories, topics.weights, topics.metrics, group, "crashy",
            str(model_dir), store, str(pause)]  # fmt: skip
    # This process may have set up its own one-process torch world; the child needs its own.
    own = {k: v for k, v in env.items() if k not in DISTRIBUTED_VARIABLES}
    return subprocess.Popen(
        worker_command("trainer_process.py", *args), env=own, stdout=subprocess.PIPE, text=True
    )


def serving_line(process: subprocess.Popen) -> str:
    """The worker's "serving" line (DeepSpeed prints its own lines to stdout first)."""
    for line in process.stdout:
        if line.startswith("serving"):
            return line.strip()
    raise AssertionError(f"the trainer exited with {process.wait()} before serving")


def kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(10)


@pytest.mark.slow
def test_sigkill_between_weight_write_and_commit_and_mid_step_trains_each_trajectory_once(
    settings, codec, make_topic, model_dir: Path, tmp_path: Path, worker_env
) -> None:
    from transformers import AutoModelForCausalLM

    topics = trainer_topics(make_topic)
    store_url = (tmp_path / "weights").as_uri()
    store = WeightStore(store_url)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    groups, _, _ = rewarded_groups(reference, groups=8, seed=9)
    everything = [t for g in groups for t in g.trajectories]
    send(settings, codec, topics.trajectories, everything)
    group = f"trainer-{uuid.uuid4().hex[:6]}"

    # 1. Dies after writing v1, before committing it: v1 is an orphan.
    first = trainer_process(worker_env, topics, group, model_dir, store_url, pause=60)
    try:
        assert serving_line(first) == "serving at v0"
        wait_for("v1 written", lambda: store.versions() == [1], 120, every=0.1)
    finally:
        kill(first)
    assert events_of(settings, codec, topics.weights) == []

    # 2. Restarts (removing the orphan), commits v1, dies during the next step.
    second = trainer_process(worker_env, topics, group, model_dir, store_url, pause=0)
    try:
        assert serving_line(second) == "serving at v0"
        wait_for(
            "step 1", lambda: len(events_of(settings, codec, topics.metrics)) >= 1, 120, every=0.1
        )
    finally:
        kill(second)

    # 3. Restarts from the last announced version and finishes the data.
    third = trainer_process(worker_env, topics, group, model_dir, store_url, pause=0)
    try:
        assert serving_line(third).startswith("serving at v")
        wait_for(
            "4 steps", lambda: len(events_of(settings, codec, topics.metrics)) >= 4, 180, every=0.1
        )
    finally:
        third.send_signal(signal.SIGTERM)
        third.wait(60)

    steps = events_of(settings, codec, topics.metrics)
    assert [s.version for s in steps] == [1, 2, 3, 4]  # no gap, no repeat
    trained = [tid for s in steps for tid in s.trained_ids]
    assert sorted(trained) == sorted(t.trajectory_id for t in everything)  # each exactly once
    announced = [w.version for w in events_of(settings, codec, topics.weights)]
    assert announced == [1, 2, 3, 4] and store.versions() == [1, 2, 3, 4]
    for step in steps:
        assert sorted(store.get(step.version).manifest.trained_ids) == sorted(step.trained_ids)


def test_the_readme_trainer_config_is_valid_and_bad_fields_are_named(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from asearcher.cli.app import app
    from asearcher.cli.errors import CliError
    from asearcher.trainer.runtime.config import load_trainer_config
    from tests.conftest import readme_toml

    good = tmp_path / "trainer.toml"
    good.write_text(readme_toml("[batching]"))
    config = load_trainer_config(good)
    assert config.batching.groups_per_batch == 8 and config.objective.clip_eps == 0.2
    assert config.deepspeed["zero_optimization"] == {"stage": 2}
    bad = tmp_path / "bad.toml"
    bad.write_text("[objective]\nclip_eps = 1.5\n")
    result = CliRunner().invoke(app, ["train", "serve", "-c", str(bad), "--home", str(tmp_path)])
    assert isinstance(result.exception, CliError) and "clip_eps" in str(result.exception)
    missing = CliRunner().invoke(app, ["train", "serve", "--model", str(tmp_path / "none")])
    assert isinstance(missing.exception, CliError)
    assert "asearcher model init" in str(missing.exception)


def test_train_serve_from_the_cli_takes_a_step_and_publishes_it(
    settings, codec, make_topic, model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    from asearcher.cli.app import app

    topics = trainer_topics(make_topic)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    groups, _, _ = rewarded_groups(reference, groups=2, seed=13)
    send(settings, codec, topics.trajectories, [t for g in groups for t in g.trajectories])
    config = tmp_path / "trainer.toml"
    config.write_text(
        f'group_id = "cli-{uuid.uuid4().hex[:6]}"\ninstance = "{uuid.uuid4().hex}"\n'
        "[batching]\ngroups_per_batch = 2\n"
        f'[topics]\ntrajectories = "{topics.trajectories}"\nweights = "{topics.weights}"\n'
        f'metrics = "{topics.metrics}"\n'
    )
    store = (tmp_path / "weights").as_uri()
    result = CliRunner().invoke(app, [
        "train", "serve", "-c", str(config), "--model", str(model_dir), "--store", store,
        "--max-steps", "1", "--bootstrap-servers", settings.bootstrap_servers,
        "--home", str(tmp_path),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "trained 1 steps; now at v1" in result.output
    assert WeightStore(store).versions() == [1]
    [announced] = events_of(settings, codec, topics.weights)
    assert announced.version == 1 and announced.uri == WeightStore(store).uri_of(1)


def test_invalid_trajectories_are_dead_lettered_and_their_groups_train_without_them(
    settings, codec, make_topic, model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from asearcher.streams.wire.events import DeadLetter, TrajectoriesDropped
    from asearcher.streams.wire.topics import DEAD_LETTERS

    topics = trainer_topics(make_topic)
    store = WeightStore((tmp_path / "weights").as_uri())
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    vocab = reference.config.vocab_size
    groups, _, _ = rewarded_groups(reference, groups=3, seed=7)
    members = [msgspec.structs.replace(t, group_size=3) for t in groups[1].trajectories]
    past_vocab = msgspec.structs.replace(
        members[0], trajectory_id=uuid.uuid4().hex, token_ids=[*members[0].token_ids[:-1], vocab]
    )
    short_mask = msgspec.structs.replace(
        groups[2].trajectories[0], trajectory_id=uuid.uuid4().hex, loss_mask=[1]
    )
    nan_reward = msgspec.structs.replace(groups[2].trajectories[1], reward=float("nan"))
    # Group 1 loses one of three members; group 2 loses both of its two (nothing to wait for).
    sent = [*groups[0].trajectories, *members, past_vocab, short_mask, nan_reward]
    send(settings, codec, topics.trajectories, sent)
    config = trainer_config(topics)
    service = TrainerService(settings, codec, config, model_dir, store, **FAST_GROUP)
    assert service.run(max_steps=1, timeout=120) == 1  # a crash here is the bug
    service.close()
    [step] = [e for e in events_of(settings, codec, topics.metrics)
              if isinstance(e, TrainerStepFinished)]  # fmt: skip
    valid = {t.trajectory_id for t in [*groups[0].trajectories, *members]}
    assert set(step.trained_ids) == valid
    letters = [e for e in events_of(settings, codec, DEAD_LETTERS)
               if isinstance(e, DeadLetter) and e.origin_topic == topics.trajectories]  # fmt: skip
    reasons = sorted(letter.reason for letter in letters)
    assert len(letters) == 3, reasons
    assert any("outside the policy's vocabulary" in r for r in reasons)
    assert any("differ in length" in r for r in reasons)
    assert any("reward nan is not finite" in r for r in reasons)

    # Restarted, the trainer does not meet them again: they were committed with the step.
    again = TrainerService(settings, codec, config, model_dir, store, **FAST_GROUP)
    assert again.run(max_steps=1, timeout=8) == 0 and again.version == 1
    again.close()
    assert not [e for e in events_of(settings, codec, topics.metrics)
                if isinstance(e, TrajectoriesDropped)]  # fmt: skip


def test_a_timed_step_waits_publishes_versions_and_leaves_the_weights_unchanged(
    settings, codec, make_topic, model_dir: Path, tmp_path: Path
) -> None:
    import time

    from transformers import AutoModelForCausalLM

    from asearcher.trainer.runtime.config import TimedStep

    topics, store, sent = sent_groups(settings, codec, make_topic, model_dir, tmp_path, 4, 7)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = trainer_config(topics, timed_step=TimedStep(fixed_s=0.5, per_sample_s=0.1))
    service = TrainerService(settings, codec, config, model_dir, store, **FAST_GROUP)
    started = time.monotonic()
    assert service.run(max_steps=2, timeout=120) == 2 and service.version == 2
    elapsed = time.monotonic() - started
    service.close()

    steps = events_of(settings, codec, topics.metrics)
    per_step = 0.5 + 0.1 * len(sent) / 2  # two groups of the four per step
    assert [s.stats.seconds for s in steps] == [pytest.approx(per_step, abs=0.05)] * 2
    assert elapsed >= 2 * per_step
    assert sorted(tid for s in steps for tid in s.trained_ids) == sorted(
        t.trajectory_id for t in sent
    )
    assert [s.stats.reward_mean for s in steps] != [0.0, 0.0]
    assert all(s.stats.loss == 0.0 for s in steps)
    last = [e for e in events_of(settings, codec, topics.weights)][-1]
    assert last.version == 2
    _, loaded = load_state_dict(last.uri, last.sha256)
    assert loaded and all(
        torch.equal(loaded[n], t) for n, t in reference.state_dict().items() if n in loaded
    )


def test_a_timed_step_with_negative_times_is_refused() -> None:
    from asearcher.trainer.runtime.config import TimedStep

    with pytest.raises(ValueError, match="timed_step"):
        TimedStep(fixed_s=-1.0)


@pytest.mark.parametrize("hold_batches", [1, 40])
def test_a_trainer_behind_a_backlog_holds_a_few_batches_and_trains_it_all(
    settings, codec, make_topic, model_dir: Path, tmp_path: Path, hold_batches: int
) -> None:
    """A backlog waits in Kafka: the trainer holds at most `hold_batches` batches of groups
    ready (and what one poll brings); with a bound larger than the backlog it holds it all."""
    from asearcher.trainer.runtime.config import TimedStep

    topics, store, sent = sent_groups(settings, codec, make_topic, model_dir, tmp_path, 40, 11)
    config = trainer_config(topics, timed_step=TimedStep(fixed_s=0.01))
    config.batching.hold_batches = hold_batches
    service = TrainerService(settings, codec, config, model_dir, store, **FAST_GROUP)
    held: list[int] = []
    poll = service.intake.poll
    service.intake.poll = lambda limit: (held.append(len(service._records)), poll(limit))[1]
    assert service.run(max_steps=20, timeout=120) == 20
    service.close()

    steps = events_of(settings, codec, topics.metrics)
    trained = sorted(tid for s in steps for tid in s.trained_ids)
    assert trained == sorted(t.trajectory_id for t in sent)  # nothing lost, nothing twice
    if hold_batches == 1:  # 2 groups of 2 ready, one more group polled: never the backlog
        assert max(held) <= 6, held
    else:
        assert max(held) >= 40, held  # the whole backlog of 80 fits under this bound
