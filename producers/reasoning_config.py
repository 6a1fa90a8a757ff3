"""The reasoning web agent's settings (`[agent.reasoning]`), apart from the agent itself so
that `AgentConfig` can hold them without importing the workflow."""

from __future__ import annotations

import msgspec

from asearcher.consumers.chat_endpoint import ChatEndpointConfig


class ReasoningConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The reasoning web agent's model endpoints, context and turn limits."""

    model: ChatEndpointConfig | None = None  # the reasoning model; None: the rollout engine
    reader: ChatEndpointConfig | None = None  # reads results and pages; None: the model
    max_new_tokens: int = 4096  # per call with the rollout engine (an endpoint: its max_tokens)
    temperature: float = 0.6  # with the rollout engine (an endpoint: its own temperature)
    history_chars: int = 25_000  # the history window each prompt shows
    chunk_chars: int = 10_000  # a page is read in chunks of this many characters ...
    max_chunks: int = 10  # ... at most this many
    short_chars: int = 100  # what later prompts show of a chunk already read
    answer_after_searches: int = 20  # search results before the answer phase begins
    answer_after_acts: int = 32  # ... or calls before it begins
    max_acts: int = 40  # calls (act and reading) at most; the last ones may answer

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "history_chars", "chunk_chars", "max_chunks",
                     "short_chars", "answer_after_acts", "max_acts"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"reasoning.{name} must be at least 1, got {getattr(self, name)}")
