"""An inference engine over vLLM's public async engine, for GPU runs.

Inputs: prompt token ids and `GenerateParams` per call; weight-store versions to switch to.
Outputs: `Generation`s with the sampled ids, their log-probs and the policy version.

Components: `sampling_kwargs` maps `GenerateParams` to `vllm.SamplingParams` (stop strings kept in
the output, special tokens kept, `logprobs=0` so the sampled token's log-prob comes back);
`to_generation` maps a `CompletionOutput` back; `VersionGate` lets generate calls run together
but holds new ones while a weight load waits for those in flight, so every token of a call comes
from one version. `VllmEngine` glues them to `vllm.AsyncLLMEngine` (the v1 `AsyncLLM`).

Weight reload: `download_version` copies the verified version into a local directory, then the
engine points the workers' model config at it and reloads in place through vLLM's public RPC —
`collective_rpc("update_config", args=({"model_config": {"model": dir}},))` followed by
`collective_rpc("reload_weights")`, the pair vLLM's own example
`examples/offline_inference/skip_loading_weights_in_engine_init.py` uses — and finally resets
the prefix cache, whose KV blocks were computed with the old weights.

Log-probs: the engine is started with `logprobs_mode="processed_logprobs"` (vLLM >= 0.10.2), so
they are taken after temperature. vLLM applies top-p before computing them, so they match this
project's definition (after temperature, before top-p) exactly only when top_p == 1.

What was verified here: the module imports without vLLM; constructing `VllmEngine` without vLLM
raises a one-line ImportError naming `pip install 'asearcher[vllm]'`; `sampling_kwargs`,
`to_generation` (on stand-in objects shaped like vLLM's outputs) and `VersionGate` have tests.
What was not: nothing here has ever run against a real vLLM (no GPU, vLLM not installed) —
the engine arguments, the RPC method names and the output fields follow vLLM's documentation
and source, unexercised.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from asearcher.producers.engines.base import FinishReason, GenerateParams, Generation
from asearcher.producers.engines.hf_engine import HFTokenizer
from asearcher.streams.service.log import get_logger

log = get_logger(__name__)
INSTALL_HINT = "vLLM is not installed: pip install 'asearcher[vllm]'"


def import_vllm() -> Any:
    """The `vllm` module, or a one-line ImportError saying how to install it."""
    try:
        import vllm
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    return vllm


def sampling_kwargs(params: GenerateParams) -> dict[str, Any]:
    """Keyword arguments of `vllm.SamplingParams` for `params`."""
    return {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_new_tokens,
        "stop": list(params.stop),
        "seed": params.seed,
        "logprobs": 0,  # only the sampled token's log-prob
        # The agent reads the closing tag, and decoding must give back the tokens' text.
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
    }


def to_generation(output: Any, version: int) -> Generation:
    """A `Generation` from a finished vLLM `CompletionOutput` sampled with `logprobs=0`."""
    token_ids = [int(t) for t in output.token_ids]
    if output.logprobs is None or len(output.logprobs) != len(token_ids):
        raise RuntimeError("vLLM returned no log-prob per token; was logprobs=0 set?")
    logprobs = [
        float(step[token].logprob) for step, token in zip(output.logprobs, token_ids, strict=True)
    ]
    reason, stop = _finish(output.finish_reason, output.stop_reason)
    return Generation(
        token_ids=token_ids, logprobs=logprobs, finish_reason=reason, version=version, stop=stop
    )


def _finish(
    finish_reason: str | None, stop_reason: int | str | None
) -> tuple[FinishReason, str | None]:
    if finish_reason == "length":
        return "length", None
    if finish_reason == "stop":
        # vLLM says "stop" for eos too; a stop *string* is named in stop_reason.
        return ("stop", stop_reason) if isinstance(stop_reason, str) else ("eos", None)
    raise RuntimeError(f"vLLM request ended with finish_reason={finish_reason!r}")


class VersionGate:
    """Many generate calls at once, or one weight load alone; a waiting load goes first.

    A load waits for the calls in flight (they finish with the old weights) and holds new calls
    until it is done, so no call mixes two versions and a steady stream of calls cannot starve
    a load.
    """

    def __init__(self) -> None:
        self._condition = asyncio.Condition()
        self._active = 0
        self._loading = False
        self._loads_waiting = 0

    @asynccontextmanager
    async def generating(self) -> AsyncIterator[None]:
        """Hold the current weights for one generate call."""
        async with self._condition:
            await self._condition.wait_for(lambda: not self._loading and not self._loads_waiting)
            self._active += 1
        try:
            yield
        finally:
            async with self._condition:
                self._active -= 1
                self._condition.notify_all()

    @asynccontextmanager
    async def loading(self) -> AsyncIterator[None]:
        """Exclusive access for a weight swap."""
        async with self._condition:
            self._loads_waiting += 1
            try:
                await self._condition.wait_for(lambda: not self._loading and self._active == 0)
            finally:
                self._loads_waiting -= 1
            self._loading = True
        try:
            yield
        finally:
            async with self._condition:
                self._loading = False
                self._condition.notify_all()


class VllmEngine:
    """`InferenceEngine` over `vllm.AsyncLLMEngine`; needs vLLM and (in practice) a GPU."""

    def __init__(
        self,
        model_dir: str | Path,
        version: int = 0,
        storage_options: dict[str, Any] | None = None,
        *,
        weights_dir: str | Path | None = None,
        **engine_kwargs: Any,
    ) -> None:
        """Start vLLM on `model_dir`; `engine_kwargs` go to `vllm.AsyncEngineArgs`.

        Loaded versions are downloaded under `weights_dir` (a temporary directory by default).
        """
        vllm = import_vllm()
        from transformers import AutoTokenizer

        self._vllm = vllm
        args = vllm.AsyncEngineArgs(
            model=str(model_dir), logprobs_mode="processed_logprobs", **engine_kwargs
        )
        self._engine = vllm.AsyncLLMEngine.from_engine_args(args)
        self._tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(model_dir))
        self._version = version
        self._storage_options = storage_options
        self._weights_dir = Path(weights_dir or tempfile.mkdtemp(prefix="asearcher-vllm-"))
        self._loaded_dir: Path | None = None
        self._gate = VersionGate()

    @property
    def version(self) -> int:
        """The policy version new tokens are generated with."""
        return self._version

    @property
    def tokenizer(self) -> HFTokenizer:
        return self._tokenizer

    async def generate(self, prompt_ids: list[int], params: GenerateParams) -> Generation:
        """Sample a continuation of `prompt_ids`; vLLM batches concurrent calls itself."""
        prompt = self._vllm.TokensPrompt(prompt_token_ids=list(prompt_ids))
        from vllm.sampling_params import RequestOutputKind

        # FINAL_ONLY: one update per call instead of one per token.
        sampling = self._vllm.SamplingParams(
            **sampling_kwargs(params), output_kind=RequestOutputKind.FINAL_ONLY
        )
        async with self._gate.generating():
            version = self._version
            final = None
            async for update in self._engine.generate(prompt, sampling, uuid.uuid4().hex):
                final = update
        if final is None:
            raise RuntimeError("vLLM returned no output")
        return to_generation(final.outputs[0], version)

    async def load_weights(self, uri: str, version: int, sha256: str) -> None:
        """Download and verify `uri`, then reload vLLM's weights from it in place."""
        from asearcher.streams.storage.weight_reader import download_version

        target = self._weights_dir / f"v{version:06d}"
        # Downloaded before taking the gate: generation goes on while the bytes move.
        await asyncio.to_thread(download_version, uri, sha256, target, self._storage_options)
        async with self._gate.loading():
            await self._rpc("update_config", {"model_config": {"model": str(target)}})
            await self._rpc("reload_weights")
            await self._engine.reset_prefix_cache()
            self._version = version
        previous, self._loaded_dir = self._loaded_dir, target
        if previous is not None and previous != target:
            await asyncio.to_thread(shutil.rmtree, previous, True)
        log.info("vLLM now serves policy version %d from %s", version, uri)

    async def close(self) -> None:
        """Shut vLLM down."""
        shutdown: Callable[[], Any] | None = getattr(self._engine, "shutdown", None)
        if shutdown is not None:
            await asyncio.to_thread(shutdown)

    async def _rpc(self, method: str, *args: Any) -> None:
        await self._engine.collective_rpc(method, args=args)
