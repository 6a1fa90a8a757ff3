"""Synthetic but realistically shaped events: for the demo, the tests and the benchmarks."""

from __future__ import annotations

import random

from asearcher.streams.events import (
    GenerationStep,
    RolloutRequested,
    ToolCallRequested,
    ToolResultReady,
    TrajectoryFinished,
    new_id,
)
from asearcher.streams.records import Outgoing
from asearcher.streams.topics import (
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


def episode(rng: random.Random, question_id: str, turns: int = 3) -> list[Outgoing]:
    """Every event one small agent episode produces: request, turns, tool calls, the trajectory."""
    group_id, trajectory_id = f"g-{question_id}", new_id()
    events = [
        Outgoing(
            ROLLOUT_REQUESTS,
            RolloutRequested(
                question_id=question_id,
                group_id=group_id,
                question=f"Which city was the founder of company {question_id} born in?",
                gold_answers=["Avalon"],
                group_size=1,
            ),
        )
    ]
    for turn in range(turns):
        step = generation_step(
            rng, tokens=rng.randint(32, 128), turn=turn, trajectory_id=trajectory_id,
            group_id=group_id, question_id=question_id, text=f"<search>{question_id}</search>",
        )  # fmt: skip
        call_id = f"{trajectory_id}:{turn}"
        events += [
            Outgoing(ROLLOUT_STEPS, step),
            Outgoing(
                TOOL_CALLS,
                ToolCallRequested(
                    call_id=call_id,
                    trajectory_id=trajectory_id,
                    turn=turn,
                    tool="search",
                    arguments={"query": f"founder {question_id}"},
                ),  # fmt: skip
            ),
            Outgoing(
                TOOL_RESULTS,
                ToolResultReady(
                    call_id=call_id,
                    trajectory_id=trajectory_id,
                    turn=turn,
                    tool="search",
                    text="[1] Avalon Inc. ... founded by J. Doe, born in Avalon.",
                    latency_s=0.01,
                ),  # fmt: skip
            ),
        ]
    finished = trajectory(
        rng, tokens=512, trajectory_id=trajectory_id, group_id=group_id, question_id=question_id,
        answer="Avalon", reward=1.0, reward_parts={"f1": 1.0, "format": 1.0}, num_turns=turns,
    )  # fmt: skip
    events.append(Outgoing(TRAJECTORIES, finished))
    return events
