"""The GPU check command (on CPU here, as it falls back) and the engine's device choice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from asearcher.infra import gpu_check
from asearcher.infra.gpu_check import EngineCheck, StepCheck
from asearcher.producers.engines.hf_engine import TransformersEngine
from asearcher.trainer.runtime import deepspeed_setup
from tests.conftest import DISTRIBUTED_VARIABLES

# Set by in-process DeepSpeed tests run earlier in the session: a child inheriting them would
# join (or bind) this process's rendezvous port instead of making its own one-process world.
needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gpu_check.make_policy(tmp_path_factory.mktemp("gpu-check"))


def without_cuda() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARIABLES}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


@pytest.mark.slow
def test_the_check_falls_back_to_cpu_passes_and_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    command = [sys.executable, "-m", "asearcher.infra.gpu_check", "--out", str(out)]
    done = subprocess.run(
        command, env=without_cuda(), capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert gpu_check.FALLBACK_LINE in lines and lines[-1] == "gpu check passed"
    result = json.loads(out.read_text())
    assert (result["device"], result["fell_back_to_cpu"], result["passed"]) == ("cpu", True, True)
    assert result["torch_version"] == torch.__version__ and result["reason"] is None
    engine, step = result["engine"], result["step"]
    assert engine["passed"] and engine["parameter_device"] == "cpu"
    assert engine["generations"] == engine["largest_batch"] == len(gpu_check.PROMPTS)
    assert engine["tokens"] > 0 and engine["tokens_per_s"] > 0
    assert step["passed"] and step["parameter_device"] == "cpu" and step["seconds"] > 0
    assert step["parameters_changed"] and not step["skipped"]


def test_a_failing_check_fails_the_run_with_a_one_line_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def crashing_step(model_dir: Path, device: str) -> StepCheck:
        raise RuntimeError("optimiser exploded\nsecond line")

    # Stubs: this test is about how verdicts add up, not about the checks themselves.
    monkeypatch.setattr(deepspeed_setup, "prepare_environment", lambda: None)
    monkeypatch.setattr(gpu_check, "make_policy", lambda root: root)
    monkeypatch.setattr(
        gpu_check, "check_engine", lambda d, device: EngineCheck(passed=True, tokens_per_s=1.0)
    )
    monkeypatch.setattr(gpu_check, "check_step", crashing_step)
    assert gpu_check.main(["--device", "auto", "--out", str(tmp_path / "r.json")]) == 1
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["engine"]["passed"] and not result["step"]["passed"]
    assert result["reason"] == "step: RuntimeError: optimiser exploded" and not result["passed"]
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "gpu check FAILED: step: RuntimeError: optimiser exploded"


@needs_no_cuda
def test_asking_for_cuda_without_it_fails_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main(["--device", "cuda"]) == 1
    assert "torch sees no CUDA device" in capsys.readouterr().out.splitlines()[-1]


def test_the_engine_runs_where_it_is_told_and_refuses_unknown_devices(model_dir: Path) -> None:
    engine = TransformersEngine.from_pretrained(model_dir, device="cpu")
    assert engine.device == torch.device("cpu")
    assert next(engine.model.parameters()).device == torch.device("cpu")
    with pytest.raises(AttributeError):
        engine.device = torch.device("cuda")  # type: ignore[misc]  # read-only
    with pytest.raises(ValueError, match="device"):
        TransformersEngine.from_pretrained(model_dir, device="tpu")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with pytest.raises(ValueError, match="device"):
        TransformersEngine(engine.model, tokenizer, device="cuda:x")
    # No device: the model stays where it is.
    assert TransformersEngine(engine.model, tokenizer).device == torch.device("cpu")


@needs_no_cuda
def test_the_engine_says_so_when_cuda_is_asked_for_but_absent(model_dir: Path) -> None:
    with pytest.raises(RuntimeError, match="no CUDA device"):
        TransformersEngine.from_pretrained(model_dir, device="cuda")
    auto = TransformersEngine.from_pretrained(model_dir)  # auto: CPU here
    assert auto.device == torch.device("cpu")
