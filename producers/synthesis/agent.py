"""The data-synthesis agent: from a seed (a QA pair, or a page) to a harder question that keeps
the seed's answer, or to the reasons there is none.

As in ASearcher's synthesis agent, two model roles share the work:
- the writer (a reasoning model) writes the base QA (from the seed pair, or from a page it read)
  and then, for up to `max_edits` turns, chooses FUZZ (obscure one detail of the question),
  INJECT (pick an entity of the question, read a linked page, and add a fact from it so the
  question needs that page too) or, once allowed, EXIT. The answer never changes; every edit
  keeps the statements (facts, each with the page it is read on) that support the question;
- the checker (an instruct model) judges every candidate: quality (one question, solvable from
  its statements, the answer right), difficulty (the checker answers `no_tool_attempts` times
  without tools and must never be right; the count is recorded) and uniqueness (each wrong
  answer is asked about as a possible alternative answer; any yes rejects). A checker that
  can list its domain's other candidate answers (`alternatives`; the world's graph can) has
  those asked about too, which makes the check exact there.

The base QA is the seed restated: it is checked for quality only and never accepted. A
candidate that fails quality or uniqueness is dropped and the writer edits the one before it;
one that is merely too easy is edited further. The seed's outcome is its last accepted
candidate (the one with the most edits), or, when none passed, its last candidate with every
reason. Pages are read through the tool workers (`browse`), so synthesis scales and fails like
the agent: an error comes back as the page's text being missing, never as a crash.

Roles are behind the `Writer` and `Checker` protocols (`consumers/synthesis/roles.py`): rule-based
ones on the synthetic world (`consumers/synthesis/world_roles.py`), model-backed ones
(`producers/synthesis/llm_roles.py`). A role call that yields nothing usable raises `RoleFailure`;
it is counted by role and action, never fatal.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Annotated

import msgspec
from msgspec import Meta

from asearcher.consumers.scoring.reward import exact_match
from asearcher.consumers.synthesis.roles import Checker, Draft, RoleFailure, Writer
from asearcher.consumers.tools.toolbox import split_page_chunks
from asearcher.producers.agents.agent import ToolClient
from asearcher.streams.wire.events import (
    GateVerdict,
    QuestionSynthesized,
    SynthesisCandidate,
    SynthesisRequested,
    SynthFact,
    ToolCallRequested,
)


class SynthConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How far the agent edits a seed and how hard it checks."""

    max_edits: Annotated[int, Meta(description="FUZZ/INJECT turns per seed")] = 6
    min_edits: Annotated[int, Meta(description="edits before EXIT is allowed")] = 1
    no_tool_attempts: Annotated[
        int, Meta(description="k: answers without tools in the difficulty check")
    ] = 4
    browse_timeout_s: Annotated[
        float, Meta(description="a page not read by then is an error, like the agent's")
    ] = 30.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_edits <= self.max_edits:
            raise ValueError(
                f"need 0 <= min_edits <= max_edits, got {self.min_edits} and {self.max_edits}"
            )
        if self.no_tool_attempts < 1:
            raise ValueError(f"no_tool_attempts must be at least 1, got {self.no_tool_attempts}")
        if not self.browse_timeout_s > 0:
            raise ValueError(f"browse_timeout_s must be positive, got {self.browse_timeout_s}")


def same_answer(answer: str, gold: str) -> bool:
    """Whether two answers agree after SQuAD normalisation (case, articles, punctuation)."""
    return exact_match(answer, [gold]) == 1.0


def supporting_urls(facts: list[SynthFact]) -> list[str]:
    """The pages `facts` are read on, each once, in order."""
    return list(dict.fromkeys(fact.url for fact in facts))


class _Checks:
    """The three gates over one checker, counting its failures."""

    def __init__(self, checker: Checker, attempts: int, failures: collections.Counter[str]):
        self.checker, self.attempts, self.failures = checker, attempts, failures

    async def run(self, draft: Draft, quality_only: bool = False) -> list[GateVerdict]:
        verdicts = [await self._quality(draft)]
        if quality_only or not verdicts[-1].passed:
            return verdicts
        verdicts.append(await self._difficulty(draft))
        if verdicts[-1].passed:
            answers = verdicts[-1].answers
            try:
                answers = [*answers, *await self.checker.alternatives(draft)]
            except RoleFailure as failure:
                self.failures[failure.key] += 1
            verdicts.append(await self._uniqueness(draft, answers))
        return verdicts

    async def _quality(self, draft: Draft) -> GateVerdict:
        try:
            return await self.checker.quality(draft)
        except RoleFailure as failure:
            self.failures[failure.key] += 1
            return GateVerdict(gate="quality", passed=False, reason=f"no verdict: {failure}")

    async def _difficulty(self, draft: Draft) -> GateVerdict:
        answers = []
        for attempt in range(self.attempts):
            try:
                answers.append(await self.checker.answer_without_tools(draft.question, attempt))
            except RoleFailure as failure:
                self.failures[failure.key] += 1
        if not answers:
            return GateVerdict(gate="difficulty", passed=False, reason="no answer without tools")
        correct = sum(same_answer(a, draft.answer) for a in answers)
        reason = f"too easy: {correct} of {len(answers)} answers without tools right"
        return GateVerdict(
            gate="difficulty",
            passed=correct == 0,
            answers=answers,
            correct=correct,
            reason=reason if correct else "",
        )

    async def _uniqueness(self, draft: Draft, answers: list[str]) -> GateVerdict:
        for answer in dict.fromkeys(a for a in answers if a.strip()):
            try:
                alternative = await self.checker.is_alternative(draft, answer)
            except RoleFailure as failure:
                self.failures[failure.key] += 1
                return GateVerdict(gate="uniqueness", passed=False, reason=f"no verdict: {failure}")
            if alternative:
                return GateVerdict(
                    gate="uniqueness",
                    passed=False,
                    reason=f"not unique: {answer!r} also answers it",
                )
        return GateVerdict(gate="uniqueness", passed=True)


async def read_page(
    tools: ToolClient, url: str, seed_id: str, turn: int, timeout_s: float
) -> str | None:
    """The text of `url` through the tool workers (its chunks joined); None on an error."""
    result = await tools.call(
        ToolCallRequested(
            call_id=f"synth-{seed_id}.{turn}",
            trajectory_id=f"synth-{seed_id}",
            turn=turn,
            tool="browse",
            arguments={"url": url},
            timeout_s=timeout_s,
        )
    )
    if not result.ok:
        return None
    chunks = split_page_chunks(result.text)
    return "".join(text for _, text in chunks) if chunks else result.text


CandidateSink = Callable[[SynthesisCandidate], None]


class Synthesis:
    """Synthesis of one seed; `run` plays it."""

    def __init__(
        self,
        seed: SynthesisRequested,
        writer: Writer,
        checker: Checker,
        tools: ToolClient,
        config: SynthConfig,
        sink: CandidateSink,
    ) -> None:
        self.seed, self.writer, self.tools, self.config, self.sink = (
            seed,
            writer,
            tools,
            config,
            sink,
        )
        self.failures: collections.Counter[str] = collections.Counter()
        self.checks = _Checks(checker, config.no_tool_attempts, self.failures)
        self.candidates: list[SynthesisCandidate] = []
        self.reads = 0

    async def run(self) -> QuestionSynthesized:
        """Write, edit and check until EXIT or `max_edits`; the seed's outcome."""
        page = await self._read(self.seed.page_url) if self.seed.page_url else None
        try:
            draft = await self.writer.base(self.seed, page)
        except RoleFailure as failure:
            self.failures[failure.key] += 1
            return self._outcome(None, [f"no base question: {failure}"])
        base = self._candidate(draft, await self.checks.run(draft, quality_only=True), False)
        if not base.verdicts[0].passed:
            return self._outcome(None, [f"base question: {base.verdicts[0].reason}"])
        best: SynthesisCandidate | None = None
        for _ in range(self.config.max_edits):
            may_exit = best is not None and len(draft.edits) - 1 >= self.config.min_edits
            try:
                edited = await self._edit(draft, may_exit)
            except RoleFailure as failure:
                self.failures[failure.key] += 1
                continue  # this turn is lost; the writer tries again from the same draft
            if edited is None:
                break
            verdicts = await self.checks.run(edited)
            candidate = self._candidate(edited, verdicts, all(v.passed for v in verdicts))
            if candidate.accepted:
                best = candidate
            # Too easy: harder edits may still get there. Broken or ambiguous: go back.
            if candidate.accepted or verdicts[-1].gate == "difficulty":
                draft = edited
        return self._outcome(best, [] if best else self._reasons())

    async def _edit(self, draft: Draft, may_exit: bool) -> Draft | None:
        """The writer's next edit of `draft`; None when it exits."""
        action = await self.writer.choose(draft, may_exit)
        if action == "exit" and may_exit:
            return None
        if action == "fuzz" or action == "exit":  # EXIT not allowed yet: obscure instead
            return await self.writer.fuzz(draft)
        url = await self.writer.pick_link(draft)
        return await self.writer.inject(draft, url, await self._read(url))

    async def _read(self, url: str) -> str | None:
        self.reads += 1
        return await read_page(
            self.tools, url, self.seed.seed_id, self.reads, self.config.browse_timeout_s
        )

    def _candidate(
        self, draft: Draft, verdicts: list[GateVerdict], accepted: bool
    ) -> SynthesisCandidate:
        candidate = SynthesisCandidate(
            seed_id=self.seed.seed_id,
            index=len(self.candidates),
            question=draft.question,
            answer=draft.answer,
            facts=draft.facts,
            edits=draft.edits,
            verdicts=verdicts,
            accepted=accepted,
            plan=draft.plan,
        )
        self.candidates.append(candidate)
        self.sink(candidate)
        return candidate

    def _reasons(self) -> list[str]:
        failed = (
            v.reason or f"{v.gate} failed"
            for c in self.candidates[1:]
            for v in c.verdicts
            if not v.passed
        )
        return list(dict.fromkeys(failed)) or ["no edit was made"]

    def _outcome(self, best: SynthesisCandidate | None, reasons: list[str]) -> QuestionSynthesized:
        last = best or (self.candidates[-1] if self.candidates else None)
        seed = self.seed
        return QuestionSynthesized(
            seed_id=seed.seed_id,
            accepted=best is not None,
            question=last.question if last else seed.question,
            answer=last.answer if last else seed.answer,
            seed_question=seed.question,
            supporting_urls=supporting_urls(last.facts) if last else [],
            facts=last.facts if last else [],
            edits=last.edits if last else [],
            verdicts=last.verdicts if last else [],
            candidates=len(self.candidates),
            reasons=reasons,
            role_failures=dict(self.failures),
            metadata=dict(seed.metadata),
        )


async def synthesize(
    seed: SynthesisRequested,
    writer: Writer,
    checker: Checker,
    tools: ToolClient,
    config: SynthConfig,
    sink: CandidateSink = lambda _: None,
) -> QuestionSynthesized:
    """Synthesize from `seed`: every candidate goes to `sink` as it is judged; the outcome."""
    return await Synthesis(seed, writer, checker, tools, config, sink).run()
