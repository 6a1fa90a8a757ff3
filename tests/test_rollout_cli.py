"""Rollout producers from the terminal: request groups, serve them, one-line errors."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from typer.testing import CliRunner

from asearcher.cli.app import app
from asearcher.cli.errors import CliError
from asearcher.consumers.world.world import write_world
from asearcher.producers.rollout.service import RolloutTopics
from asearcher.streams.cluster.admin import skip_backlog
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.events import RolloutRequested, TrajectoryFinished
from asearcher.streams.wire.topics import ROLLOUT_REQUESTS, TRAJECTORIES
from tests.support.rollout import ToolWorkerThread, events_of
from tests.support.trainer import tiny_model_dir


def test_request_then_serve_with_the_expert_engine_answers_every_group(
    settings, codec, world_index, tmp_path: Path
) -> None:
    world, index = world_index
    files = write_world(world, tmp_path / "world")
    model_dir = tiny_model_dir(tmp_path / "policy")
    cluster = ["--bootstrap-servers", settings.bootstrap_servers, "--home", str(tmp_path)]
    group = f"cli-{uuid.uuid4().hex[:6]}"
    skip_backlog(settings, group, ROLLOUT_REQUESTS)  # requests other tests left on the topic
    runner = CliRunner()
    started = time.time()
    requested = runner.invoke(app, ["rollout", "request", "--qa", str(files["qa_train"]),
                                    "--limit", "3", "--group-size", "2", *cluster])  # fmt: skip
    assert requested.exit_code == 0, requested.output
    # Told apart by creation time, not by "absent before": a transaction another test's killed
    # feeder left open hides later records until the broker aborts it, and then they appear.
    ended = time.time()
    new = [e for e in events_of(settings, codec, ROLLOUT_REQUESTS)
           if isinstance(e, RolloutRequested) and started <= e.created_at <= ended]  # fmt: skip
    assert len(new) == 3 and all(isinstance(r, RolloutRequested) for r in new)
    assert {r.group_size for r in new} == {2}

    with ToolWorkerThread(settings, codec, RolloutTopics(), index.directory,
                          (tmp_path / "results").as_uri()):  # fmt: skip
        serve = ["rollout", "serve", "--engine", "expert", "--qa", str(files["qa_train"]),
                 "--model", str(model_dir)]  # fmt: skip
        served = runner.invoke(app, [*serve, "--max-groups", "3", "--group", group, *cluster])
    assert served.exit_code == 0, served.output
    assert "groups=3 trajectories=6" in served.output
    finished = [
        t for t in events_of(settings, codec, TRAJECTORIES)
        if isinstance(t, TrajectoryFinished) and t.group_id in {r.group_id for r in new}
    ]  # fmt: skip
    assert len(finished) == 6
    assert all(t.reward == 1.0 for t in finished), [(t.answer, t.format_error) for t in finished]
    # The expert writes the policy's own tokens, so the trainer can embed every one of them.
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    assert all(0 <= token < vocab for t in finished for token in t.token_ids)


def test_serve_names_a_bad_config_field_and_a_missing_model(tmp_path: Path) -> None:
    config = tmp_path / "rollout.toml"
    config.write_text("concurrency = 4\n[agent]\ntoken_budget = 0\n")
    runner = CliRunner()
    bad = runner.invoke(app, ["rollout", "serve", "-c", str(config), "--home", str(tmp_path)])
    assert isinstance(bad.exception, CliError)
    assert "token_budget must be positive" in str(bad.exception)
    assert "\n" not in str(bad.exception)
    missing = runner.invoke(app, ["rollout", "serve", "--model", str(tmp_path / "none")])
    assert isinstance(missing.exception, CliError)
    assert "asearcher model init" in str(missing.exception)


def test_request_names_a_bad_turn_limit(tmp_path: Path) -> None:
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"id": "q1", "question": "Who?", "answers": ["me"]}\n')
    args = ["rollout", "request", "--qa", str(qa), "--limit", "1", "--max-turns", "0"]
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, CliError) and "max_turns" in str(result.exception)


def test_request_with_a_limit_beyond_the_file_or_below_one_is_refused(tmp_path: Path) -> None:
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"id": "q1", "question": "Who?", "answers": ["me"]}\n{"question": "?", "gt": 1}')
    runner = CliRunner()
    beyond = runner.invoke(app, ["rollout", "request", "--qa", str(qa), "--limit", "3"])
    assert isinstance(beyond.exception, CliError)
    assert str(beyond.exception) == f"--limit 3 exceeds the 2 questions in {qa}"
    zero = runner.invoke(app, ["rollout", "request", "--qa", str(qa), "--limit", "0"])
    assert isinstance(zero.exception, CliError) and "--limit" in str(zero.exception)


def test_the_readme_rollout_config_is_valid(tmp_path: Path) -> None:
    from asearcher.producers.rollout.service import load_rollout_config
    from tests.conftest import readme_toml

    config_file = tmp_path / "rollout.toml"
    config_file.write_text(readme_toml("[staleness]"))
    config = load_rollout_config(config_file)
    assert config.staleness.eta == 4 and config.agent.history_chars == 25_000
    assert config.agent.reward.metric == "f1" and config.topics.requests == "rollout.requests"


def test_a_reference_layout_qa_file_is_played_rewarded_and_trained(
    settings, codec, make_topic, world_index, tmp_path: Path
) -> None:
    """`answer` (string and list), `aug_answer` and `idx`: golds reach the requests, an expert
    that errs half the time gives groups with a signal, and the trainer steps on them."""
    world, index = world_index
    files = write_world(world, tmp_path / "world")
    train = [json.loads(line) for line in files["qa_train"].read_text().splitlines()][:4]
    reference = [
        {"idx": 100 + n, "question": q["question"],
         "answer": q["answers"] if n % 2 else q["answers"][0],
         **({"aug_answer": [q["answers"][0].upper()]} if n == 0 else {})}
        for n, q in enumerate(train)
    ]  # fmt: skip
    qa = tmp_path / "reference.jsonl"
    qa.write_text("".join(json.dumps(item) + "\n" for item in reference))
    model_dir = tiny_model_dir(tmp_path / "policy")
    cluster = ["--bootstrap-servers", settings.bootstrap_servers, "--home", str(tmp_path)]
    group = f"ref-{uuid.uuid4().hex[:6]}"
    skip_backlog(settings, group, ROLLOUT_REQUESTS)
    runner = CliRunner()
    started = time.time()
    # No --limit: the whole file.
    requested = runner.invoke(app, ["rollout", "request", "--qa", str(qa), "--group-size", "6",
                                    *cluster])  # fmt: skip
    assert requested.exit_code == 0, requested.output
    ended = time.time()
    new = [e for e in events_of(settings, codec, ROLLOUT_REQUESTS)
           if isinstance(e, RolloutRequested) and started <= e.created_at <= ended]  # fmt: skip
    by_id = {r.question_id: r for r in new}
    assert sorted(by_id) == ["100", "101", "102", "103"]
    assert all(by_id[str(100 + n)].gold_answers == q["answers"] for n, q in enumerate(train))
    assert by_id["100"].aug_answers == [train[0]["answers"][0].upper()]
    assert by_id["101"].aug_answers == []

    with ToolWorkerThread(settings, codec, RolloutTopics(), index.directory,
                          (tmp_path / "results").as_uri()):  # fmt: skip
        serve = ["rollout", "serve", "--engine", "expert", "--qa", str(files["qa_train"]),
                 "--model", str(model_dir), "--mistake-rate", "0.5"]  # fmt: skip
        served = runner.invoke(app, [*serve, "--max-groups", "4", "--group", group, *cluster])
    assert served.exit_code == 0, served.output
    groups = {r.group_id for r in new}
    finished = [t for t in events_of(settings, codec, TRAJECTORIES)
                if isinstance(t, TrajectoryFinished) and t.group_id in groups]  # fmt: skip
    assert len(finished) == 24
    rewards = {g: {t.reward for t in finished if t.group_id == g} for g in groups}
    assert sum(len(values) > 1 for values in rewards.values()) >= 1, rewards
    assert all("aug" in t.reward_parts for t in finished if t.question_id == "100")
    assert not any("aug" in t.reward_parts for t in finished if t.question_id != "100")

    trajectories, weights = make_topic(like="trajectories"), make_topic(like="weights")
    with EventProducer(settings, codec) as producer:
        for trajectory in finished:
            producer.send(trajectories, trajectory)
    config = tmp_path / "trainer.toml"
    config.write_text(
        f'group_id = "{group}-trainer"\ninstance = "{uuid.uuid4().hex}"\n'
        "[batching]\ngroups_per_batch = 1\n"
        f'[topics]\ntrajectories = "{trajectories}"\nweights = "{weights}"\n'
        f'metrics = "{make_topic(like="trainer.metrics")}"\n'
    )
    trained = runner.invoke(app, ["train", "serve", "-c", str(config), "--model", str(model_dir),
                                  "--store", (tmp_path / "store").as_uri(), "--max-steps", "1",
                                  *cluster])  # fmt: skip
    assert trained.exit_code == 0, trained.output
    assert "trained 1 steps; now at v1" in trained.output
