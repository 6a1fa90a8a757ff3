"""The two roles of the data-synthesis agent, as protocols, and what they exchange.

The writer (ASearcher: a reasoning model) writes and edits a question; the checker (an instruct
model) judges it. Implementations: rule-based on the synthetic world (`world_roles.py`) and
model-backed (`asearcher.producers.synthesis.llm_roles`); the agent's loop is
`asearcher.producers.synthesis.agent`. A role call that yields nothing usable raises `RoleFailure`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal, Protocol

import msgspec

from asearcher.streams.wire.events import GateVerdict, SynthEdit, SynthesisRequested, SynthFact

Action = Literal["fuzz", "inject", "exit"]
ACTIONS: tuple[str, ...] = ("fuzz", "inject", "exit")


class Draft(msgspec.Struct, frozen=True, kw_only=True):
    """A question being written: its answer, its supporting facts, its history, and the
    writer's own state (`plan`, JSON text; the world writer keeps its chain there)."""

    question: str
    answer: str
    facts: list[SynthFact] = []
    edits: list[SynthEdit] = []
    plan: str = ""


class RoleFailure(Exception):
    """A role call gave nothing usable (a malformed reply, a refusal, an error). `key` names the
    role and the call ("writer.fuzz"), for the seed's failure counts."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key, self.reason = key, reason


class Writer(Protocol):
    """Writes and edits questions (ASearcher: the reasoning model)."""

    async def base(self, seed: SynthesisRequested, page: str | None) -> Draft:
        """The base QA: the seed pair restated with its facts, or one written from `page` (the
        text of `seed.page_url`, None when it could not be read)."""
        ...

    async def choose(self, draft: Draft, may_exit: bool) -> Action:
        """The next action on `draft`; "exit" only when `may_exit`."""
        ...

    async def fuzz(self, draft: Draft) -> Draft:
        """`draft` with one detail obscured; the answer unchanged."""
        ...

    async def pick_link(self, draft: Draft) -> str:
        """The URL of a page linked to an entity of `draft`, to inject a fact from."""
        ...

    async def inject(self, draft: Draft, url: str, page: str | None) -> Draft:
        """`draft` rewritten to need a fact of `page` (the text at `url`; None: unreadable)."""
        ...


class Checker(Protocol):
    """Judges candidates (ASearcher: the instruct model)."""

    async def quality(self, draft: Draft) -> GateVerdict:
        """One question, not a concatenation; solvable from its facts; its answer right."""
        ...

    async def answer_without_tools(self, question: str, attempt: int) -> str:
        """An answer from the model's own knowledge (attempt `attempt` of k)."""
        ...

    async def alternatives(self, draft: Draft) -> list[str]:
        """Answers to ask `is_alternative` about besides the no-tool model's: the candidates a
        checker that knows its domain can list ([] for one that cannot)."""
        ...

    async def is_alternative(self, draft: Draft, answer: str) -> bool:
        """Whether `answer`, which is not the given answer, would also answer the question."""
        ...


class Delayed:
    """A role whose every call first waits `seconds`: a model's latency laid on the rule-based
    roles, so that what scales with model calls (replicas of the processor) can be measured on
    the world without a model."""

    def __init__(self, role: Writer | Checker, seconds: float) -> None:
        self._role, self._seconds = role, seconds

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._role, name)

        async def delayed(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(self._seconds)
            return await call(*args, **kwargs)

        return delayed
