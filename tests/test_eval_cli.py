"""`asearcher eval run` end to end: requests on eval.requests, an evaluator of the job's own,
real tool workers, the faust evaluation processor as a process, the table and the records."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from asearcher.cli.app import app
from asearcher.cli.run.config import load_run_config, paths
from asearcher.consumers.world.world import write_world
from asearcher.producers.rollout.service import RolloutTopics
from asearcher.streams.wire.events import EvalResult, RolloutRequested, TrajectoryFinished
from asearcher.streams.wire.topics import (
    EVAL_REQUESTS,
    EVAL_RESULTS,
    EVAL_TRAJECTORIES,
    TRAJECTORIES,
)
from tests.chat_server import ChatServer as FakeJudge
from tests.support.rollout import ToolWorkerThread, events_of
from tests.support.trainer import tiny_model_dir


@pytest.fixture
def evaluation(broker, settings, codec, world_index, tmp_path: Path):
    """A run home with the world and a tiny policy, tool workers and an evaluation processor."""
    world, index = world_index
    home = tmp_path / "home"
    run_file = tmp_path / "run.toml"
    # A setting of the run's agent that the job's own evaluator must share with the run's.
    run_file.write_text('name = "evalrun"\n[rollout.config.agent]\neval_prompt = "training"\n')
    where = paths(load_run_config(run_file), home)
    write_world(world, where.world_dir)
    model = tiny_model_dir(tmp_path / "policy")
    processor_file = tmp_path / "processor.toml"
    processor_file.write_text(f'app_id = "eval-{uuid.uuid4().hex[:8]}"\n')
    log = (tmp_path / "processor.log").open("w")
    cluster = ["--bootstrap-servers", broker.bootstrap_servers, "--home", str(home)]
    processor = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "asearcher.cli.app",
            "eval",
            "process",
            "-c",
            str(processor_file),
            *cluster,
        ],  # fmt: skip
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    tools = ToolWorkerThread(settings, codec, RolloutTopics(), index.directory,
                             (tmp_path / "results").as_uri(), pool="evalrun")  # fmt: skip
    try:
        with tools:
            yield {
                "run_file": run_file,
                "model": model,
                "cluster": cluster,
                "out": tmp_path / "out",
                "processor_log": tmp_path / "processor.log",
                "run_dir": where.run_dir,
            }
    finally:
        processor.terminate()
        try:
            # It must stop on SIGTERM. Its exit status is not checked: faust's exactly-once
            # worker sometimes fails its final commit on the way out ("Not in the middle of a
            # transaction", a known faust/aiokafka issue); what it did not commit is read again.
            processor.wait(60)
        finally:
            processor.kill()


def eval_run(setup: dict, *options: str):
    command = ["eval", "run", "-c", str(setup["run_file"]), "--model", str(setup["model"]),
               "--timeout", "300", *options, *setup["cluster"]]  # fmt: skip
    return CliRunner().invoke(app, command)


def failure(result) -> str:
    """What a failed command said (a CliError is raised through the runner)."""
    return f"{result.output} {result.exception}"


def row_of(output: str, name: str) -> list[str]:
    """The cells of the table row whose first cell is `name`."""
    for line in output.splitlines():
        cells = [cell.strip() for cell in re.split(r"[│┃|]", line) if cell.strip()]
        if cells and cells[0] == name:
            return cells
    raise AssertionError(f"no row {name!r} in:\n{output}")


def requests_of(settings, codec, eval_id: str) -> list[RolloutRequested]:
    events = events_of(settings, codec, EVAL_REQUESTS)
    requests = [e for e in events if isinstance(e, RolloutRequested)]
    return [r for r in requests if r.metadata.get("eval_id") == eval_id]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_expert_scores_one_and_the_untrained_policy_zero(settings, codec, evaluation) -> None:
    expert = eval_run(evaluation, "--engine", "expert", "--k", "2", "--limit", "4",
                      "--out", str(evaluation["out"]))  # fmt: skip
    assert expert.exit_code == 0, expert.output + evaluation["processor_log"].read_text()[-2000:]
    eval_id = re.search(r"evaluation (\S+):", expert.output).group(1)
    results = [e for e in events_of(settings, codec, EVAL_RESULTS)
               if isinstance(e, EvalResult) and e.eval_id == eval_id]  # fmt: skip
    assert len(results) == 1
    result = results[0]
    assert (result.questions, result.samples_per_question, result.policy_version) == (4, 2, 0)
    assert result.averages["f1"] == result.averages["em"] == result.best_of_k["f1"] == 1.0
    assert result.averages["searches"] + result.averages["accesses"] >= 1  # it used its tools
    # The default profile is the reference's protocol: its budgets, sampling and scoring.
    asked = requests_of(settings, codec, eval_id)
    assert {(r.sampling.max_turns, r.sampling.max_new_tokens_per_turn, r.sampling.temperature,
             r.sampling.top_p, r.metadata["scoring"]) for r in asked} == {
        (64, 4096, 0.6, 0.95, "reference")
    }  # fmt: skip
    # The job's evaluator was set up as the run's are (it once ran the default agent, with the
    # reference's evaluation prompt, whatever the run's config said).
    job_config = json.loads(
        (evaluation["run_dir"] / "config" / f"asearcher-eval-{eval_id}.json").read_text()
    )
    assert job_config["agent"]["eval_prompt"] == "training"
    assert job_config["group_id"] == f"asearcher-eval-{eval_id}"
    cells = row_of(expert.output, "world")
    assert cells[:3] == ["world", "0", "4"] and "1.000" in cells, cells
    # Per-question records: the history the agent saw, its answer, the gold.
    records = [json.loads(line) for line in
               (evaluation["out"] / eval_id / "world.jsonl").read_text().splitlines()]  # fmt: skip
    assert len(records) == 4
    for record in records:
        assert [s["sample_index"] for s in record["samples"]] == [0, 1]
        assert all(s["pred_answer"] in record["gt"] for s in record["samples"])
        assert all("<information>" in "".join(s["history"]) for s in record["samples"])
    # Evaluation trajectories are on their own topic, never on the one the trainer reads.
    played = {
        e.trajectory_id
        for e in events_of(settings, codec, EVAL_TRAJECTORIES)
        if isinstance(e, TrajectoryFinished) and e.metadata.get("eval_id") == eval_id
    }
    assert len(played) == 8
    assert not played & {e.trajectory_id for e in events_of(settings, codec, TRAJECTORIES)}

    untrained = eval_run(evaluation, "--engine", "transformers", "--k", "1", "--limit", "2",
                         "--max-turns", "2", "--max-new-tokens", "16")  # fmt: skip
    assert untrained.exit_code == 0, untrained.output
    untrained_id = re.search(r"evaluation (\S+):", untrained.output).group(1)
    scored = next(e for e in events_of(settings, codec, EVAL_RESULTS)
                  if isinstance(e, EvalResult) and e.eval_id == untrained_id)  # fmt: skip
    assert scored.averages["f1"] == scored.averages["em"] == 0.0
    assert scored.averages["format"] < 1.0 or scored.averages["gen_len"] > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_seeded_evaluation_plays_the_same_trajectories_again(settings, codec, evaluation) -> None:
    def played(*seed: str) -> dict[tuple[str, int], list[int]]:
        """Each (question, sample)'s tokens in one evaluation of the untrained policy."""
        result = eval_run(evaluation, "--engine", "transformers", "--k", "2", "--limit", "2",
                          "--max-turns", "1", "--max-new-tokens", "12",
                          "--temperature", "1.0", "--top-p", "1.0", *seed)  # fmt: skip
        assert result.exit_code == 0, result.output
        eval_id = re.search(r"evaluation (\S+):", result.output).group(1)
        finished = [e for e in events_of(settings, codec, EVAL_TRAJECTORIES)
                    if isinstance(e, TrajectoryFinished)
                    and e.metadata.get("eval_id") == eval_id]  # fmt: skip
        return {(e.question_id, e.sample_index): e.token_ids for e in finished}

    first = played("--seed", "7")
    assert len(first) == 4
    assert played("--seed", "7") == first
    # Another seed draws other tokens (12 tokens at temperature 1 from a random policy).
    assert played("--seed", "8") != first


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_judge_scores_through_the_evaluator(settings, codec, evaluation) -> None:
    fake = FakeJudge([
        (500, "overloaded"),  # retried
        (200, 'not json at all'),  # no verdict: retried
        (200, '```json\n{"rationale": "same", "judgement": "Correct"}\n```'),
    ])  # fmt: skip
    threading.Thread(target=fake.server.serve_forever, args=(0.01,), daemon=True).start()
    try:
        judged = eval_run(evaluation, "--engine", "expert", "--k", "1", "--limit", "2",
                          "--judge", fake.url, "--profile", "training")  # fmt: skip
    finally:
        fake.server.shutdown()
        fake.server.server_close()
    assert judged.exit_code == 0, judged.output
    eval_id = re.search(r"evaluation (\S+):", judged.output).group(1)
    result = next(e for e in events_of(settings, codec, EVAL_RESULTS)
                  if isinstance(e, EvalResult) and e.eval_id == eval_id)  # fmt: skip
    assert result.averages["judge"] == 1.0 and result.best_of_k["judge"] == 1.0
    asked = requests_of(settings, codec, eval_id)
    assert {(r.sampling.max_turns, r.sampling.max_new_tokens_per_turn, r.metadata["scoring"])
            for r in asked} == {(16, 128, "training")}  # fmt: skip
    assert "judge" in judged.output
    assert len(fake.requests) >= 4  # two questions, and the retries of the first
    asked = json.dumps(fake.requests[-1])
    assert "Question" in asked or "question" in asked


def test_eval_run_names_a_bad_option(broker, tmp_path: Path) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text('name = "badopts"\n')
    setup = {"run_file": run_file, "model": tmp_path, "cluster": ["--bootstrap-servers",
             broker.bootstrap_servers, "--home", str(tmp_path)]}  # fmt: skip
    bad_k = eval_run(setup, "--k", "0", "--data", str(tmp_path))
    assert bad_k.exit_code != 0 and "--k" in failure(bad_k)
    bad_profile = eval_run(setup, "--profile", "paper")
    assert "--profile must be one of reference, training, not 'paper'" in failure(bad_profile)
    no_world = eval_run(setup)
    assert no_world.exit_code != 0 and "no world" in failure(no_world)
    (tmp_path / "hotpot").mkdir()
    (tmp_path / "hotpot" / "test.jsonl").write_text('{"question": "Who?", "gt": ["x"]}\n')
    bad_weights = eval_run(setup, "--benchmarks", "hotpot", "--data", str(tmp_path),
                           "--weights", "newest")  # fmt: skip
    assert bad_weights.exit_code != 0 and "--weights" in failure(bad_weights)
    # A version the store does not hold is refused at once, not waited for until the timeout.
    pruned = eval_run(setup, "--benchmarks", "hotpot", "--data", str(tmp_path), "--weights", "v3")
    assert "--weights v3 is not in the weight store" in failure(pruned), failure(pruned)
    assert "holds none" in failure(pruned)
    elsewhere = eval_run(setup, "--benchmarks", "hotpot", "--data", str(tmp_path),
                         "--weights-of", "other")  # fmt: skip
    assert "--weights-of needs --engine" in failure(elsewhere), failure(elsewhere)
    no_data = eval_run(setup, "--benchmarks", "nq")
    assert no_data.exit_code != 0 and "--data" in failure(no_data)
