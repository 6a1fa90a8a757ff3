"""An inference engine with torch and transformers: any Hugging Face causal LM directory, on
CPU or a CUDA device.

Inputs: prompt token ids and `GenerateParams` per call; weight-store versions to switch to.
Outputs: `Generation`s — token ids, the behaviour log-prob of each and the policy version.

Components: one worker thread (a single-thread executor the engine owns) runs everything that
touches the model, so torch never blocks the asyncio loop and a weight load always falls between
two batches. Calls that arrive while the worker is busy wait in a queue; the worker takes up to
`max_batch` of them and decodes them as one left-padded batch with a KV cache. Each row samples
with its own temperature, top-p and `torch.Generator`, and stops on its own (eos, a stop string
or its token limit); a finished row is still fed to the model but its output is frozen.

Log-probs are log_softmax(logits / temperature) at the sampled token, before top-p truncation
(log_softmax(logits) for greedy), as `asearcher.producers.engines.base` defines them.

On a CUDA device the forward passes run there; each step's last-position logits come back to the
CPU for sampling, so every device samples with the same code and per-row CPU generators (GPU
logits can still differ from CPU ones in the last bits, and so can what is sampled from them).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asearcher.producers.engines.base import FinishReason, GenerateParams, Generation, cut_at_stop
from asearcher.streams.service.log import get_logger
from asearcher.streams.storage.state_dicts import fit_state_dict

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = get_logger(__name__)
# Extra tokens decoded before a stop string's bytes: a window that starts inside a multi-byte
# character decodes that character as U+FFFD, which must not eat into the stop string.
_STOP_WINDOW_MARGIN = 4
_DEVICE_NAME = re.compile(r"cpu|cuda(:\d+)?")


def resolve_device(device: str | torch.device) -> torch.device:
    """The torch device `device` names: "auto" (CUDA when torch sees one, else CPU), "cpu",
    "cuda" or "cuda:N". Raises ValueError on anything else and RuntimeError when CUDA is asked
    for but torch sees none (a clear message, not a failure deep inside the first `.to`)."""
    import torch

    if isinstance(device, torch.device):
        device = str(device)
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not _DEVICE_NAME.fullmatch(device):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, not {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} asked for, but torch sees no CUDA device")
    return torch.device(device)


class HFTokenizer:
    """A transformers tokenizer as the agent's `Tokenizer`: adds no special tokens, drops none."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self.eos_token_id: int | None = tokenizer.eos_token_id
        self.pad_token_id: int = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_id or 0
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without bos/eos."""
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`, tags and special tokens included."""
        return self._tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )


def tensor_checksum(tensors: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order."""
    import torch

    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def sample_token(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator
) -> tuple[int, float]:
    """(token, its log-prob) from one row of float logits; temperature 0 is greedy."""
    import torch

    if temperature <= 0:
        token = int(torch.argmax(logits))
        return token, float(torch.log_softmax(logits, dim=-1)[token])
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    probs = logprobs.exp()
    if top_p < 1.0:
        probs = _top_p(probs, top_p)
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logprobs[token])


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """`probs` with everything outside the smallest set of mass >= top_p zeroed (unnormalised)."""
    ordered, order = probs.sort(descending=True)
    # A token stays if the mass before it is still short of top_p: the first always stays.
    drop = (ordered.cumsum(dim=-1) - ordered) >= top_p
    return probs.scatter(-1, order, ordered.masked_fill(drop, 0.0))


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    params: GenerateParams
    future: Future[Generation] = field(default_factory=Future)


@dataclass(eq=False)
class _Load:
    source: str | Mapping[str, torch.Tensor]  # a weight-store version's uri, or the tensors
    version: int
    sha256: str
    future: Future[None] = field(default_factory=Future)


@dataclass(eq=False)
class _Row:
    """One request's decoding state inside a batch."""

    params: GenerateParams
    limit: int
    generator: torch.Generator
    window: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: FinishReason | None = None
    stop: str | None = None

    def advance(self, logits: torch.Tensor, tokenizer: HFTokenizer) -> None:
        """Sample the next token unless finished, then decide whether the row is done."""
        if self.finish is not None:
            return
        token, logprob = sample_token(
            logits, self.params.temperature, self.params.top_p, self.generator
        )
        self.ids.append(token)
        self.logprobs.append(logprob)
        if token == tokenizer.eos_token_id:
            self.finish = "eos"
        elif self.params.stop and self._stopped(tokenizer):
            self.finish = "stop"
        elif len(self.ids) >= self.limit:
            self.finish = "length"

    def _stopped(self, tokenizer: HFTokenizer) -> bool:
        # Checked after every token, so a stop string can only just have been completed: the
        # tail holds it, and the output already ends at the token that completes it.
        _, self.stop = cut_at_stop(tokenizer.decode(self.ids[-self.window :]), self.params.stop)
        return self.stop is not None

    def generation(self, version: int) -> Generation:
        return Generation(
            token_ids=self.ids,
            logprobs=self.logprobs,
            finish_reason=self.finish or "length",
            version=version,
            stop=self.stop,
        )


@dataclass
class EngineStats:
    """What the worker has done so far."""

    batches: int = 0
    calls: int = 0
    largest_batch: int = 0
    tokens: int = 0

    def record(self, generations: Sequence[Generation]) -> None:
        self.batches += 1
        self.calls += len(generations)
        self.largest_batch = max(self.largest_batch, len(generations))
        self.tokens += sum(len(g.token_ids) for g in generations)


class TransformersEngine:
    """`InferenceEngine` over a transformers causal LM on CPU or CUDA, batching concurrent calls.

    `device` moves the model there; None keeps it where it is (on CPU, as loaded).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        version: int = 0,
        max_batch: int = 8,
        storage_options: dict[str, Any] | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        if device is not None:
            model = model.to(resolve_device(device))
        # Where the parameters are, index included: "cuda" puts them on "cuda:0".
        self._device = next(model.parameters()).device
        self._model = model.eval()
        self._tokenizer = HFTokenizer(tokenizer)
        self._version = version
        self._max_batch = max_batch
        self._storage_options = storage_options
        self._max_positions: int | None = getattr(model.config, "max_position_embeddings", None)
        # Generate calls and weight loads, in call order: a load is a barrier between batches.
        self._pending: deque[_Request | _Load] = deque()
        self._lock = threading.Lock()
        self._closed = False
        self.stats = EngineStats()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | Path,
        version: int = 0,
        threads: int | None = None,
        storage_options: dict[str, Any] | None = None,
        *,
        max_batch: int = 8,
        dtype: str = "float32",
        device: str = "auto",
    ) -> TransformersEngine:
        """Load the model and tokenizer of a Hugging Face directory (ours or e.g. Qwen2.5-7B).

        `threads` sets torch's intra-op thread count, which is process-wide. `dtype` is a torch
        dtype name or "auto" (the checkpoint's); float32 keeps batched and unbatched greedy
        outputs identical on CPU. `device` is "auto" (CUDA when torch sees one), "cpu", "cuda" or
        "cuda:N". `storage_options` are passed to fsspec when `load_weights` reads the weight
        store.
        """
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads is not None:
            torch.set_num_threads(threads)
        target = resolve_device(device)  # before loading: a bad name fails fast
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype)
        return cls(
            model, tokenizer, version=version, max_batch=max_batch,
            storage_options=storage_options, device=target,
        )  # fmt: skip

    @property
    def version(self) -> int:
        """The policy version new tokens are generated with."""
        return self._version

    @property
    def device(self) -> torch.device:
        """Where the model runs (its parameters and every batch's inputs)."""
        return self._device

    @property
    def tokenizer(self) -> HFTokenizer:
        return self._tokenizer

    @property
    def model(self) -> PreTrainedModel:
        """The model itself; touch it only between calls (the worker thread owns it)."""
        return self._model

    async def generate(self, prompt_ids: list[int], params: GenerateParams) -> Generation:
        """Sample a continuation of `prompt_ids`, batched with whatever else is waiting."""
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        if self._max_positions is not None and len(prompt_ids) >= self._max_positions:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room to generate")
        if params.max_new_tokens <= 0:
            return Generation(
                token_ids=[], logprobs=[], finish_reason="length", version=self._version
            )
        return await self._enqueue(_Request(list(prompt_ids), params))

    async def load_weights(self, uri: str, version: int, sha256: str) -> None:
        """Load the weight-store version at `uri`, verified against `sha256`, between batches.

        On any error (wrong hash, missing file, names or shapes that do not fit) the model and
        version are left as they were.
        """
        await self._enqueue(_Load(uri, version, sha256))

    async def load_tensors(self, tensors: Mapping[str, torch.Tensor], version: int) -> None:
        """Load a state dict held in memory (e.g. a trainer's, to score it before publishing
        it), between batches like `load_weights`; on an error the model is left as it was."""
        await self._enqueue(_Load(tensors, version, ""))

    async def close(self) -> None:
        """Finish the batch in progress, fail the calls still queued, stop the worker."""
        with self._lock:
            self._closed = True
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
        error = RuntimeError("the engine was closed before this call ran")
        while self._pending:
            item = self._pending.popleft()
            if item.future.set_running_or_notify_cancel():
                item.future.set_exception(error)

    def state_dict_checksum(self) -> str:
        """`tensor_checksum` of the model's state dict; call it between generate/load calls."""
        return tensor_checksum(self._model.state_dict())

    async def _enqueue(self, item: _Request | _Load) -> Any:
        with self._lock:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._pending.append(item)
        # Submitted on the next loop iteration, so calls started together (asyncio.gather) are
        # all queued before the worker looks and run as one batch. One drain per item; a drain
        # that finds nothing left (an earlier one batched its request) returns at once.
        asyncio.get_running_loop().call_soon(self._schedule_drain)
        return await asyncio.wrap_future(item.future)

    def _schedule_drain(self) -> None:
        try:
            self._executor.submit(self._drain)
        except RuntimeError:
            pass  # closed meanwhile: close() fails what is still queued

    # ------------------------------------------------------------ worker thread

    def _take(self) -> list[_Request] | _Load | None:
        """The next unit of work: a load alone, or up to max_batch consecutive calls.

        A load goes ahead of calls still waiting: they have not started, so running them on the
        new weights costs nothing and makes new versions reach tokens a whole batch sooner.
        """
        with self._lock:
            load = next((item for item in self._pending if isinstance(item, _Load)), None)
            if load is not None:
                self._pending.remove(load)
                return load
            batch: list[_Request] = []
            while len(batch) < self._max_batch and self._pending:
                head = self._pending[0]
                if not isinstance(head, _Request):
                    break
                batch.append(head)
                self._pending.popleft()
            return batch or None

    def _drain(self) -> None:
        unit = self._take()
        if isinstance(unit, _Load):
            if unit.future.set_running_or_notify_cancel():
                _settle(unit.future, self._load, unit.source, unit.version, unit.sha256)
            return
        batch = [r for r in unit or () if r.future.set_running_or_notify_cancel()]
        if not batch:
            return
        try:
            generations = self._run_batch(batch)
        except BaseException as exc:  # every waiting caller must hear about it
            for request in batch:
                request.future.set_exception(exc)
            return
        self.stats.record(generations)
        for request, generation in zip(batch, generations, strict=True):
            request.future.set_result(generation)

    def _run_batch(self, requests: list[_Request]) -> list[Generation]:
        import torch

        version = self._version  # constant for the batch: loads run between batches
        rows = [self._row(request) for request in requests]
        padded = left_pad([r.prompt for r in requests], self._tokenizer.pad_token_id)
        ids, mask, positions = (tensor.to(self._device) for tensor in padded)
        cache = None
        with torch.inference_mode():
            while True:
                out = self._model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
                # Sampling uses CPU generators: one copy of the batch's logits per step.
                cache, logits = out.past_key_values, out.logits[:, -1, :].float().cpu()
                for index, row in enumerate(rows):
                    row.advance(logits[index], self._tokenizer)
                if all(row.finish is not None for row in rows):
                    break
                # A finished row repeats its last token: computed, never read.
                ids = torch.tensor([[row.ids[-1]] for row in rows], device=self._device)
                mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
                positions = positions[:, -1:] + 1
        return [row.generation(version) for row in rows]

    def _row(self, request: _Request) -> _Row:
        import torch

        params = request.params
        generator = torch.Generator()
        if params.seed is None:
            generator.seed()  # nondeterministic
        else:
            generator.manual_seed(params.seed)
        limit = params.max_new_tokens
        if self._max_positions is not None:
            limit = min(limit, self._max_positions - len(request.prompt))
        window = max((len(s.encode()) for s in params.stop), default=0) + _STOP_WINDOW_MARGIN
        return _Row(params=params, limit=limit, generator=generator, window=window)

    def _load(self, source: str | Mapping[str, torch.Tensor], version: int, sha256: str) -> None:
        from asearcher.streams.storage.weight_reader import load_state_dict

        tensors = source
        if isinstance(source, str):
            _, tensors = load_state_dict(source, sha256, self._storage_options)
        complete = fit_state_dict(self._model, tensors)
        # Copies the (CPU) tensors into the parameters in place, wherever those live.
        self._model.load_state_dict(complete, strict=True)
        self._version = version
        where = source if isinstance(source, str) else "memory"
        log.info("loaded policy version %d from %s", version, where)


def _settle(future: Future[Any], work: Callable[..., Any], *args: Any) -> None:
    try:
        result = work(*args)
    except BaseException as exc:  # the caller awaiting the future must hear about it
        future.set_exception(exc)
    else:
        future.set_result(result)


def left_pad(
    prompts: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, attention mask, position ids) of `prompts` right-aligned in one batch."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    # Positions count real tokens only, so a padded row sees the positions it would unpadded.
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    return ids, mask, positions
