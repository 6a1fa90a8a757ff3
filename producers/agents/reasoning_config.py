"""The reasoning web agent's settings (`[agent.reasoning]`), apart from the agent itself so
that `AgentConfig` can hold them without importing the workflow."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from asearcher.consumers.scoring.chat_endpoint import ChatEndpointConfig


class ReasoningConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The reasoning web agent's model endpoints, context and turn limits."""

    model: Annotated[
        ChatEndpointConfig | None, Meta(description="the reasoning model; None: the rollout engine")
    ] = None
    reader: Annotated[
        ChatEndpointConfig | None, Meta(description="reads results and pages; None: the model")
    ] = None
    max_new_tokens: Annotated[
        int, Meta(description="per call with the rollout engine (an endpoint: its max_tokens)")
    ] = 4096
    temperature: Annotated[
        float, Meta(description="with the rollout engine (an endpoint: its own temperature)")
    ] = 0.6
    history_chars: Annotated[int, Meta(description="the history window each prompt shows")] = 25_000
    chunk_chars: Annotated[
        int, Meta(description="a page is read in chunks of this many characters ...")
    ] = 10_000
    max_chunks: Annotated[int, Meta(description="... at most this many")] = 10
    short_chars: Annotated[
        int, Meta(description="what later prompts show of a chunk already read")
    ] = 100
    answer_after_searches: Annotated[
        int, Meta(description="search results before the answer phase begins")
    ] = 20
    answer_after_acts: Annotated[int, Meta(description="... or calls before it begins")] = 32
    max_acts: Annotated[
        int, Meta(description="calls (act and reading) at most; the last ones may answer")
    ] = 40

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "history_chars", "chunk_chars", "max_chunks",
                     "short_chars", "answer_after_acts", "max_acts"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"reasoning.{name} must be at least 1, got {getattr(self, name)}")
