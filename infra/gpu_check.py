"""The GPU check: does the model code run on this machine's accelerator, end to end?

Run it whenever a GPU is at hand (a new machine or driver, a torch, transformers or DeepSpeed
upgrade, a change to the engine or the trainer step):

    python -m asearcher.infra.gpu_check [--out result.json] [--device auto|cpu|cuda]

It makes a tiny policy offline in a temporary directory (a generated world, its tokenizer and a
2-layer model) and checks, on the device:

1. engine: `TransformersEngine` generates for a few prompts at once, as one batch; every
   generation has tokens with finite log-probs, and the model's parameters are on the device.
   Figure: generated tokens per second (after a warm-up call).
2. step: a DeepSpeed engine with the trainer's default config takes one GRPO step
   (`train_on_batch`) on rewarded groups; the step is taken (not skipped), the loss is finite,
   the weights change, and the DeepSpeed engine's parameters are on the device. Figure: the
   step's seconds.

`--device auto` uses CUDA when torch sees it; without CUDA it falls back to CPU, says so and
records `fell_back_to_cpu`: the code paths are then checked, not a GPU. It prints a table,
writes the `GpuCheckResult` as JSON to `--out`, and exits 0 only if every check passed (1
otherwise, with a one-line reason).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

if TYPE_CHECKING:
    import torch

    from asearcher.producers.engines.base import Generation
    from asearcher.producers.engines.hf_engine import TransformersEngine
    from asearcher.streams.wire.events import TrajectoryFinished
    from asearcher.trainer.policy.batching import Group

FALLBACK_LINE = "CUDA is not available: falling back to CPU (checks the code paths, not a GPU)"
PROMPTS = (
    "What is the capital of Tholavia?",
    "Question: who founded the university?\n<think>",
    "<search>port city</search>\n\n<information>\nNo results.\n</information>\n\n",
    "Answer: <answer>",
)
NEW_TOKENS = 32
STEP_GROUPS = 4  # groups of two trajectories: 8 rows of 18 tokens
MICRO_BATCH_TOKENS = 40  # two rows per micro-batch: the step accumulates over four


class EngineCheck(msgspec.Struct, kw_only=True):
    """The transformers engine's generation on the device."""

    passed: bool = False
    reason: str | None = None  # why it failed, one line
    parameter_device: str = ""  # where the model's parameters were ("cuda:0", "cpu")
    generations: int = 0
    largest_batch: int = 0  # calls the engine decoded together: all of them when batching works
    tokens: int = 0  # generated tokens, over all generations
    seconds: float = 0.0  # the concurrent generate calls, warm-up excluded
    tokens_per_s: float = 0.0


class StepCheck(msgspec.Struct, kw_only=True):
    """One DeepSpeed optimiser step of the trainer on the device."""

    passed: bool = False
    reason: str | None = None  # why it failed, one line
    parameter_device: str = ""  # where the DeepSpeed engine's parameters were
    initialize_seconds: float = 0.0  # deepspeed.initialize (process group joined before)
    seconds: float = 0.0  # train_on_batch, as its StepResult times it
    loss: float = math.nan
    skipped: bool = True  # train_on_batch dropped the step (non-finite loss or gradient)
    parameters_changed: bool = False


class GpuCheckResult(msgspec.Struct, kw_only=True):
    """Everything one run of the check found: what `--out` receives."""

    device: str  # torch.cuda.get_device_name(), or "cpu"
    torch_version: str
    cuda_version: str | None  # the CUDA torch was built with; None for a CPU-only build
    fell_back_to_cpu: bool  # --device auto found no CUDA: no GPU was checked
    passed: bool  # every check passed
    reason: str | None  # the first failure, one line; None when passed
    seconds: float  # the whole run, making the tiny policy included
    engine: EngineCheck
    step: StepCheck


def pick_device(requested: str) -> tuple[str, bool]:
    """(torch device to check, whether auto fell back to CPU) for `--device`.

    Raises RuntimeError when CUDA is asked for explicitly but torch sees none."""
    import torch

    if requested == "cpu":
        return "cpu", False
    if torch.cuda.is_available():
        return "cuda", False
    if requested == "cuda":
        raise RuntimeError("--device cuda, but torch sees no CUDA device")
    return "cpu", True


def make_policy(root: Path) -> Path:
    """A tiny policy (tokenizer and 2-layer model) made offline under `root`; its directory."""
    from asearcher.consumers.world.world import generate_world, write_world
    from asearcher.producers.policy.model_init import init_model

    world = generate_world(seed=4, entities=40, questions=10)
    corpus = write_world(world, root / "world")["corpus"]
    return init_model(root / "model", corpus, hidden_size=64, layers=2, seed=1)


def one_line(exc: BaseException) -> str:
    """`exc` as one line: its type and the first line of its message."""
    message = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__


Check = TypeVar("Check", EngineCheck, StepCheck)


def guarded(run: Callable[[], Check], failed: Check) -> Check:
    """`run()`, or `failed` with the exception as reason (traceback on stderr) if it raised:
    one check's crash must not hide the other's verdict."""
    try:
        return run()
    except Exception as exc:
        traceback.print_exc()
        failed.reason = one_line(exc)
        return failed


# ------------------------------------------------------------------ engine check


def check_engine(model_dir: Path, device: str) -> EngineCheck:
    """Generate for `PROMPTS` concurrently with a `TransformersEngine` on `device`."""
    from asearcher.producers.engines.hf_engine import TransformersEngine

    engine = TransformersEngine.from_pretrained(model_dir, device=device)
    return asyncio.run(_exercise(engine, device))


async def _exercise(engine: TransformersEngine, device: str) -> EngineCheck:
    from asearcher.producers.engines.base import GenerateParams

    prompts = [engine.tokenizer.encode(text) for text in PROMPTS]
    # Greedy and seeded sampling at several temperatures and a top-p: every sampling path.
    params = [
        GenerateParams(temperature=t, top_p=p, max_new_tokens=NEW_TOKENS, seed=seed)
        for seed, (t, p) in enumerate([(0.0, 1.0), (1.0, 1.0), (0.7, 0.9), (1.3, 1.0)])
    ]
    try:
        # The first call on a GPU loads kernels and allocates the cache: keep it out of the rate.
        await engine.generate(prompts[0], GenerateParams(temperature=0.0, max_new_tokens=4))
        started = time.perf_counter()
        outputs = await asyncio.gather(*map(engine.generate, prompts, params))
        seconds = time.perf_counter() - started
    finally:
        await engine.close()
    check = EngineCheck(
        parameter_device=str(next(engine.model.parameters()).device),
        generations=len(outputs), largest_batch=engine.stats.largest_batch,
        tokens=sum(len(g.token_ids) for g in outputs), seconds=seconds,
    )  # fmt: skip
    check.tokens_per_s = check.tokens / seconds if seconds > 0 else 0.0
    check.reason = _engine_problem(check, outputs, device)
    check.passed = check.reason is None
    return check


def _engine_problem(check: EngineCheck, outputs: list[Generation], device: str) -> str | None:
    """Why the engine check fails, or None."""
    if not _same_device_type(check.parameter_device, device):
        return f"the model's parameters are on {check.parameter_device}, not {device}"
    if check.largest_batch < len(PROMPTS):
        return f"concurrent calls ran in batches of {check.largest_batch}, not {len(PROMPTS)}"
    for number, generation in enumerate(outputs):
        if not generation.token_ids or len(generation.logprobs) != len(generation.token_ids):
            return f"generation {number} has no tokens or a log-prob count that does not match"
        if not all(math.isfinite(x) and x <= 0.0 for x in generation.logprobs):
            return f"generation {number} has a non-finite or positive log-prob"
    return None


def _same_device_type(actual: str, expected: str) -> bool:
    import torch

    return torch.device(actual).type == torch.device(expected).type


# ------------------------------------------------------------------ trainer step check


def check_step(model_dir: Path, device: str) -> StepCheck:
    """One `train_on_batch` step of a DeepSpeed engine (default trainer config) on `device`."""
    import torch
    from transformers import AutoModelForCausalLM

    from asearcher.trainer.policy.objective import ObjectiveConfig
    from asearcher.trainer.policy.step import train_on_batch
    from asearcher.trainer.runtime import deepspeed_setup

    deepspeed_setup.ensure_distributed()
    try:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        started = time.perf_counter()
        engine = deepspeed_setup.initialize(model, deepspeed_setup.deepspeed_config())
        check = StepCheck(initialize_seconds=time.perf_counter() - started)
        check.parameter_device = str(next(engine.module.parameters()).device)
        groups = rewarded_groups(engine.module, engine.device, STEP_GROUPS)
        before = [p.detach().clone() for p in engine.module.parameters()]
        result = train_on_batch(engine, groups, ObjectiveConfig(), MICRO_BATCH_TOKENS)
        after = list(engine.module.parameters())
        check.parameters_changed = any(
            not torch.equal(a, b.detach()) for a, b in zip(before, after, strict=True)
        )
    finally:
        # A process group left open makes torch warn at exit (and leaks gloo/NCCL resources).
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    check.seconds, check.loss = result.stats.seconds, result.stats.loss
    check.skipped = result.skipped
    check.reason = _step_problem(check, device)
    check.passed = check.reason is None
    return check


def _step_problem(check: StepCheck, device: str) -> str | None:
    """Why the step check fails, or None."""
    if not _same_device_type(check.parameter_device, device):
        return f"DeepSpeed put the parameters on {check.parameter_device}, not {device}"
    if check.skipped:
        return "the step was skipped (a non-finite loss or gradient)"
    if not math.isfinite(check.loss):
        return f"the loss is {check.loss}"
    if not check.parameters_changed:
        return "the step left every parameter as it was"
    return None


def rewarded_groups(model: Any, device: torch.device, count: int) -> list[Group]:
    """`count` groups of two: one prompt, a rewarded and an unrewarded random completion, with
    the log-probs `model` gives them now (on-policy samples, as the engine would report)."""
    import torch

    from asearcher.trainer.policy.batching import Group

    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    groups = []
    for number in range(count):
        prompt = torch.randint(1, vocab, (12,), generator=generator).tolist()
        tails = [torch.randint(1, vocab, (6,), generator=generator).tolist() for _ in range(2)]
        name = f"g{number}"
        members = [
            _on_policy(model, device, _completion(prompt, tail, reward, name))
            for tail, reward in zip(tails, (1.0, 0.0), strict=True)
        ]
        groups.append(Group(group_id=name, trajectories=members))
    return groups


def _completion(prompt: list[int], tail: list[int], reward: float, group: str) -> Any:
    """A trajectory whose policy-written tokens are `tail`, with placeholder log-probs."""
    from asearcher.streams.wire.events import TrajectoryFinished, new_id

    ids = prompt + tail
    return TrajectoryFinished(
        trajectory_id=new_id(), group_id=group, question_id=group, token_ids=ids,
        logprobs=[0.0] * len(ids), loss_mask=[0] * len(prompt) + [1] * len(tail),
        token_versions=[-1] * len(prompt) + [0] * len(tail),
        prompt_length=len(prompt), reward=reward, group_size=2,
    )  # fmt: skip


def _on_policy(model: Any, device: torch.device, trajectory: TrajectoryFinished) -> Any:
    """`trajectory` with the log-probs `model` (on `device`) gives its tokens."""
    import torch

    from asearcher.trainer.policy.sequences import micro_batch, token_logprobs

    with torch.no_grad():
        logprobs = token_logprobs(model, micro_batch([trajectory], [0.0]).to(device))[0]
    return msgspec.structs.replace(trajectory, logprobs=[float(x) for x in logprobs.cpu()])


# ------------------------------------------------------------------ running it


def run_checks(requested: str) -> GpuCheckResult:
    """Pick the device, make the tiny policy and run both checks on it."""
    import torch

    started = time.perf_counter()
    device, fell_back = "cpu", False
    try:
        device, fell_back = pick_device(requested)
    except RuntimeError as exc:
        engine, step = EngineCheck(reason=str(exc)), StepCheck(reason=str(exc))
    else:
        if fell_back:
            print(FALLBACK_LINE, flush=True)
        engine, step = _run_both(device)
    return GpuCheckResult(
        device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
        torch_version=str(torch.__version__), cuda_version=torch.version.cuda,
        fell_back_to_cpu=fell_back, passed=engine.passed and step.passed,
        reason=_first_failure(engine, step), seconds=time.perf_counter() - started,
        engine=engine, step=step,
    )  # fmt: skip


def _run_both(device: str) -> tuple[EngineCheck, StepCheck]:
    """Both checks' verdicts on `device`, over a tiny policy made for them."""
    from asearcher.trainer.runtime.deepspeed_setup import prepare_environment

    # DeepSpeed fixes its accelerator when first imported, which transformers may do while
    # loading the engine's model: the environment must be set before either check.
    prepare_environment()
    with tempfile.TemporaryDirectory(prefix="asearcher-gpu-check-") as root:
        try:
            model_dir = make_policy(Path(root))
        except Exception as exc:
            traceback.print_exc()
            reason = f"could not make the tiny policy: {one_line(exc)}"
            return EngineCheck(reason=reason), StepCheck(reason=reason)
        engine = guarded(lambda: check_engine(model_dir, device), EngineCheck())
        step = guarded(lambda: check_step(model_dir, device), StepCheck())
    return engine, step


def _first_failure(engine: EngineCheck, step: StepCheck) -> str | None:
    for name, check in (("engine", engine), ("step", step)):
        if not check.passed:
            return f"{name}: {check.reason or 'failed'}"
    return None


def print_table(result: GpuCheckResult) -> None:
    """The checks as a rich table: check, device, result, figure."""
    from rich.console import Console
    from rich.table import Table

    cuda = result.cuda_version or "none"
    table = Table(title=f"GPU check on {result.device} (torch {result.torch_version}, CUDA {cuda})")
    for column in ("check", "device", "result", "figure"):
        table.add_column(column, justify="right" if column == "figure" else "left")
    rows = (
        ("engine: generate", result.engine, f"{result.engine.tokens_per_s:,.1f} tokens/s"),
        ("trainer: DeepSpeed step", result.step, f"{result.step.seconds:.3f} s"),
    )
    for name, check, figure in rows:
        verdict = "[green]pass[/]" if check.passed else f"[red]FAIL[/] {check.reason or ''}"
        table.add_row(name, check.parameter_device or "-", verdict, figure)
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    """Run the check; 0 if every check passed, 1 otherwise (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m asearcher.infra.gpu_check")
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        # DeepSpeed takes its accelerator and backend from whether CUDA is visible, so a CPU
        # check on a GPU machine hides CUDA from the whole process (before anything touches it).
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    result = run_checks(args.device)
    print_table(result)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_bytes(msgspec.json.format(msgspec.json.encode(result)) + b"\n")
    print(f"gpu check {'passed' if result.passed else 'FAILED: ' + str(result.reason)}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
