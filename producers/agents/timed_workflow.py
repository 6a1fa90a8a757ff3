"""A timed stand-in for the agent, to measure the topology rather than the model: workflow
"timed".

Each trajectory takes a number of turns and each turn a number of tokens drawn from
heavy-tailed distributions (the shape of ASearcher's trajectories: most are short, a long tail
runs an order of magnitude longer), and waits what an engine would take to write those tokens
and what a tool call would take to answer (its latency also heavy-tailed), without computing
anything. The trajectory it returns has random token ids, the engine's policy version on every
written token (so staleness is real) and a reward of 0 or 1 (so groups carry a signal and the
trainer trains): the trainer does its real work on it. With the waits on another device, so to
speak, generation and training no longer share this machine's cores. Each turn is a
`GenerationStep` event, as the agent's are, so the bus carries what it carries in a real run
(tool calls are waits here, not events).

With `engine_writes` the run's engine writes each turn's tokens for real (the real CPU policy,
say): the same shape of trajectories, with generation's true cost on this machine.

The workload (`TimedWorkload`) comes from the environment variable
`ASEARCHER_TIMED_WORKLOAD` (JSON of its fields) when set, else its defaults.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import time
from typing import Annotated

import msgspec
from msgspec import Meta

from asearcher.producers.agents.agent import AgentConfig, StepSink, ToolClient
from asearcher.producers.engines.base import GenerateParams, Generation, InferenceEngine
from asearcher.producers.rollout.trajectory import NOT_GENERATED
from asearcher.streams.wire.events import (
    GenerationStep,
    RolloutRequested,
    StepTimings,
    TrajectoryFinished,
    new_id,
)

ENV_WORKLOAD = "ASEARCHER_TIMED_WORKLOAD"
TOKEN_IDS = (16, 400)  # inside any policy vocabulary this project builds


class TimedWorkload(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The shape and speed of the stand-in trajectories. Counts are log-normal: `median`
    and `sigma` of the log (sigma 1.0 puts 1 in 20 trajectories above 5x the median)."""

    turns_median: float = 3.0
    turns_sigma: float = 0.9
    max_turns: int = 40
    tokens_median: Annotated[float, Meta(description="written per turn")] = 96.0
    tokens_sigma: float = 0.8
    max_tokens: int = 1024
    observation_tokens: Annotated[
        int, Meta(description="a tool's answer, in the context, masked out of the loss")
    ] = 64
    prompt_tokens: int = 64
    token_s: Annotated[float, Meta(description="the engine's time per written token")] = 0.002
    tool_median_s: float = 0.2
    tool_sigma: float = 1.0
    reward_rate: Annotated[float, Meta(description="chance of reward 1")] = 0.5
    seed: int | None = None
    engine_writes: Annotated[
        bool,
        Meta(
            description=(
                "True: the run's engine writes each turn's tokens for real (as many as drawn,"
                " or fewer when it ends the sequence), so generation costs what the engine "
                "costs; token_s unused."
            )
        ),
    ] = False

    def __post_init__(self) -> None:
        for name in ("turns_median", "tokens_median", "tool_median_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.token_s < 0 or not 0 <= self.reward_rate <= 1:
            raise ValueError("token_s must be >= 0 and reward_rate within [0, 1]")


def workload_from_env() -> TimedWorkload:
    """The workload `ASEARCHER_TIMED_WORKLOAD` describes, or the defaults; ValueError naming
    the variable when it is not a valid workload."""
    text = os.environ.get(ENV_WORKLOAD)
    if not text:
        return TimedWorkload()
    try:
        return msgspec.json.decode(text, type=TimedWorkload)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        raise ValueError(f"{ENV_WORKLOAD} is not a timed workload: {exc}") from exc


def lognormal_count(rng: random.Random, median: float, sigma: float, cap: int) -> int:
    """A count of at least 1, log-normal around `median`, at most `cap`."""
    return max(1, min(cap, round(rng.lognormvariate(math.log(median), sigma))))


class TimedWorkflow:
    """Plays a stand-in trajectory of the workload's shape (see the module docstring)."""

    def __init__(self, config: AgentConfig, workload: TimedWorkload | None = None) -> None:
        self.workload = workload or workload_from_env()
        self.rng = random.Random(self.workload.seed)

    async def run(
        self,
        engine: InferenceEngine,
        tools: ToolClient,
        steps: StepSink,
        request: RolloutRequested,
        index: int,
    ) -> TrajectoryFinished:
        """A trajectory whose turns wait as an engine and tools would; a step event per turn."""
        w, rng = self.workload, self.rng
        ids = [rng.randrange(*TOKEN_IDS) for _ in range(w.prompt_tokens)]
        mask, versions = [0] * len(ids), [NOT_GENERATED] * len(ids)
        logprobs = [0.0] * len(ids)
        trajectory_id, context = new_id(), list(ids)
        turns = lognormal_count(rng, w.turns_median, w.turns_sigma, w.max_turns)
        for turn in range(turns):
            drawn = lognormal_count(rng, w.tokens_median, w.tokens_sigma, w.max_tokens)
            started = time.monotonic()
            written = await self._write(engine, ids, drawn)
            steps.emit(GenerationStep(
                trajectory_id=trajectory_id, group_id=request.group_id,
                question_id=request.question_id, turn=turn, token_ids=written.token_ids,
                logprobs=written.logprobs, policy_version=written.version,
                context_token_ids=context, finish_reason=written.finish_reason,
                timings=StepTimings(generate_s=time.monotonic() - started),
            ))  # fmt: skip
            ids += written.token_ids
            logprobs += written.logprobs
            mask += [1] * len(written.token_ids)
            versions += [written.version] * len(written.token_ids)
            if turn < turns - 1:
                await asyncio.sleep(rng.lognormvariate(math.log(w.tool_median_s), w.tool_sigma))
                context = [rng.randrange(*TOKEN_IDS) for _ in range(w.observation_tokens)]
                ids += context
                logprobs += [0.0] * len(context)
                mask += [0] * len(context)
                versions += [NOT_GENERATED] * len(context)
        return TrajectoryFinished(
            trajectory_id=trajectory_id, group_id=request.group_id,
            question_id=request.question_id, token_ids=ids, logprobs=logprobs, loss_mask=mask,
            token_versions=versions, prompt_length=w.prompt_tokens,
            reward=float(rng.random() < w.reward_rate), num_turns=turns, finish_reason="answer",
            request_id=request.event_id, group_size=request.group_size, sample_index=index,
            temperature=request.sampling.temperature, metadata=dict(request.metadata),
            purpose=request.purpose,
        )  # fmt: skip

    async def _write(self, engine: InferenceEngine, context: list[int], count: int) -> Generation:
        """`count` tokens after `context`: the engine's (engine_writes) or waited-for ones."""
        if self.workload.engine_writes:
            return await engine.generate(context, GenerateParams(max_new_tokens=count))
        version = engine.version  # the weights the turn would be written with
        await asyncio.sleep(count * self.workload.token_s)
        return Generation(
            token_ids=[self.rng.randrange(*TOKEN_IDS) for _ in range(count)],
            logprobs=[-1.0] * count, finish_reason="length", version=version,
        )  # fmt: skip
