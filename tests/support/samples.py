"""Synthetic but realistically shaped events: for the demo, the tests and the benchmarks."""

from __future__ import annotations

import random

from asearcher.streams.wire.events import (
    GenerationStep,
    RolloutRequested,
    ToolCallRequested,
    ToolResultReady,
    TrajectoryFinished,
    new_id,
)
from asearcher.streams.wire.records import Outgoing
from asearcher.streams.wire.topics import (
    ROLLOUT_REQUESTS,
    ROLLOUT_STEPS,
    TOOL_CALLS,
    TOOL_RESULTS,
    TRAJECTORIES,
)

VOCAB_SIZE = 151_936  # Qwen2 tokenizer


def generation_step(
    rng: random.Random, tokens: int = 256, turn: int = 0, **fields
) -> GenerationStep:
    """A generation turn of `tokens` random tokens with plausible log-probs."""
    return GenerationStep(
        trajectory_id=fields.pop("trajectory_id", new_id()),
        turn=turn,
        token_ids=[rng.randrange(VOCAB_SIZE) for _ in range(tokens)],
        logprobs=[-rng.expovariate(2.0) for _ in range(tokens)],
        policy_version=fields.pop("policy_version", 0),
        **fields,
    )


def trajectory(rng: random.Random, tokens: int = 4096, **fields) -> TrajectoryFinished:
    """A finished trajectory of `tokens` tokens, a quarter of them tool output (masked out)."""
    return TrajectoryFinished(
        trajectory_id=fields.pop("trajectory_id", new_id()),
        group_id=fields.pop("group_id", new_id()),
        question_id=fields.pop("question_id", new_id()),
        token_ids=[rng.randrange(VOCAB_SIZE) for _ in range(tokens)],
        logprobs=[-rng.expovariate(2.0) for _ in range(tokens)],
        loss_mask=[0 if i % 4 == 3 else 1 for i in range(tokens)],
        token_versions=[fields.pop("policy_version", 0)] * tokens,
        **fields,
    )


Action = tuple[str, dict[str, str]]


def episode(
    rng: random.Random,
    question_id: str,
    turns: int = 3,
    *,
    question: str | None = None,
    answers: tuple[str, ...] = ("Avalon",),
    actions: list[Action] | None = None,
    with_results: bool = True,
) -> list[Outgoing]:
    """Every event one scripted agent episode produces: request, turns, tool calls, trajectory.

    Tool results are made up unless `with_results` is False, in which case a real tool worker
    is expected to answer the calls.
    """
    group_id, trajectory_id = f"g-{question_id}", new_id()
    question = question or f"Which city was the founder of company {question_id} born in?"
    actions = actions or [("search", {"query": question})] * turns
    request = RolloutRequested(
        question_id=question_id,
        group_id=group_id,
        question=question,
        gold_answers=list(answers),
        group_size=1,
    )
    events = [Outgoing(ROLLOUT_REQUESTS, request)]
    for turn, (tool, arguments) in enumerate(actions):
        events += _turn(rng, turn, tool, arguments, trajectory_id, group_id, with_results)
    finished = trajectory(
        rng, tokens=512, trajectory_id=trajectory_id, group_id=group_id, question_id=question_id,
        answer=answers[0], reward=1.0, reward_parts={"f1": 1.0, "format": 1.0},
        num_turns=len(actions),
    )  # fmt: skip
    events.append(Outgoing(TRAJECTORIES, finished))
    return events


def _turn(
    rng: random.Random,
    turn: int,
    tool: str,
    arguments: dict[str, str],
    trajectory_id: str,
    group_id: str,
    with_results: bool,
) -> list[Outgoing]:
    tag = {"search": "search", "browse": "access"}.get(tool, tool)
    text = f"<{tag}>{next(iter(arguments.values()), '')}</{tag}>"
    step = generation_step(
        rng, tokens=rng.randint(32, 128), turn=turn, trajectory_id=trajectory_id,
        group_id=group_id, question_id=group_id[2:], text=text,
    )  # fmt: skip
    call_id = f"{trajectory_id}:{turn}"
    call = ToolCallRequested(
        call_id=call_id, trajectory_id=trajectory_id, turn=turn, tool=tool, arguments=arguments
    )
    events = [Outgoing(ROLLOUT_STEPS, step), Outgoing(TOOL_CALLS, call)]
    if with_results:
        result = ToolResultReady(
            call_id=call_id, trajectory_id=trajectory_id, turn=turn, tool=tool,
            text="[1] Avalon Inc. ... founded by J. Doe, born in Avalon.", latency_s=0.01,
        )  # fmt: skip
        events.append(Outgoing(TOOL_RESULTS, result))
    return events
