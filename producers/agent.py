"""The ASearcher agent loop: generate, act, read the tool's answer, repeat, then score.

One call of `run_trajectory` plays one trajectory of a `RolloutRequested` group. Every turn is
emitted as a `GenerationStep` as soon as it is generated; tool actions go out through a
`ToolClient` (Kafka in the service, anything in tests). A malformed action, an exhausted turn
limit or token budget ends the trajectory with a finish reason, never with an exception; tool
failures and timeouts come back to the model as observations.
"""

from __future__ import annotations

import time
from typing import Protocol

import msgspec

from asearcher.consumers.reward import (
    JudgeError,
    RewardBreakdown,
    RewardConfig,
    score_trajectory,
    score_trajectory_with_judge,
)
from asearcher.producers.actions import STOP_STRINGS, information, parse_turn
from asearcher.producers.engine import GenerateParams, Generation, InferenceEngine
from asearcher.producers.prompt import agent_prompt
from asearcher.producers.trajectory import TrajectoryTokens
from asearcher.streams.events import (
    GenerationStep,
    RolloutRequested,
    SamplingSettings,
    StepTimings,
    ToolCallRequested,
    ToolResultReady,
    TrajectoryFinished,
    new_id,
)
from asearcher.streams.log import get_logger

log = get_logger(__name__)

MAX_TURNS_LIMIT = 1024  # the largest turn limit a request may ask for
MAX_GROUP_SIZE = 4096  # the largest group a request may ask for
MAX_NEW_TOKENS_LIMIT = 1 << 20  # tokens per turn: beyond any model's context
# Below this, float32 logits divided by the temperature overflow to inf and sampling fails;
# 0 itself means greedy. Above MAX_TEMPERATURE sampling is uniform noise.
MIN_TEMPERATURE = 0.01
MAX_TEMPERATURE = 100.0
# Engines hand seeds to torch or vLLM generators (64 bits, signed on some paths), and each
# trajectory and turn adds an offset to the request's seed (see `AgentRun._generate`): 2**62
# leaves room for both.
MAX_SEED = 2**62


class AgentConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How the agent runs, beyond the per-request sampling settings."""

    token_budget: int = 32_768  # tokens per trajectory: prompt, generated and tool output
    history_chars: int = 25_000  # history kept in the context, in characters (ASearcher: 25k)
    observation_chars: int = 10_000  # a tool output longer than this is cut, with a note
    tool_timeout_s: float = 30.0  # a result not back by then becomes an error observation
    reward: RewardConfig = msgspec.field(default_factory=RewardConfig)

    def __post_init__(self) -> None:
        for name in ("token_budget", "history_chars", "observation_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.tool_timeout_s <= 0:
            raise ValueError(f"tool_timeout_s must be positive, got {self.tool_timeout_s}")


class ToolClient(Protocol):
    """Runs one tool call; failures come back as a result with `error` set."""

    async def call(self, request: ToolCallRequested) -> ToolResultReady: ...


class StepSink(Protocol):
    """Receives each event of a trajectory as it happens."""

    def emit(self, event: GenerationStep) -> None: ...


class BadRequest(ValueError):
    """A request value the agent cannot run with; `field` names the setting."""

    def __init__(self, field: str, rule: str, value: object) -> None:
        super().__init__(f"{field} must be {rule}, got {value!r}")
        self.field, self.rule, self.value = field, rule, value


def check_request(request: RolloutRequested) -> None:
    """Raise `BadRequest` (a ValueError) naming the bad field of a request the agent cannot run.

    Requests come from anyone who can write to the topic: a value that decodes but would crash
    the engine (NaN, inf, a seed torch refuses) must be refused here, not fail in every replica.
    """
    if not request.question.strip():
        raise BadRequest("question", "non-empty", request.question)
    check_sampling(request.sampling, request.group_size)


def check_sampling(sampling: SamplingSettings, group_size: int) -> None:
    """Raise `BadRequest` naming the first sampling setting or group size the agent cannot run."""
    _check_int("group_size", group_size, 1, MAX_GROUP_SIZE)
    _check_int("sampling.max_turns", sampling.max_turns, 1, MAX_TURNS_LIMIT)
    _check_int(
        "sampling.max_new_tokens_per_turn",
        sampling.max_new_tokens_per_turn,
        1,
        MAX_NEW_TOKENS_LIMIT,
    )
    if sampling.seed is not None:
        _check_int("sampling.seed", sampling.seed, 0, MAX_SEED)
    # Written so that NaN, which fails every comparison, is refused too.
    temperature = sampling.temperature
    if not (temperature == 0 or MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE):
        rule = f"0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}]"
        raise BadRequest("sampling.temperature", rule, temperature)
    if not 0 < sampling.top_p <= 1:
        raise BadRequest("sampling.top_p", "in (0, 1]", sampling.top_p)


def _check_int(field: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise BadRequest(field, f"in {low}..{high}", value)


def cut_observation(text: str, limit: int) -> str:
    """`text`, cut to `limit` characters with a note the model can read."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... cut: {len(text) - limit} more characters not shown]"


class AgentRun:
    """The state of one trajectory while it is played."""

    def __init__(
        self,
        request: RolloutRequested,
        index: int,
        engine: InferenceEngine,
        tools: ToolClient,
        steps: StepSink,
        config: AgentConfig,
    ) -> None:
        self.request, self.index = request, index
        self.engine, self.tools, self.steps, self.config = engine, tools, steps, config
        self.trajectory_id = new_id()
        self.tokens = TrajectoryTokens(history_chars=config.history_chars)
        self.turn_texts: list[str] = []
        # Tool output waiting to enter the context: it does only if another turn follows, so
        # the steps' events always add up to the whole trajectory.
        self.pending: tuple[list[int], str] | None = None

    async def play(self) -> TrajectoryFinished:
        """Run turns until an answer, a format failure, or a limit; then score."""
        prompt = self.engine.tokenizer.encode(agent_prompt(self.request.question))
        self.tokens.set_prompt(prompt)
        finish, format_error = "max_turns", None
        for turn in range(self.request.sampling.max_turns):
            waiting = len(self.pending[0]) if self.pending else 0
            budget = self.config.token_budget - len(self.tokens) - waiting
            if budget <= 0:
                finish = "token_budget"
                break
            text, cut_by_budget = await self._generate(turn, budget)
            parsed = parse_turn(text)
            if parsed.action is None:
                finish = "token_budget" if cut_by_budget else "format_error"
                format_error = parsed.error
                break
            call = parsed.action.tool_call()
            if call is None:
                finish = "answer"
                break
            await self._act(turn, *call)
        return await self._finish(finish, format_error)

    async def _generate(self, turn: int, budget: int) -> tuple[str, bool]:
        """Generate one turn; also says whether the token budget (not the turn limit) cut it."""
        sampling = self.request.sampling
        params = GenerateParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_new_tokens=min(sampling.max_new_tokens_per_turn, budget),
            stop=STOP_STRINGS,
            seed=None if sampling.seed is None else sampling.seed + 7919 * self.index + turn,
        )
        context_ids = self.tokens.token_ids[: self.tokens.prompt_length] if turn == 0 else []
        if self.pending is not None:
            context_ids = self.pending[0]
            self.tokens.add_observation(*self.pending)
            self.pending = None
        started = time.perf_counter()
        generation = await self.engine.generate(self.tokens.context(), params)
        elapsed = time.perf_counter() - started
        text = self.engine.tokenizer.decode(generation.token_ids)
        self.tokens.add_generated(
            generation.token_ids, generation.logprobs, generation.version, text
        )
        self.turn_texts.append(text)
        self.steps.emit(self._step_event(turn, generation, text, elapsed, context_ids))
        per_turn = self.request.sampling.max_new_tokens_per_turn
        return text, generation.finish_reason == "length" and budget < per_turn

    def _step_event(
        self, turn: int, generation: Generation, text: str, elapsed: float, context: list[int]
    ) -> GenerationStep:
        return GenerationStep(
            trajectory_id=self.trajectory_id,
            group_id=self.request.group_id,
            question_id=self.request.question_id,
            turn=turn,
            token_ids=generation.token_ids,
            logprobs=generation.logprobs,
            policy_version=generation.version,
            context_token_ids=context,
            text=text,
            finish_reason=generation.finish_reason,
            timings=StepTimings(generate_s=elapsed),
        )

    async def _act(self, turn: int, tool: str, arguments: dict[str, str]) -> None:
        result = await self.tools.call(
            ToolCallRequested(
                call_id=f"{self.trajectory_id}.{turn}",
                trajectory_id=self.trajectory_id,
                turn=turn,
                tool=tool,
                arguments=arguments,
                timeout_s=self.config.tool_timeout_s,
            )
        )
        body = cut_observation(result.text, self.config.observation_chars)
        block = information(body, result.error)
        self.pending = (self.engine.tokenizer.encode(block), block)

    async def _score(self) -> RewardBreakdown:
        golds, reward = self.request.gold_answers, self.config.reward
        if reward.judge is None:
            return score_trajectory(self.turn_texts, golds, reward)
        try:
            return await score_trajectory_with_judge(
                self.turn_texts, golds, reward, self.request.question
            )
        except JudgeError as exc:
            # A judge that gives no verdict must not lose the trajectory: score it 0 and say so.
            log.warning("judge failed for %s: %s", self.trajectory_id, exc)
            breakdown = score_trajectory(self.turn_texts, golds, reward, judge_score=0.0)
            breakdown.parts["judge_failed"] = 1.0
            return breakdown

    async def _finish(self, finish: str, format_error: str | None) -> TrajectoryFinished:
        score = await self._score()
        tokens = self.tokens
        return TrajectoryFinished(
            trajectory_id=self.trajectory_id,
            group_id=self.request.group_id,
            question_id=self.request.question_id,
            purpose=self.request.purpose,
            token_ids=tokens.token_ids,
            logprobs=tokens.logprobs,
            loss_mask=tokens.loss_mask,
            token_versions=tokens.token_versions,
            prompt_length=tokens.prompt_length,
            answer=score.answer,
            reward=score.reward,
            reward_parts=score.parts,
            num_turns=len(self.turn_texts),
            finish_reason=finish,
            format_error=format_error or score.format_error,
            history_truncations=tokens.truncations,
            request_id=self.request.event_id,
            group_size=self.request.group_size,
            temperature=self.request.sampling.temperature,
        )


async def run_trajectory(
    request: RolloutRequested,
    index: int,
    engine: InferenceEngine,
    tools: ToolClient,
    steps: StepSink,
    config: AgentConfig,
) -> TrajectoryFinished:
    """Play trajectory `index` of `request`'s group to the end and score it."""
    return await AgentRun(request, index, engine, tools, steps, config).play()
