"""One prompt to an OpenAI-compatible chat-completions endpoint, retried, and its reply parsed.

Shared by the LLM judge (`consumers/scoring/reward.py`) and the model-backed synthesis roles
(`producers/synthesis/llm_roles.py`), so every model behind HTTP (vLLM, SGLang, a hosted API) is
asked the same way:
- `ChatEndpointConfig`: where the endpoint is, which model, the key's environment variable, the
  sampling settings and the retry policy;
- `complete(prompt, config, parse)`: posts one user message and returns `parse(reply)`.
  Network errors, 429/5xx and replies `parse` rejects (returns None) are retried through
  `streams.service.backoff.retry` (jittered waits, Retry-After honoured); any other 4xx, and
  the last failed attempt, raise `EndpointError` with a one-line reason;
- `load_json_object(text)`: the JSON object a model wrote, found tolerantly (a fenced block, the
  outermost braces, a Python-dict literal, or any balanced object in prose).

The API key comes from an environment variable and travels only in the request header: it is
never logged and never part of an error (response bodies are left out of errors for that reason).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Annotated, Any, Generic, TypeVar

import httpx
import msgspec
from msgspec import Meta

from asearcher.streams.service.backoff import Backoff, is_retryable_status, parse_retry_after, retry

T = TypeVar("T")

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.I)
_OUTERMOST = re.compile(r"\{.*\}", re.DOTALL)
# Scanning prose for objects tries json.raw_decode at each "{"; past this many it stops, so a
# long reply full of braces cannot make parsing quadratic.
_MAX_OBJECT_STARTS = 64
_SHOWN_REPLY_CHARS = 80


class ChatEndpointConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A model behind an OpenAI-compatible chat-completions endpoint, and how to ask it."""

    base_url: Annotated[
        str,
        Meta(description='e.g. "http://host:8000/v1"; requests go to {base_url}/chat/completions'),
    ]
    model: Annotated[str, Meta(description="the model name the endpoint serves")]
    api_key_env: Annotated[
        str, Meta(description="variable holding the key; unset or empty means no key")
    ] = "OPENAI_API_KEY"
    max_attempts: Annotated[
        int, Meta(description="attempts per reply, over network errors, 429/5xx and bad replies")
    ] = 3
    timeout_s: Annotated[float, Meta(description="limit for one request")] = 30.0
    backoff_s: Annotated[
        float, Meta(description="ceiling of the first jittered wait, doubling after each failure")
    ] = 0.5
    max_backoff_s: Annotated[
        float, Meta(description="the longest single wait, a server's Retry-After included")
    ] = 10.0
    max_total_backoff_s: Annotated[
        float, Meta(description="the most time spent waiting for one reply")
    ] = 60.0
    temperature: Annotated[float, Meta(description="sampling temperature")] = 0.6
    max_tokens: Annotated[int, Meta(description="the most tokens of one reply")] = 1024

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        for name in ("backoff_s", "max_backoff_s", "max_total_backoff_s"):
            if not getattr(self, name) >= 0:  # also rejects NaN
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")

    def backoff(self) -> Backoff:
        """The retry policy of one reply."""
        return Backoff(
            attempts=self.max_attempts,
            base_s=self.backoff_s,
            cap_s=self.max_backoff_s,
            max_total_s=self.max_total_backoff_s,
        )


class EndpointError(Exception):
    """The endpoint gave no usable reply: it kept failing, refused the request, or replied
    something `parse` rejected every time."""


# --- tolerant JSON ------------------------------------------------------------------------------


def _literal(text: str) -> Any:
    # Single-quoted dicts, True/False and trailing commas are not JSON but are Python literals.
    for load in (json.loads, ast.literal_eval):
        with contextlib.suppress(ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return load(text)
    return None


def _balanced_objects(text: str) -> Iterator[Any]:
    decoder = json.JSONDecoder()
    start = text.find("{")
    for _ in range(_MAX_OBJECT_STARTS):
        if start < 0:
            return
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        yield value
        start = text.find("{", end)


def json_objects(text: str) -> Iterator[dict[str, Any]]:
    """Every JSON object `text` may hold, most likely first: the last fenced code block, the
    outermost `{…}` (JSON or a Python dict literal), then each balanced JSON object in turn."""
    fenced = _FENCE.findall(text)[-1:]
    candidates = [block.strip() for block in fenced] + _OUTERMOST.findall(text)
    for candidate in candidates:
        value = _literal(candidate)
        if isinstance(value, dict):
            yield value
    for value in _balanced_objects(text):
        if isinstance(value, dict):
            yield value


def load_json_object(text: str) -> dict[str, Any] | None:
    """The JSON object a model wrote in `text` (see `json_objects`), or None if there is none."""
    return next(json_objects(text), None)


# --- the request --------------------------------------------------------------------------------


class _Retryable(Exception):
    """A failed attempt worth repeating, with the wait the server asked for, if any."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _Message(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    message: _Message


class _Completion(msgspec.Struct):
    choices: list[_Choice]


@contextlib.asynccontextmanager
async def _http(client: httpx.AsyncClient | None) -> AsyncIterator[httpx.AsyncClient]:
    if client is not None:
        yield client
        return
    async with httpx.AsyncClient() as own:
        yield own


def _reply_text(response: httpx.Response) -> str:
    try:
        message = msgspec.json.decode(response.content, type=_Completion).choices[0].message
    except (msgspec.DecodeError, msgspec.ValidationError, IndexError) as exc:
        raise _Retryable("reply is not a chat completion") from exc
    return message.content or ""


class _Exchange(Generic[T]):
    """The attempts at one reply: the request, the parser, and how many were made."""

    def __init__(self, http: httpx.AsyncClient, prompt: str, config: ChatEndpointConfig,
                 parse: Callable[[str], T | None], what: str) -> None:  # fmt: skip
        self.http, self.config, self.parse, self.what = http, config, parse, what
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        key = os.environ.get(config.api_key_env, "").strip()
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.body = {
            "model": config.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": config.temperature,
            "max_tokens": config.max_tokens,
        }
        self.attempts = 0

    async def attempt(self) -> T:
        """One request; `_Retryable` for a failure worth repeating."""
        self.attempts += 1
        try:
            response = await self.http.post(
                self.url, json=self.body, headers=self.headers, timeout=self.config.timeout_s
            )
        except httpx.TransportError as exc:  # connection failures and timeouts
            raise _Retryable(f"network error: {type(exc).__name__}: {exc}") from exc
        if is_retryable_status(response.status_code):
            wait = parse_retry_after(response.headers.get("retry-after"))
            raise _Retryable(f"HTTP {response.status_code}", retry_after=wait)
        if response.status_code >= 400:
            # Bodies are left out: some servers echo part of the key in an auth error.
            raise EndpointError(f"{self.what} refused the request: HTTP {response.status_code}")
        text = _reply_text(response)
        parsed = self.parse(text)
        if parsed is None:
            raise _Retryable(f"unusable reply {text[:_SHOWN_REPLY_CHARS]!r}")
        return parsed


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, _Retryable)


def _retry_after(exc: BaseException) -> float | None:
    return exc.retry_after if isinstance(exc, _Retryable) else None


async def complete(
    prompt: str,
    config: ChatEndpointConfig,
    parse: Callable[[str], T | None],
    client: httpx.AsyncClient | None = None,
    *,
    what: str = "",
) -> T:
    """`parse` of the endpoint's reply to `prompt`, sent as one user message.

    Retries network errors, 429/5xx responses, replies that are not chat completions and replies
    `parse` maps to None, per `config.backoff()`; then raises `EndpointError`. Other 4xx
    responses raise `EndpointError` at once. `what` names the caller in errors and logs
    (default: the model). `client` is reused when given, else one is opened for this call.
    """
    what = what or f"endpoint {config.model!r}"
    async with _http(client) as http:
        exchange = _Exchange(http, prompt, config, parse, what)
        try:
            return await retry(exchange.attempt, config.backoff(), retryable=_retryable,
                               retry_after=_retry_after, what=what)  # fmt: skip
        except _Retryable as exc:
            raise EndpointError(
                f"{what} gave no usable reply in {exchange.attempts} attempts: {exc}"
            ) from exc
