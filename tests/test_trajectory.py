"""Training sequences of a trajectory: extended while contexts grow, new when history changes."""

from __future__ import annotations

from asearcher.producers.rollout.trajectory import (
    NOT_GENERATED,
    TrajectoryTokens,
    rebuild_from_steps,
)
from asearcher.streams.wire.events import GenerationStep
from asearcher.streams.wire.packed import Float32s


class Recorder:
    """Plays calls on a `TrajectoryTokens` and keeps the `GenerationStep` of each."""

    def __init__(self, history_chars: int, prompt: list[int]) -> None:
        self.tokens = TrajectoryTokens(history_chars=history_chars)
        self.tokens.set_prompt(prompt)
        self.steps: list[GenerationStep] = []
        self.contexts: list[list[int]] = []

    def call(self, ids: list[int], text: str, version: int = 0) -> tuple[list[int], bool]:
        self.contexts.append(self.tokens.context())
        logprobs = [-0.5 - 0.1 * i for i in range(len(ids))]
        self.tokens.add_generated(ids, logprobs, version, text)
        context, new_sequence = self.tokens.step_context()
        self.steps.append(
            GenerationStep(
                trajectory_id="t", turn=len(self.steps), token_ids=ids, logprobs=logprobs,
                policy_version=version, context_token_ids=context, new_sequence=new_sequence,
            )
        )  # fmt: skip
        return context, new_sequence


def sequences(tokens: TrajectoryTokens) -> list[list[int]]:
    edges = [0, *tokens.sequence_starts, len(tokens.token_ids)]
    return [tokens.token_ids[a:b] for a, b in zip(edges, edges[1:], strict=False)]


def test_without_truncation_one_sequence_holds_the_old_flat_layout() -> None:
    play = Recorder(history_chars=1_000, prompt=[1, 2])
    assert play.tokens.token_ids[: play.tokens.prompt_length] == [1, 2]  # there before a call
    assert play.call([10, 11], "four") == ([1, 2], False)
    play.tokens.add_observation([20, 21, 22], "obs")
    assert play.call([12], "x", version=1) == ([20, 21, 22], False)
    tokens = play.tokens
    assert tokens.sequence_starts == []
    assert tokens.token_ids == [1, 2, 10, 11, 20, 21, 22, 12]
    assert tokens.loss_mask == [0, 0, 1, 1, 0, 0, 0, 1]
    assert tokens.token_versions == [-1, -1, 0, 0, -1, -1, -1, 1]
    assert tokens.logprobs == [0.0, 0.0, -0.5, -0.6, 0.0, 0.0, 0.0, -0.5]
    assert tokens.prompt_length == 2 and tokens.truncations == 0
    assert play.contexts == [[1, 2], [1, 2, 10, 11, 20, 21, 22]]


def test_a_cut_history_starts_a_new_sequence_with_the_whole_context_masked() -> None:
    play = Recorder(history_chars=10, prompt=[1, 2])
    play.call([10, 11], "aaaa")  # 4 characters
    play.tokens.add_observation([20, 21, 22], "bbbbb")  # 9 in all: fits
    play.call([12], "cc")
    play.tokens.add_observation([30], "ddd")  # 14 in all: "aaaa" is cut
    context, new_sequence = play.call([13, 14], "ee", version=2)
    tokens = play.tokens
    assert context == [1, 2, 20, 21, 22, 12, 30] and new_sequence
    assert tokens.truncations == 1
    assert tokens.sequence_starts == [8]
    assert sequences(tokens) == [[1, 2, 10, 11, 20, 21, 22, 12], [*context, 13, 14]]
    # The second sequence shows the earlier output (12) again, as masked context.
    assert tokens.loss_mask[8:] == [0] * 7 + [1, 1]
    assert tokens.token_versions[8:] == [NOT_GENERATED] * 7 + [2, 2]
    assert tokens.logprobs[8:] == [0.0] * 7 + [-0.5, -0.6]
    assert len(tokens) == len(context) + 2  # the conversation, not the flat lists
    assert len(tokens.token_ids) == 17


def test_a_short_form_is_shown_after_the_full_form_was_read() -> None:
    play = Recorder(history_chars=1_000, prompt=[1])
    play.call([10], "a")
    play.tokens.add_observation([20, 21, 22, 23], "the whole page", short=([25], "the"))
    assert play.call([11], "b") == ([20, 21, 22, 23], False)  # read in full
    context, new_sequence = play.call([12], "c")  # the page is now shown short
    assert (context, new_sequence) == ([1, 10, 25, 11], True)
    play.tokens.add_observation([30], "x")
    assert play.call([13], "d") == ([30], False)  # extends the second sequence
    tokens = play.tokens
    assert sequences(tokens) == [[1, 10, 20, 21, 22, 23, 11], [1, 10, 25, 11, 12, 30, 13]]
    assert tokens.loss_mask == [0, 1, 0, 0, 0, 0, 1] + [0, 0, 0, 0, 1, 0, 1]
    assert tokens.truncations == 0


def test_the_short_form_counts_its_own_characters_against_the_history() -> None:
    play = Recorder(history_chars=6, prompt=[1])
    play.call([10], "aaa")
    play.tokens.add_observation([20, 21], "a long page", short=([25], "sh"))
    play.call([11], "b")  # the full page alone is over the limit, but the newest always stays
    assert play.contexts[-1] == [1, 20, 21] and play.tokens.truncations == 1
    play.call([12], "c")  # "aaa" + "sh" + "b" = 6 characters: nothing cut any more
    assert play.contexts[-1] == [1, 10, 25, 11]
    assert play.tokens.truncations == 1


def test_len_follows_the_conversation_the_engine_sees() -> None:
    tokens = TrajectoryTokens(history_chars=100)
    tokens.set_prompt([1, 2, 3])
    assert len(tokens) == 3
    tokens.add_observation([4, 5], "ob")
    assert len(tokens) == 5
    assert tokens.context() == [1, 2, 3, 4, 5]
    tokens.add_generated([6], [-1.0], 0, "g")
    tokens.add_observation([7], "o")
    assert len(tokens) == 7


def test_add_generated_without_context_uses_the_context_the_call_would_get() -> None:
    tokens = TrajectoryTokens(history_chars=100)
    tokens.set_prompt([1])
    tokens.add_generated([5], [-1.0], 0, "a")
    tokens.add_observation([6], "b")
    tokens.add_generated([7], [-1.0], 0, "c")
    assert tokens.token_ids == [1, 5, 6, 7] and tokens.step_context() == ([6], False)


def test_rebuild_from_steps_gives_the_flat_lists_and_sequence_starts() -> None:
    play = Recorder(history_chars=12, prompt=[1, 2])
    for turn in range(6):
        play.call([100 + turn, 200 + turn], "out" * (turn % 3 + 1), version=turn // 2)
        short = ([60 + turn], "s") if turn % 2 else None
        play.tokens.add_observation([50 + turn] * 3, "observation"[: 3 + turn], short)
    play.call([99], "end", version=3)
    tokens = play.tokens
    assert len(tokens.sequence_starts) >= 2  # several breaks, for both reasons
    rebuilt = rebuild_from_steps(list(reversed(play.steps)))  # order by turn, not arrival
    assert rebuilt.token_ids == tokens.token_ids
    assert rebuilt.logprobs == Float32s(tokens.logprobs).tolist()  # steps carry float32
    assert rebuilt.loss_mask == tokens.loss_mask
    assert rebuilt.token_versions == tokens.token_versions
    assert rebuilt.sequence_starts == tokens.sequence_starts
    # Every output was trained once, right after the context it was generated from.
    for context, step in zip(play.contexts, play.steps, strict=True):
        found = [
            s for s in sequences(tokens) if s[: len(context) + len(step.token_ids)]
            == context + step.token_ids
        ]  # fmt: skip
        assert found, step.turn


def test_rebuild_from_old_steps_is_one_sequence() -> None:
    steps = [
        GenerationStep(trajectory_id="t", turn=0, token_ids=[5], logprobs=[-1.0],
                       policy_version=0, context_token_ids=[1, 2]),
        GenerationStep(trajectory_id="t", turn=1, token_ids=[7], logprobs=[-2.0],
                       policy_version=1, context_token_ids=[6]),
    ]  # fmt: skip
    rebuilt = rebuild_from_steps(steps)
    assert rebuilt.token_ids == [1, 2, 5, 6, 7] and rebuilt.sequence_starts == []
    assert rebuilt.loss_mask == [0, 0, 1, 0, 1]
