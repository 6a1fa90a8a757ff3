"""Build the inference engine a rollout producer runs, by name."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from asearcher.producers.engines.base import InferenceEngine, ScriptedEngine

if TYPE_CHECKING:
    from asearcher.consumers.world.world import WorldQuestion
    from asearcher.producers.engines.hf_engine import HFTokenizer

EngineKind = Literal["transformers", "vllm", "expert", "endpoint"]
ENGINE_KINDS: tuple[str, ...] = ("transformers", "vllm", "expert", "endpoint")


def make_engine(
    kind: str,
    model_dir: Path,
    *,
    qa_file: Path | None = None,
    mistake_rate: float = 0.0,
    shortcut_rate: float = 0.0,
    quote: bool = False,
    cue: bool = False,
    max_batch: int = 8,
    storage_options: dict[str, Any] | None = None,
    threads: int | None = None,
) -> InferenceEngine:
    """The engine `kind` names; raises ValueError naming what is missing.

    - transformers: the CPU default, a Hugging Face checkpoint in `model_dir`;
    - vllm: the same checkpoint on GPUs (`pip install 'asearcher[vllm]'`);
    - expert: a scripted oracle for the synthetic world's questions in `qa_file` (a
      `qa_*.jsonl`, or the world's directory: every split), writing
      token ids of the policy's tokenizer in `model_dir` (so its trajectories can be trained
      on); it answers wrongly at `mistake_rate`, so groups get mixed rewards, and answers before
      reading what the question needs at `shortcut_rate` (per page); with `quote`, its notes
      copy the sentence of each page that holds what it acts on, with `cue` the words that lead
      to it and it (`ExpertScript`). It does not learn;
    - endpoint: no local model, for a workflow that calls its own model endpoint (the reasoning
      web agent with `[agent.reasoning.model]`); asked to generate, it fails the trajectory.
    """
    if kind not in ENGINE_KINDS:
        raise ValueError(f"engine must be one of {', '.join(ENGINE_KINDS)}, not {kind!r}")
    if kind == "endpoint":
        return ScriptedEngine(_no_local_model)
    if kind in ("transformers", "vllm") and not (model_dir / "config.json").is_file():
        raise ValueError(f"no model in {model_dir}: create one with `asearcher model init`")
    if kind == "transformers":
        from asearcher.producers.engines.hf_engine import TransformersEngine

        return TransformersEngine.from_pretrained(
            model_dir, threads=threads, max_batch=max_batch, storage_options=storage_options
        )
    if kind == "vllm":
        from asearcher.producers.engines.vllm_engine import VllmEngine

        return VllmEngine(model_dir, storage_options=storage_options)
    from asearcher.producers.agents.expert import ExpertScript

    script = ExpertScript(
        _questions(qa_file), mistake_rate=mistake_rate, shortcut_rate=shortcut_rate,
        quote=quote, cue=cue,
    )  # fmt: skip
    return ScriptedEngine(script, _policy_tokenizer(model_dir))


def _no_local_model(prompt: str) -> str:
    raise RuntimeError(
        "engine 'endpoint' has no local model: the workflow must call its own model endpoint "
        "(e.g. [agent.reasoning.model] of workflow asearcher-reasoning)"
    )


def _questions(qa_file: Path | None) -> list[WorldQuestion]:
    """The synthetic world's questions the expert answers."""
    import msgspec

    from asearcher.consumers.world.world import WorldQuestion

    if qa_file is None or not (qa_file.is_file() or qa_file.is_dir()):
        raise ValueError(
            "engine 'expert' needs --qa, a qa_*.jsonl of the synthetic world or its directory"
        )
    files = sorted(qa_file.glob("qa_*.jsonl")) if qa_file.is_dir() else [qa_file]
    decoder = msgspec.json.Decoder(WorldQuestion)
    return [decoder.decode(line) for f in files for line in f.read_bytes().splitlines() if line]


def _policy_tokenizer(model_dir: Path) -> HFTokenizer:
    """The policy's tokenizer, so the expert writes token ids the policy can be trained on."""
    if not (model_dir / "tokenizer.json").is_file():
        # One id per character would reach past the vocabulary of any policy it trains.
        raise ValueError(
            f"engine 'expert' writes the policy's tokens: no tokenizer in {model_dir} "
            "(create the policy with `asearcher model init`)"
        )
    from transformers import AutoTokenizer

    from asearcher.producers.engines.hf_engine import HFTokenizer

    return HFTokenizer(AutoTokenizer.from_pretrained(model_dir))
