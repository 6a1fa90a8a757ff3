"""`asearcher ask`: one question played with a chosen weight version, every turn shown."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from asearcher.cli.app import app
from asearcher.consumers.tools.local_index import build_index
from asearcher.consumers.world.world import generate_world, write_world
from asearcher.producers.policy.model_init import init_model
from asearcher.trainer.runtime.weight_publisher import WeightStore


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A run config over a small world, its policy, and a store holding v1 of that policy."""
    root = tmp_path_factory.mktemp("ask")
    world = generate_world(seed=5, entities=60, questions=40)
    files = write_world(world, root / "world")
    build_index(files["corpus"], root / "index", dense=False)
    model_dir = init_model(root / "model", files["corpus"], hidden_size=64, layers=2, seed=2)
    store = WeightStore((root / "weights").as_uri())
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    # v1 differs from the initial policy, so its outputs do too. Its own seeded stream: with
    # the global one, v1 depended on the tests run before (one such v1 said eos at once).
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=noise) * 0.5)
    store.publish_state_dict(1, 1, 0, model.state_dict(), tokenizer_dir=model_dir)
    config = root / "run.toml"
    config.write_text(
        f'name = "ask"\nmodel_dir = "{model_dir}"\nstore = "{store.root_url}"\n'
        f'[data]\nqa = "{files["qa_train"]}"\nindex_dir = "{root / "index"}"\n'
    )
    question = next(q for q in world.questions if q.split == "train" and q.hops == 2)
    return {"config": config, "question": question, "home": root / "home"}


def ask(run: dict, *options: str):
    question = run["question"]
    args = ["ask", question.question, "-c", str(run["config"]), "--home", str(run["home"])]
    return CliRunner().invoke(app, [*args, *options], terminal_width=200)


def test_the_expert_shows_each_turn_and_tool_result_then_its_scored_answer(run: dict) -> None:
    question = run["question"]
    result = ask(run, "--engine", "expert", "--answer", question.answers[0])
    assert result.exit_code == 0, f"{result.output} {result.exception}"
    output = result.output
    assert re.search(r"search\(.+\)", output) and output.count("browse(") == 2  # two hops
    assert "turn 1 · v0" in output and "<search>" in output
    last = " ".join(output[output.rindex("answer:") :].split())  # the line, however wrapped
    assert last.startswith(f"answer: {question.answers[0]} · answer after")
    assert "F1 1.00, EM 1.00" in last
    # In the order they happened: the search's result comes after the call that asked for it.
    assert output.index("<search>") < output.index("search(") < output.index("<access>")
    assert output.index("<access>") < output.index("browse(")


def test_the_policy_plays_the_version_asked_for(run: dict) -> None:
    options = ("--max-turns", "2", "--max-new-tokens", "16")
    first = ask(run, "--weights", "v1", *options)
    assert first.exit_code == 0, f"{first.output} {first.exception}"
    assert "turn 1 · v1" in first.output and "turn 2 · v1" in first.output
    initial = ask(run, "--weights", "0", *options)
    assert "turn 1 · v0" in initial.output
    missing = ask(run, "--weights", "v7", *options)
    assert missing.exit_code != 0 and "--weights v7" in f"{missing.output} {missing.exception}"


def test_a_run_brought_up_before_is_found_by_its_name(run: dict) -> None:
    from asearcher.cli.run.config import load_run_config, paths, write_run_config

    home = run["home"]
    config = load_run_config(run["config"])
    write_run_config(config, paths(config, home))  # as `stream up` (and so `learn`) does
    question = run["question"]
    args = ["ask", question.question, "--run", "ask", "--home", str(home), "--weights", "v1",
            "--max-turns", "1", "--max-new-tokens", "8"]  # fmt: skip
    found = CliRunner().invoke(app, args, terminal_width=200)
    assert found.exit_code == 0, f"{found.output} {found.exception}"
    assert "turn 1 · v1" in found.output
    args[3] = "never-run"
    unknown = CliRunner().invoke(app, args, terminal_width=200)
    assert unknown.exit_code != 0
    assert "run 'never-run' has not been brought up" in f"{unknown.output} {unknown.exception}"


@pytest.mark.parametrize(("question", "options", "why"), [
    ("", (), "question must be non-empty, got ''"),
    ("   ", (), "question must be non-empty, got '   '"),
    ("Who?", ("--max-turns", "0"), "sampling.max_turns must be"),
])  # fmt: skip
def test_a_question_a_producer_would_refuse_is_refused_before_any_model_loads(
    run: dict, question: str, options: tuple[str, ...], why: str
) -> None:
    args = ["ask", question, "-c", str(run["config"]), "--home", str(run["home"]), *options,
            "--model", str(run["home"] / "no-model-here")]  # fmt: skip
    refused = CliRunner().invoke(app, args, terminal_width=200)
    assert refused.exit_code != 0 and why in str(refused.exception)
