"""The main job (`asearcher learn`) in a reduced form: warm start, async RL from it with
continuous evaluation, the evaluation before and after, curves, and a clean end.

Everything is real: the CLI in a subprocess against the session's broker, the supervised
services, the transformers engine playing the cloned policy, DeepSpeed in the trainer.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from asearcher.cli.jobs.learning import SUMMARY_FILE, by_hops, read_summary
from asearcher.cli.run.config import DEMONSTRATION_SEED, load_run_config, paths, run_dir
from asearcher.consumers.world.guessing import world_template_guess
from asearcher.producers.rollout.feeder import last_progress
from asearcher.streams.service.supervisor import RunSupervisor
from asearcher.streams.storage.weight_reader import WeightStoreReader
from asearcher.streams.wire.events import (
    EvalResult,
    RolloutRequested,
    TrainerStepFinished,
    TrajectoryFinished,
    WeightsPublished,
)
from asearcher.streams.wire.topics import (
    EVAL_REQUESTS,
    EVAL_RESULTS,
    EVAL_TRAJECTORIES,
    EXPERT_REQUESTS,
    EXPERT_TRAJECTORIES,
    FEEDER_PROGRESS,
    ROLLOUT_REQUESTS,
    TRAINER_METRICS,
    WEIGHTS,
)
from tests.support.rollout import events_of
from tests.support.runs import ASEARCHER

pytestmark = pytest.mark.whole_run  # a whole topology: one at a time (tests/conftest.py)

# A world of 1-hop questions over short pages and a small policy, so the warm start runs in
# seconds. RL trains that policy on groups the scripted expert plays with deliberate mistakes
# (mixed rewards, so the trainer steps within the test's minute and a half; a policy this small
# and this briefly cloned scores 0 everywhere, its groups flat): the test proves the job's
# wiring, the learning itself is measured by tests/benchmarks/bench_learning.py.
REDUCED_RUN = """
name = "{name}"
[policy]
vocab_size = 1024
hidden_size = 64
layers = 2
pretrain_steps = 100
[data]
world_entities = 40
world_questions = 120
world_max_hops = 1
world_filler = false
world_valid_share = 0.2
dense = false
[tools.config]
search_mode = "bm25"
top_k = 2
doc_chars = 200
chunk_chars = 1500
max_chunks = 1
[rollout]
engine = "expert"
mistake_rate = 0.5
[rollout.config]
concurrency = 8
engine_threads = 1
drain_timeout_s = 10
status_every_s = 1
[rollout.config.agent]
turns = "single_call"
brief_prompt = true
short_observations = true
[trainer.config]
status_every_s = 1
keep_last = 1000
[trainer.config.batching]
groups_per_batch = 1
eta = 4
[trainer.config.deepspeed.optimizer.params]
lr = 1e-4
[feeder.config]
group_size = 4
outstanding = 8
flat_kind_share = 0.01
[feeder.config.sampling]
max_new_tokens_per_turn = 48
max_turns = 4
[eval]
concurrency = 8
keep_best = true
[eval.config]
every_versions = 1
samples = 1
limit = 4
split = "valid"
[eval.config.sampling]
temperature = 0.6
top_p = 0.95
max_new_tokens_per_turn = 48
max_turns = 4
seed = 3
[warm_start]
worlds = 1
borrow_names = true
questions = 40
epochs = 3
batch = 8
lr = 3e-3
orders = 2
snapshots = 2
selection_questions = 4
enabled = true
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_learn_warm_starts_trains_evaluates_before_and_after_and_ends_cleanly(
    broker, settings, codec, tmp_path: Path
) -> None:
    name = f"l{uuid.uuid4().hex[:8]}"
    home = tmp_path / "home"
    home.mkdir()
    config = home / "run.toml"
    config.write_text(REDUCED_RUN.format(name=name))
    env = {**os.environ, "ASEARCHER_HOME": str(home), "COLUMNS": "200",
           "ASEARCHER_BOOTSTRAP_SERVERS": broker.bootstrap_servers}  # fmt: skip
    args = [ASEARCHER, "learn", "-c", str(config), "--minutes", "1.5", "--eval-questions", "4",
            "--samples", "1", "--score-last"]  # fmt: skip
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=840, cwd="/")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]

    # The warm start played another world with the run's names, never the run's facts: no
    # question of the run's world (train or held out) was demonstrated with its answer.
    requested = [
        e for e in events_of(settings, codec, EXPERT_REQUESTS)
        if isinstance(e, RolloutRequested) and e.metadata.get("run") == name
    ]  # fmt: skip
    demonstrated = [
        e for e in events_of(settings, codec, EXPERT_TRAJECTORIES)
        if isinstance(e, TrajectoryFinished) and e.metadata.get("run") == name
    ]  # fmt: skip
    assert len(requested) == len(demonstrated) == 40
    run_world = paths(load_run_config(config), home).world_dir
    run_questions = [
        json.loads(line)
        for split in ("qa_train", "qa_valid", "qa_test")
        for line in (run_world / f"{split}.jsonl").read_text().splitlines()
    ]
    assert len(run_questions) == 120
    asked = {(e.question, tuple(e.gold_answers)) for e in requested}
    assert not asked & {(q["question"], tuple(q["answers"])) for q in run_questions}
    assert {e.question for e in requested} & {q["question"] for q in run_questions}  # names
    assert not {e.question_id for e in demonstrated} & {q["id"] for q in run_questions}
    assert all(e.question_id.startswith(f"synth-{DEMONSTRATION_SEED}-") for e in demonstrated)

    # The warm start cloned the expert into v1, with its recipe; RL went on from it.
    store = WeightStoreReader((run_dir(home, name) / "weights").as_uri())
    first = store.get(1).manifest
    assert first.recipe["kind"] == "sft" and first.recipe["run"] == name
    recipe = first.recipe
    assert recipe["trajectories"] >= 30 and recipe["last_loss"] < recipe["first_loss"]
    # Two cloning orders, each scored at two steps of its last epoch on held-out questions of
    # the demonstration world only; v1 is the snapshot that scored best (the first of a tie).
    selection = recipe["selection"]
    scores = selection["scores"]
    assert len({s["seed"] for s in scores}) == 2 and len(scores) == 4
    best = max(scores, key=lambda s: s["f1"])
    assert (recipe["seed"], recipe["snapshot_step"]) == (best["seed"], best["step"])
    assert recipe["steps"] == best["step"]
    steps_scored = {seed: sorted(s["step"] for s in scores if s["seed"] == seed)
                    for seed in {s["seed"] for s in scores}}  # fmt: skip
    assert all(len(set(steps)) == 2 for steps in steps_scored.values())
    assert len({steps[-1] for steps in steps_scored.values()}) == 1  # each order's last step
    assert len(selection["questions"]) == 4
    assert all(q.startswith(f"synth-{DEMONSTRATION_SEED}-") for q in selection["questions"])
    assert not set(selection["questions"]) & {q["id"] for q in run_questions}
    assert "order 2 (shuffle seed" in out and f"shuffle seed {recipe['seed']})" in out
    announced = sorted(e.version for e in events_of(settings, codec, WEIGHTS)
                       if isinstance(e, WeightsPublished) and e.model == name)  # fmt: skip
    steps = [e for e in events_of(settings, codec, TRAINER_METRICS)
             if isinstance(e, TrainerStepFinished) and e.model == name]  # fmt: skip
    assert announced[0] == 1 and len(announced) >= 2, out[-3000:]
    assert announced == list(range(1, announced[-1] + 1))  # no gaps
    assert sorted(s.version for s in steps) == announced[1:]

    # Evaluated before RL (v1) and after (the version its continuous evaluations rated best),
    # each on the same 4 questions, and every RL version the processor was asked for
    # (every_versions = 1) got its table.
    results = [e for e in events_of(settings, codec, EVAL_RESULTS)
               if isinstance(e, EvalResult) and e.model == name]  # fmt: skip
    summary = read_summary(run_dir(home, name) / SUMMARY_FILE)
    chosen = summary.after.policy_version
    evaluated = {r.policy_version for r in results}
    assert {1, chosen} <= evaluated
    assert all(r.questions == 4 and r.samples_per_question == 1 for r in results)
    assert "the agent before and after async RL" in out
    assert "v1" in out and f"v{announced[-1]}" in out and "points" in out and "noise" in out
    played = re.search(r"groups played: ([\d,]+), ([\d,]+) of them flat and dropped", out)
    assert played, out[-3000:]
    # What the feeder passed over during RL is the count its committed progress holds.
    progress = last_progress(settings, codec, FEEDER_PROGRESS, name)
    assert progress is not None
    passed = re.search(r"questions passed over: ([\d,]+)", out)
    assert (int(passed[1]) if passed else 0) == progress.skipped

    # The summary holds the same evaluations and every step behind the version evaluated after
    # RL, also one the trainer finished while it was being stopped; the printed count agrees.
    assert summary.before.policy_version == 1
    assert_latest_near_the_best_chosen(summary, announced[-1], out)
    # The last version was evaluated on validation too (here by continuous evaluation, or by
    # the job after RL where that had not reached it), so it could be chosen; where another
    # was, --score-last scored the last on the same held-out questions beside it.
    assert announced[-1] in {r.policy_version for r in summary.evaluations}
    if chosen == announced[-1]:
        assert summary.last_after is None
    else:
        assert summary.last_after is not None
        assert summary.last_after.policy_version == announced[-1]
        assert summary.last_after_by_question["f1"].keys() == summary.after_by_question["f1"].keys()
        assert f"the last version, v{announced[-1]}, on the same questions" in " ".join(out.split())
    assert_continuous_evaluations_on_validation(settings, codec, summary, run_world, name)
    assert "on world (valid split, 4 questions)" in out
    assert sorted(s.version for s in summary.steps) == announced[1:]
    # Each evaluation's questions are kept with their means, so the change is paired.
    for by_question, result in ((summary.before_by_question, summary.before),
                                (summary.after_by_question, summary.after)):  # fmt: skip
        f1 = by_question["f1"]
        assert len(f1) == 4 and sum(f1.values()) / 4 == pytest.approx(result.averages["f1"])
    assert summary.before_by_question["f1"].keys() == summary.after_by_question["f1"].keys()
    # Both drew with the run's evaluation seed: they differ by their weights, not their draws.
    both = {summary.before.eval_id, summary.after.eval_id}
    drawn = {r.sampling.seed for r in events_of(settings, codec, EVAL_REQUESTS)
             if isinstance(r, RolloutRequested) and r.metadata.get("eval_id") in both}  # fmt: skip
    assert drawn == {3}
    assert "noise (paired)" in out
    # Beside it, what answering without reading scores on the same world's held-out split.
    guess = world_template_guess(run_world, set(summary.before_by_question["f1"]))
    assert guess is not None and summary.without_reading == {"f1": guess.f1, "em": guess.em}
    assert f"train answer): F1 {guess.f1:.3f}, EM {guess.em:.3f}" in " ".join(out.split())
    assert f"{len(announced) - 1} RL steps trained" in out
    # And split by hops (this world asks 1-hop questions only): F1 and pages, before and after.
    assert "by the hops a question takes" in out
    (hops,) = by_hops(summary, run_world)
    assert (hops.hops, hops.questions) == (1, 4)
    assert hops.f1[1] == pytest.approx(summary.after.averages["f1"])
    # every step shown, also one finished while RL stopped ("after the RL deadline")
    assert len(re.findall(r"^v\d+: reward", out, re.MULTILINE)) == len(announced) - 1, out[-3000:]
    assert summary.rl_seconds >= 90 and all(not s.trained_ids for s in summary.steps)
    # The flat groups printed are those of the steps and of the trainer's drops between them.
    flat = sum(s.dropped_flat_groups for s in summary.steps)
    flat += sum(d.dropped_flat_groups for d in summary.drops)
    groups = sum(s.groups for s in summary.steps) + flat
    assert (int(played[1].replace(",", "")), int(played[2].replace(",", ""))) == (groups, flat)
    assert all(not d.dropped_ids for d in summary.drops)

    # Curves written, a trajectory to replay named, and nothing of the run left running.
    figures = run_dir(home, name) / "figures"
    assert {"reward.png", "eval-world.png"} <= {p.name for p in figures.iterdir()}
    assert "asearcher replay rollout.steps tool.calls tool.results trajectories -t" in out
    assert f"asearcher ask --run {name} " in out and f"--weights v{chosen} " in out
    assert not RunSupervisor(run_dir(home, name)).is_running()

    # The run rebuilds from its log: every RL version byte for byte, from the warm start's v1.
    rebuilt = subprocess.run([ASEARCHER, "retrain", "--run", name, "--as", f"{name}-copy",
                              "--verify"], env=env, capture_output=True, text=True, timeout=600,
                             cwd="/")  # fmt: skip
    said = " ".join(rebuilt.stdout.split())
    assert rebuilt.returncode == 0, rebuilt.stdout[-3000:] + rebuilt.stderr[-3000:]
    assert f"verified: all {len(steps)} version(s)" in said and "(from v1)" in said, said


def assert_latest_near_the_best_chosen(summary, last: int, out: str) -> None:
    """The version scored after RL is the latest whose continuous evaluation, averaged with its
    neighbours', is within one standard error of the best such rating, and the job said so."""
    assert summary.evaluations, out[-3000:]
    results = {r.policy_version: r for r in summary.evaluations}
    versions = sorted(results)
    rating, error = {}, {}
    for i, version in enumerate(versions):
        near = [results[v] for v in versions[max(0, i - 1) : i + 2]]
        f1s = [r.averages["f1"] for r in near]
        rating[version] = sum(f1s) / len(near)
        bound = sum(f * (1 - f) / r.questions for f, r in zip(f1s, near, strict=True))
        error[version] = bound**0.5 / len(near)
    best = max(versions, key=lambda v: (round(rating[v], 9), v))
    chosen = max(v for v in versions if rating[v] >= rating[best] - error[best])
    assert summary.choice is not None and summary.choice.last == last
    assert summary.after.policy_version == summary.choice.version == chosen
    assert summary.choice.best == best
    said = " ".join(out.split())
    assert f"scored after RL: v{chosen}, the latest of {len(versions)} continuous" in said
    assert f"within one standard error of the best (v{best}:" in said


def assert_continuous_evaluations_on_validation(settings, codec, summary, world, name) -> None:
    """Continuous evaluation played validation questions only; RL never fed one of them."""
    valid = {json.loads(line)["id"] for line in (world / "qa_valid.jsonl").read_text().splitlines()}
    assert valid
    continuous = {r.eval_id for r in summary.evaluations}
    played = [
        e
        for e in events_of(settings, codec, EVAL_TRAJECTORIES)
        if isinstance(e, TrajectoryFinished) and e.metadata.get("eval_id") in continuous
    ]
    assert played and {e.question_id for e in played} <= valid
    fed = [
        e
        for e in events_of(settings, codec, ROLLOUT_REQUESTS)
        if isinstance(e, RolloutRequested) and e.metadata.get("run") == name
    ]
    assert fed and not {e.question_id for e in fed} & valid
