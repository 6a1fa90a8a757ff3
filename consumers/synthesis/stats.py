"""What a synthesis job produced, counted like the reference's statistics: per accepted question
its injections, fuzzes and supporting facts; the no-tool model's accuracy by how many edits a
candidate had (questions get harder as facts are injected); per gate how many candidates it
let through."""

from __future__ import annotations

from collections import Counter

import msgspec

from asearcher.streams.wire.events import QuestionSynthesized, SynthesisCandidate

GATES = ("quality", "difficulty", "uniqueness")


class GateCounts(msgspec.Struct, kw_only=True):
    """Candidates that reached a gate, and those it passed."""

    gate: str
    checked: int = 0
    passed: int = 0

    @property
    def rate(self) -> float:
        return self.passed / self.checked if self.checked else 0.0


class SynthStats(msgspec.Struct, kw_only=True):
    """Distributions over accepted questions (value -> questions) and the gates' counts."""

    seeds: int
    accepted: int
    injections: dict[int, int]
    fuzzes: dict[int, int]
    facts: dict[int, int]
    # edits -> (candidates the no-tool model answered, the share of its answers that were right)
    no_tool_accuracy: dict[int, tuple[int, float]]
    gates: list[GateCounts]
    role_failures: dict[str, int]

    @property
    def acceptance(self) -> float:
        return self.accepted / self.seeds if self.seeds else 0.0


def action_count(outcome: QuestionSynthesized, action: str) -> int:
    """How many edits of `outcome`'s history were `action`."""
    return sum(edit.action == action for edit in outcome.edits)


def no_tool_accuracy(candidates: list[SynthesisCandidate]) -> dict[int, tuple[int, float]]:
    """By a candidate's number of edits: how many were answered without tools, and the share
    of those answers that were right."""
    right: Counter[int] = Counter()
    asked: Counter[int] = Counter()
    count: Counter[int] = Counter()
    for candidate in candidates:
        edits = len(candidate.edits) - 1  # the base QA is the first entry
        for verdict in candidate.verdicts:
            if verdict.gate == "difficulty" and verdict.answers:
                count[edits] += 1
                asked[edits] += len(verdict.answers)
                right[edits] += verdict.correct
    return {edits: (count[edits], right[edits] / asked[edits]) for edits in sorted(count)}


def _histogram(values: list) -> dict:
    return dict(sorted(Counter(values).items()))


def gate_counts(candidates: list[SynthesisCandidate]) -> list[GateCounts]:
    """Per gate: edited candidates (the base QA is not one) it judged, and those it passed."""
    counts = {gate: GateCounts(gate=gate) for gate in GATES}
    for candidate in candidates:
        if candidate.index == 0:
            continue
        for verdict in candidate.verdicts:
            counts[verdict.gate].checked += 1
            counts[verdict.gate].passed += verdict.passed
    return list(counts.values())


def synth_stats(
    outcomes: list[QuestionSynthesized], candidates: list[SynthesisCandidate]
) -> SynthStats:
    """The statistics of a job's outcomes (one per seed) and of its candidates."""
    accepted = [o for o in outcomes if o.accepted]
    failures: Counter[str] = Counter()
    for outcome in outcomes:
        failures.update(outcome.role_failures)
    return SynthStats(
        seeds=len(outcomes),
        accepted=len(accepted),
        injections=_histogram([action_count(o, "inject") for o in accepted]),
        fuzzes=_histogram([action_count(o, "fuzz") for o in accepted]),
        facts=_histogram([len(o.facts) for o in accepted]),
        no_tool_accuracy=no_tool_accuracy(candidates),
        gates=gate_counts(candidates),
        role_failures=dict(sorted(failures.items())),
    )
