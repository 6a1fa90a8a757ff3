"""A trajectory's tokens as the engine saw them, and the training sequences made from them.

Generated ids are kept exactly as the engine returned them and observations (prompt, tool output)
are encoded once, never re-tokenised together, so the trainer sees exactly the tokens the policy
produced. Tokens the policy did not write carry mask 0, log-prob 0 and version -1.

The context of each LLM call is the prompt plus as much recent history as fits in
`history_chars` characters, cut at segment boundaries (a turn's output, a tool's output), with
observations that have a short form (a page chunk) shown in full once and short afterwards. The
behaviour log-probs of a call were computed on that context, so the trainer must see the same
one. As in ASearcher, a trajectory becomes one or more training sequences: a call whose context
starts with the whole current sequence extends it (the tokens in between masked); any other call
starts a new sequence holding its whole context (masked) and its output. The per-token lists are
the concatenation of the sequences, `sequence_starts` the offsets of every sequence but the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asearcher.streams.wire.events import GenerationStep

NOT_GENERATED = -1  # the version of tokens the policy did not write


@dataclass
class Segment:
    """A run of tokens that entered the history together, and what later contexts show of it."""

    ids: list[int]
    chars: int
    generated: bool
    short: tuple[list[int], int] | None = None  # ids and chars shown once the full form was read
    read: bool = False  # a call has seen the full form

    def shown(self) -> tuple[list[int], int]:
        """The ids and character count this segment contributes to the next context."""
        if self.read and self.short is not None:
            return self.short
        return self.ids, self.chars


@dataclass
class TrajectoryTokens:
    """The conversation the engine sees, and the flat per-token training lists built from it."""

    history_chars: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    sequence_starts: list[int] = field(default_factory=list)
    prompt_length: int = 0
    history: list[Segment] = field(default_factory=list)
    truncations: int = 0
    _prompt: list[int] = field(default_factory=list, init=False, repr=False)
    # Offset of the current sequence in the flat lists, and how many of its tokens the emitted
    # steps already cover.
    _sequence_start: int = field(default=0, init=False, repr=False)
    _reported: int = field(default=0, init=False, repr=False)
    # The last context() and the history's size then, until its output comes back.
    _taken: tuple[list[int], int] | None = field(default=None, init=False, repr=False)
    _step: tuple[list[int], bool] = field(
        default_factory=lambda: ([], False), init=False, repr=False
    )
    _conversation: int = field(default=0, init=False, repr=False)  # see __len__

    def set_prompt(self, ids: list[int]) -> None:
        """The prompt's ids: always at the start of the context, never trained on."""
        self._prompt = list(ids)
        self.prompt_length = len(ids)
        # The first sequence starts with the prompt, so it is in the flat lists at once.
        self._append(ids, [0.0] * len(ids), 0, NOT_GENERATED)
        self._conversation += len(ids)

    def add_observation(
        self, ids: list[int], text: str, short: tuple[list[int], str] | None = None
    ) -> None:
        """Tokens from outside the policy (tool output), never trained on.

        The full form enters the context of the next call; with `short`, every later context
        shows the short form instead.
        """
        short_form = None if short is None else (list(short[0]), len(short[1]))
        self.history.append(Segment(list(ids), len(text), generated=False, short=short_form))
        self._conversation += len(ids)

    def context(self) -> list[int]:
        """The ids of the next call: the prompt plus the newest history that fits."""
        kept: list[list[int]] = []
        used = 0
        for segment in reversed(self.history):
            ids, chars = segment.shown()
            if kept and used + chars > self.history_chars:
                break
            kept.append(ids)
            used += chars
        if len(kept) < len(self.history):
            self.truncations += 1
        context = list(self._prompt)
        for ids in reversed(kept):
            context += ids
        self._taken = (context, len(self.history))
        self._conversation = len(context)
        return list(context)

    def add_generated(self, ids: list[int], logprobs: list[float], version: int, text: str) -> None:
        """The output of the call whose `context()` was taken last, trained on.

        Extends the current training sequence if that sequence is a prefix of the call's
        context, else starts a new sequence with the call's whole context masked.
        """
        if len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} tokens but {len(logprobs)} log-probs")
        if self._taken is None:  # the caller generated without asking: it saw what it would get
            self.context()
        assert self._taken is not None
        context, seen = self._taken
        current = self.token_ids[self._sequence_start :]
        if context[: len(current)] == current:
            gap = context[len(current) :]
            self._step = (context[self._reported :], False)
        else:
            self.sequence_starts.append(len(self.token_ids))
            self._sequence_start = len(self.token_ids)
            gap = context
            self._step = (list(context), True)
        self._append(gap, [0.0] * len(gap), 0, NOT_GENERATED)
        self._append(ids, logprobs, 1, version)
        self._reported = len(self.token_ids) - self._sequence_start
        for segment in self.history[:seen]:
            segment.read = True
        self.history.append(Segment(list(ids), len(text), generated=True))
        self._taken = None
        self._conversation = len(context) + len(ids)

    def step_context(self) -> tuple[list[int], bool]:
        """For the last call's `GenerationStep`: its context tokens not already in the current
        training sequence (all of them if it started a new one), and whether it did."""
        ids, new_sequence = self._step
        return list(ids), new_sequence

    def __len__(self) -> int:
        """Tokens of the conversation as the engine sees it now (the last context, the last
        output and the observations added since), not of the flat training lists."""
        return self._conversation

    def _append(self, ids: list[int], logprobs: list[float], mask: int, version: int) -> None:
        self.token_ids.extend(ids)
        self.logprobs.extend(logprobs)
        self.loss_mask.extend([mask] * len(ids))
        self.token_versions.extend([version] * len(ids))


@dataclass
class RebuiltTrajectory:
    """A trajectory's per-token data as rebuilt from its `GenerationStep` events alone."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    sequence_starts: list[int] = field(default_factory=list)


def rebuild_from_steps(steps: list[GenerationStep]) -> RebuiltTrajectory:
    """Concatenate each step's context tokens (masked) and generated tokens, in turn order,
    starting a new training sequence where a step says its context did not extend the last."""
    rebuilt = RebuiltTrajectory()
    for step in sorted(steps, key=lambda s: s.turn):
        if step.new_sequence and rebuilt.token_ids:
            rebuilt.sequence_starts.append(len(rebuilt.token_ids))
        context, generated = len(step.context_token_ids), len(step.token_ids)
        rebuilt.token_ids += [*step.context_token_ids, *step.token_ids]
        rebuilt.logprobs += [0.0] * context + step.logprobs.tolist()
        rebuilt.loss_mask += [0] * context + [1] * generated
        rebuilt.token_versions += [NOT_GENERATED] * context + [step.policy_version] * generated
    return rebuilt
