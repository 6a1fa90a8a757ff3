"""A trajectory's tokens as they grow: ids, loss mask, behaviour log-probs and versions.

Generated ids are appended exactly as the engine returned them and observations (prompt, tool
output) are encoded once and appended, never re-tokenised together, so the trainer sees exactly
the tokens the policy produced. Tokens the policy did not write carry mask 0, log-prob 0 and
version -1.

The context sent to the engine is the prompt plus as much recent history as fits in
`history_chars` characters, cut at segment boundaries (a turn's output, a tool's output) so ids
are still concatenated rather than re-encoded from cut text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asearcher.streams.events import GenerationStep

NOT_GENERATED = -1  # the version of tokens the policy did not write


@dataclass(frozen=True)
class Segment:
    """A run of tokens that entered the context together."""

    ids: list[int]
    chars: int
    generated: bool


@dataclass
class TrajectoryTokens:
    """Everything the trainer needs per token, plus the segments that make up the history."""

    history_chars: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    prompt_length: int = 0
    history: list[Segment] = field(default_factory=list)
    truncations: int = 0

    def set_prompt(self, ids: list[int]) -> None:
        """The prompt's ids: always kept in the context, never trained on."""
        self._append(ids, [0.0] * len(ids), 0, [NOT_GENERATED] * len(ids))
        self.prompt_length = len(ids)

    def add_generated(self, ids: list[int], logprobs: list[float], version: int, text: str) -> None:
        """Tokens the policy wrote in one turn, trained on."""
        self._append(ids, logprobs, 1, [version] * len(ids))
        self.history.append(Segment(ids, len(text), generated=True))

    def add_observation(self, ids: list[int], text: str) -> None:
        """Tokens that came from outside the policy (tool output), masked out of the loss."""
        self._append(ids, [0.0] * len(ids), 0, [NOT_GENERATED] * len(ids))
        self.history.append(Segment(ids, len(text), generated=False))

    def context(self) -> list[int]:
        """The prompt plus the newest history segments that fit in `history_chars`."""
        kept: list[Segment] = []
        used = 0
        for segment in reversed(self.history):
            if kept and used + segment.chars > self.history_chars:
                break
            kept.append(segment)
            used += segment.chars
        if len(kept) < len(self.history):
            self.truncations += 1
        ids = self.token_ids[: self.prompt_length]
        for segment in reversed(kept):
            ids = ids + segment.ids
        return ids

    def __len__(self) -> int:
        return len(self.token_ids)

    def _append(
        self, ids: list[int], logprobs: list[float], mask: int, versions: list[int]
    ) -> None:
        if len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} tokens but {len(logprobs)} log-probs")
        self.token_ids.extend(ids)
        self.logprobs.extend(logprobs)
        self.loss_mask.extend([mask] * len(ids))
        self.token_versions.extend(versions)


@dataclass
class RebuiltTrajectory:
    """A trajectory's per-token data as rebuilt from its `GenerationStep` events alone."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)


def rebuild_from_steps(steps: list[GenerationStep]) -> RebuiltTrajectory:
    """Concatenate each step's context tokens (masked) and generated tokens, in turn order."""
    rebuilt = RebuiltTrajectory()
    for step in sorted(steps, key=lambda s: s.turn):
        context = len(step.context_token_ids)
        rebuilt.token_ids += step.context_token_ids + step.token_ids
        rebuilt.logprobs += [0.0] * context + step.logprobs
        rebuilt.loss_mask += [0] * context + [1] * len(step.token_ids)
        rebuilt.token_versions += [NOT_GENERATED] * context + [step.policy_version] * len(
            step.token_ids
        )
    return rebuilt
