"""Rollout producers from the terminal: request groups, serve them, one-line errors."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from typer.testing import CliRunner

from asearcher.cli.app import app
from asearcher.cli.errors import CliError
from asearcher.consumers.world import write_world
from asearcher.producers.service import RolloutTopics
from asearcher.streams.admin import skip_backlog
from asearcher.streams.events import RolloutRequested, TrajectoryFinished
from asearcher.streams.topics import ROLLOUT_REQUESTS, TRAJECTORIES
from tests.rollout_support import ToolWorkerThread, events_of
from tests.trainer_support import tiny_model_dir


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
    qa.write_text('{"id": "q1", "question": "Who?", "answers": ["me"]}\n' * 2)
    runner = CliRunner()
    beyond = runner.invoke(app, ["rollout", "request", "--qa", str(qa), "--limit", "3"])
    assert isinstance(beyond.exception, CliError)
    assert str(beyond.exception) == f"--limit 3 exceeds the 2 questions in {qa}"
    zero = runner.invoke(app, ["rollout", "request", "--qa", str(qa), "--limit", "0"])
    assert isinstance(zero.exception, CliError) and "--limit" in str(zero.exception)


def test_the_readme_rollout_config_is_valid(tmp_path: Path) -> None:
    from asearcher.producers.service import load_rollout_config
    from tests.conftest import readme_toml

    config_file = tmp_path / "rollout.toml"
    config_file.write_text(readme_toml("[staleness]"))
    config = load_rollout_config(config_file)
    assert config.staleness.eta == 4 and config.agent.history_chars == 25_000
    assert config.agent.reward.metric == "f1" and config.topics.requests == "rollout.requests"
