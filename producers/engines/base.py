"""The one small interface every inference engine implements, and the scripted engine for tests.

An engine turns token ids into more token ids. It never re-tokenises what it produced: the agent
concatenates the ids it gets back, so the trainer sees exactly what the engine generated, with
the behaviour log-prob and the policy version of every token.

Log-probs are those of the distribution the token was sampled from after temperature scaling
and before top-p truncation, so the trainer can recompute them from logits alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Literal, Protocol, runtime_checkable

import msgspec

FinishReason = Literal["stop", "eos", "length"]


class GenerateParams(msgspec.Struct, frozen=True, kw_only=True):
    """How to sample one turn."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 1024
    stop: tuple[str, ...] = ()  # generation ends once the decoded output ends with one of these
    seed: int | None = None


class Generation(msgspec.Struct, frozen=True, kw_only=True):
    """What one generate call produced."""

    token_ids: list[int]
    logprobs: list[float]  # one per token, behaviour policy
    finish_reason: FinishReason
    version: int  # the policy version that produced every token of this call
    stop: str | None = None  # the stop string the output ends with, if any


@runtime_checkable
class Tokenizer(Protocol):
    """Text to ids and back, the two operations the agent needs."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@runtime_checkable
class InferenceEngine(Protocol):
    """Generates from token ids; loads new weights between generate calls."""

    @property
    def version(self) -> int:
        """The policy version new tokens are generated with."""
        ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    async def generate(self, prompt_ids: list[int], params: GenerateParams) -> Generation:
        """Sample a continuation of `prompt_ids`."""
        ...

    async def load_weights(self, uri: str, version: int, sha256: str) -> None:
        """Switch to the weights at `uri` (a weight-store version), verified against `sha256`.

        Takes effect between generate calls: a call in flight finishes with the old weights.
        """
        ...

    async def close(self) -> None: ...


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[int, str | None]:
    """Where the first stop string in `text` ends (len(text) if none), and which one it is."""
    ends = [(text.find(c) + len(c), c) for c in stop if c and c in text]
    return min(ends) if ends else (len(text), None)


class CharTokenizer:
    """One id per Unicode code point: a tokenizer that needs no files, for tests and examples."""

    def encode(self, text: str) -> list[int]:
        return [ord(ch) for ch in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)


Script = Callable[[str], str]


class ScriptedEngine:
    """Replays given outputs, so agent logic under test is deterministic.

    `script` maps the decoded prompt to the next output (e.g. a function of the question and the
    last tool result). Outputs are cut at the first stop string, as a real engine would stop
    there. Log-probs are fixed at `logprob`.
    """

    def __init__(
        self,
        script: Script,
        tokenizer: Tokenizer | None = None,
        logprob: float = -0.5,
        delay_s: float = 0.0,
    ) -> None:
        self._script = script
        self._tokenizer = tokenizer or CharTokenizer()
        self._logprob = logprob
        self._delay_s = delay_s
        self._version = 0
        self.loaded: list[tuple[str, int, str]] = []

    @property
    def version(self) -> int:
        return self._version

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    async def generate(self, prompt_ids: list[int], params: GenerateParams) -> Generation:
        """The script's next output for this prompt, cut at a stop string and the token limit."""
        version = self._version
        if self._delay_s:
            await asyncio.sleep(self._delay_s)
        text = self._script(self._tokenizer.decode(prompt_ids))
        end, stop = cut_at_stop(text, params.stop)
        ids = self._tokenizer.encode(text[:end])
        reason: FinishReason = "stop" if stop is not None else "eos"
        if len(ids) > params.max_new_tokens:
            ids, reason, stop = ids[: params.max_new_tokens], "length", None
        return Generation(
            token_ids=ids,
            logprobs=[self._logprob] * len(ids),
            finish_reason=reason,
            version=version,
            stop=stop,
        )

    async def load_weights(self, uri: str, version: int, sha256: str) -> None:
        """Record the load and switch version (a scripted engine has no weights)."""
        self.loaded.append((uri, version, sha256))
        self._version = version

    async def close(self) -> None:
        return None
