"""Re-training from the log: a run's versions rebuilt byte for byte from its events, a changed
log found at the version it changes, and counterfactual re-training under another name."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import msgspec
import pytest

from asearcher.cli.errors import CliError
from asearcher.cli.jobs.retraining import counterfactual_config
from asearcher.cli.run.config import RunConfig, run_dir
from asearcher.streams.cluster.settings import reading_claim_store
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import (
    EvalResult,
    TrainerStepFinished,
    TrajectoryFinished,
    WeightsPublished,
)
from asearcher.streams.wire.topics import EVAL_RESULTS, TRAINER_METRICS, TRAJECTORIES, WEIGHTS
from asearcher.trainer.runtime.retrain import RetrainError, batch_of, check_replayable
from asearcher.trainer.runtime.weight_publisher import WeightStore
from tests.conftest import free_port_pair
from tests.support.rollout import events_of
from tests.support.runs import EXPERT_RUN, Run, run_trajectories, versions
from tests.support.waiting import wait_for

VERSIONS = 6
# The expert plays a small world of short pages and a narrow policy trains (2 s a step, not 15):
# 25 training questions, about 10 versions, then the run idles; every version stays in the store.
RETRAIN_RUN = (
    EXPERT_RUN.replace("dense = false", "dense = false\nworld_questions = 30\nworld_filler = false")
    .replace(
        "[rollout]\n", "[policy]\nhidden_size = 64\nlayers = 1\nvocab_size = 2048\n[rollout]\n"
    )
    .replace("[trainer.config]\n", "[trainer.config]\nkeep_last = 50\n")
    .replace("every_versions = 2", "every_versions = 0")
)

pytestmark = pytest.mark.whole_run  # a whole topology: one at a time (tests/conftest.py)


def _step(version: int, ids: list[str], **fields) -> TrainerStepFinished:
    defaults = {"parent_version": version - 1, "optimizer_step": version, "threads": 2,
                "weights_sha256": f"sha{version}", "settings_sha256": "f"}  # fmt: skip
    return TrainerStepFinished(version=version, step=version, trained_ids=ids,
                               **{**defaults, **fields})  # fmt: skip


def _trajectory(tid: str, group: str) -> TrajectoryFinished:
    return TrajectoryFinished(trajectory_id=tid, group_id=group, question_id="q", token_ids=[1],
                              logprobs=[0.0], loss_mask=[1], token_versions=[0])  # fmt: skip


def test_a_step_s_batch_is_its_groups_in_the_order_trained() -> None:
    found = {t.trajectory_id: t for t in
             (_trajectory("b1", "B"), _trajectory("a1", "A"), _trajectory("b0", "B"))}  # fmt: skip
    groups = batch_of(_step(1, ["b1", "b0", "a1"]), found)
    assert [(g.group_id, [t.trajectory_id for t in g.trajectories]) for g in groups] == [
        ("B", ["b1", "b0"]), ("A", ["a1"])]  # fmt: skip
    with pytest.raises(RetrainError, match=r"v2: 1 of its 2 trajectories are not in the log"):
        batch_of(_step(2, ["a1", "zz"]), found)


@pytest.mark.parametrize(
    ("steps", "fingerprint", "message"),
    [
        ([_step(1, ["a"]), _step(3, ["b"], parent_version=2)], None, "v3 starts from v2"),
        ([_step(1, ["a"], ranks=2), _step(2, ["b"])], None, "v2 was trained by 1 processes"),
        ([_step(1, ["a"], parent_version=-1)], None, "before steps recorded"),
        ([_step(1, ["a"], weights_sha256="")], None, "before steps recorded"),
        ([_step(1, ["a"]), _step(2, ["b"], settings_sha256="g")], "f", "v2 was trained with other"),
    ],
)
def test_a_log_that_cannot_be_rebuilt_is_refused_naming_the_version(
    steps: list[TrainerStepFinished], fingerprint: str | None, message: str
) -> None:
    with pytest.raises(RetrainError, match=message):
        check_replayable(steps, fingerprint)
    check_replayable(steps[:1] if "v2" in message or "v3" in message else [], fingerprint)


def test_the_number_of_processes_a_run_trained_with_is_what_it_is_rebuilt_with() -> None:
    assert check_replayable([_step(1, ["a"], ranks=2), _step(2, ["b"], ranks=2)], None) == 2
    assert check_replayable([_step(1, ["a"])], None) == 1


def test_counterfactual_settings_change_the_trainer_only_and_rename_the_run() -> None:
    original = RunConfig(name="learn", store="s3://bucket/learn")
    changed = counterfactual_config(original, "learn-lr", [
        "trainer.config.deepspeed.optimizer.params.lr=1e-2",
        "trainer.config.objective.clip_eps=0.1", "trainer.config.objective.advantages=group_std",
    ])  # fmt: skip
    assert (changed.name, changed.store) == ("learn-lr", None)  # its own store
    assert changed.trainer.config.deepspeed == {"optimizer": {"params": {"lr": 0.01}}}
    objective = changed.trainer.config.objective
    assert (objective.clip_eps, objective.advantages) == (0.1, "group_std")
    assert original.trainer.config.objective.clip_eps != 0.1  # the original is untouched
    for bad, said in (("rollout.replicas=2", "expected trainer.config.FIELD=VALUE"),
                      ("trainer.config.objective.clip_eps", "expected"),
                      ("trainer.config.objective.clip_eps=[1]", "clip_eps"),
                      ("trainer.config.nope=1", "nope")):  # fmt: skip
        with pytest.raises(CliError, match=said):
            counterfactual_config(original, "x", [bad])


# Defined before the module's expert run is first used, so the two runs never share the cores.
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_trained_by_two_processes_is_rebuilt_by_two_byte_for_byte(
    broker, settings, tmp_path: Path
) -> None:
    two_ranks = f"[trainer]\nprocesses = 2\nmaster_port = {free_port_pair()}\n[trainer.config]\n"
    run = Run(tmp_path / "home", broker.bootstrap_servers,
              RETRAIN_RUN.replace("[trainer.config]\n", two_ranks, 1))  # fmt: skip
    codec = EventCodec(reading_claim_store(home=run.home))
    run.cli("stream", "up", "-c", str(run.config))
    try:
        wait_for("4 versions", lambda: len(versions(settings, codec, run.name)) >= 4, 400)
    finally:
        run.down()  # the re-training below has the two cores to itself
    original = _steps(settings, codec, run.name)
    assert {step.ranks for step in original.values()} == {2}, original
    out = run.cli("retrain", "--run", run.name, "--as", f"{run.name}-copy", "--verify",
                  timeout=600)  # fmt: skip
    rebuilt = _steps(settings, codec, f"{run.name}-copy")
    assert sorted(rebuilt) == sorted(original) and "verified: all" in out, out
    for version, step in rebuilt.items():
        assert (step.weights_sha256, step.ranks) == (original[version].weights_sha256, 2), version
    # The other rank was released, not left behind.
    assert subprocess.run(["pgrep", "-f", "retrain_ranks"], check=False).returncode == 1


@pytest.fixture(scope="module")
def expert_run(broker, settings, tmp_path_factory) -> Run:
    """An expert run of at least VERSIONS versions whose trainer was killed -9 once (so its
    log holds a restart with a fresh optimiser), still up for the evaluation below."""
    run = Run(tmp_path_factory.mktemp("retrain") / "home", broker.bootstrap_servers, RETRAIN_RUN)
    codec = EventCodec(reading_claim_store(home=run.home))
    run.cli("stream", "up", "-c", str(run.config))
    try:
        wait_for("3 versions", lambda: len(versions(settings, codec, run.name)) >= 3, 300)
        os.kill(run.pids()["trainer"], signal.SIGKILL)
        wait_for(f"{VERSIONS} versions after the trainer's restart",
                 lambda: len(versions(settings, codec, run.name)) >= VERSIONS, 300)  # fmt: skip
    except BaseException:
        run.down()
        raise
    yield run
    run.down()


def _steps(settings, codec, model: str) -> dict[int, TrainerStepFinished]:
    return {e.version: e for e in events_of(settings, codec, TRAINER_METRICS)
            if isinstance(e, TrainerStepFinished) and e.model == model}  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_retrain_verify_rebuilds_every_version_byte_for_byte(expert_run: Run, settings,
                                                             codec) -> None:  # fmt: skip
    run = expert_run
    out = run.cli("retrain", "--run", run.name, "--as", f"{run.name}-copy", "--verify",
                  timeout=600)  # fmt: skip
    original = _steps(settings, codec, run.name)
    rebuilt = _steps(settings, codec, f"{run.name}-copy")
    assert len(rebuilt) >= VERSIONS and f"verified: all {len(rebuilt)} version(s)" in out, out
    # The log held a restart (the kill above): its fresh optimiser was rebuilt too.
    assert [s.optimizer_step for s in rebuilt.values()].count(1) >= 2, rebuilt
    for version, step in rebuilt.items():
        assert step.weights_sha256 == original[version].weights_sha256, version
        assert step.trained_ids == original[version].trained_ids
    store = WeightStore((run_dir(run.home, f"{run.name}-copy") / "weights").as_uri())
    newest = max(rebuilt)
    assert store.get(newest).manifest.files["model.safetensors"] == original[newest].weights_sha256


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_changed_trajectory_is_named_at_the_first_version_it_changes(
    expert_run: Run, settings, codec, make_topic
) -> None:
    run = expert_run
    steps = _steps(settings, codec, run.name)
    target = steps[3].trained_ids[0]  # v3 trained it: v1 and v2 rebuild the same
    copy = make_topic(TRAJECTORIES)
    codec = EventCodec(reading_claim_store(home=run.home))  # the run's claim checks too
    # The run's own trajectories: the shared topic also holds other tests' records (the fuzz
    # test's garbage among them), which a copy of this run's log does not need.
    ours = run_trajectories(settings, codec, run.name)
    assert target in {t.trajectory_id for t in ours}
    with EventProducer(settings, codec) as producer:
        for event in ours:
            if event.trajectory_id == target:
                at = event.loss_mask.index(1)
                tokens = [
                    *event.token_ids[:at],
                    event.token_ids[at] + 1,
                    *event.token_ids[at + 1 :],
                ]
                event = msgspec.structs.replace(event, token_ids=tokens)
            producer.send(copy, event)
    result = run.call("retrain", "--run", run.name, "--as", f"{run.name}-bad", "--verify",
                      "--trajectories", copy, timeout=600)  # fmt: skip
    said = " ".join(result.stdout.split())
    assert result.returncode == 1 and "verify failed: v3 differs from the original" in said, said
    assert "largest difference" in said or "no longer in" in said, said
    rebuilt = _steps(settings, codec, f"{run.name}-bad")
    assert sorted(rebuilt) == [1, 2, 3]  # it stops at the first difference
    assert [rebuilt[v].weights_sha256 == steps[v].weights_sha256 for v in (1, 2, 3)] == [
        True, True, False]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_counterfactual_retraining_changes_weights_not_data_and_leaves_the_run_alone(
    expert_run: Run, settings, codec
) -> None:
    run, new = expert_run, f"{expert_run.name}-lr"
    announced_before = len(versions(settings, codec, run.name))
    out = run.cli("retrain", "--run", run.name, "--as", new, "--until", "v4",
                  "--set", "trainer.config.deepspeed.optimizer.params.lr=0.01")  # fmt: skip
    assert "4 of 4 versions differ from the original's" in out, out
    original, changed = _steps(settings, codec, run.name), _steps(settings, codec, new)
    assert sorted(changed) == [1, 2, 3, 4]
    for version, step in changed.items():
        assert step.trained_ids == original[version].trained_ids
        assert step.weights_sha256 != original[version].weights_sha256
        assert step.settings_sha256 != original[version].settings_sha256
    announced = [e for e in events_of(settings, codec, WEIGHTS) if isinstance(e, WeightsPublished)]
    assert sorted(e.version for e in announced if e.model == new) == [1, 2, 3, 4]
    assert len(versions(settings, codec, run.name)) >= announced_before  # the run's own go on
    saved = json.loads((run_dir(run.home, new) / "config" / "run.json").read_text())
    assert saved["trainer"]["config"]["deepspeed"] == {"optimizer": {"params": {"lr": 0.01}}}
    # `replay --run` shows the new run's steps and versions alone, though the topics are shared.
    export = run.home / "new.jsonl"
    run.cli("replay", "trainer.metrics", "weights", "--run", new, "--export", str(export))
    models = [json.loads(line)["event"]["model"] for line in export.read_text().splitlines()]
    assert len(models) == 8 and set(models) == {new}, models
    again = run.call("retrain", "--run", run.name, "--as", new)
    assert again.returncode == 2 and "already exists" in again.stderr, again

    # The new run's version, played by the run's services (its evaluator reads the new store).
    table = run.cli("eval", "run", "--run", run.name, "--engine", "transformers", "--weights",
                    "v4", "--weights-of", new, "--limit", "2", "--k", "1", "--profile",
                    "training", "--timeout", "300", timeout=400)  # fmt: skip
    assert "world" in table and "F1 Pass@1" in table, table
    eval_id = re.search(r"evaluation (\S+): 2 questions", table).group(1)
    assert eval_id.startswith(f"{new}-v4-")
    job = run_dir(run.home, run.name) / "config" / f"asearcher-eval-{eval_id}.json"
    assert json.loads(job.read_text())["store"].endswith(f"/runs/{new}/weights")
    # Filed under the new run, so the original's curves and status never show its score.
    [result] = [e for e in events_of(settings, codec, EVAL_RESULTS)
                if isinstance(e, EvalResult) and e.eval_id == eval_id]  # fmt: skip
    assert (result.model, result.policy_version) == (new, 4)


def test_a_retrain_that_cannot_read_its_trajectories_fails_in_a_line_and_keeps_the_name_free(
    expert_run: Run,
) -> None:
    run, new = expert_run, f"{expert_run.name}-nothing"
    for topic, said in (("weights", "trajectories are not in the log"), ("no-such", "no-such")):
        failed = run.call("retrain", "--run", run.name, "--as", new, "--trajectories", topic)
        assert failed.returncode == 2 and said in failed.stderr, failed
        assert "Traceback" not in failed.stderr, failed.stderr
    assert not (run_dir(run.home, new) / "config" / "run.json").exists()


def test_retrain_refuses_an_unknown_run_a_taken_name_and_a_verify_with_settings(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path / "home", "127.0.0.1:1", EXPERT_RUN)  # no broker: refused before it
    refused = (
        (["--run", "nope", "--as", "x"], "run 'nope' has not been brought up"),
        (["--run", "a", "--as", "a"], "--as must name a new run"),
        (["--run", "a", "--as", "b", "--verify", "--set", "trainer.config.seed=1"], "drop --set"),
        (["--run", "a", "--as", "b", "--until", "x3"], "--until must be vN or N"),
    )
    for args, said in refused:
        result = run.call("retrain", *args)
        assert result.returncode == 2 and said in result.stderr, result
