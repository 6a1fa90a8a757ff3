"""The ASearcher agent: the turn structure of its LLM calls, its tools, its reward.

`AsearcherWorkflow` (the rollout service's default workflow) plays one trajectory of a
`RolloutRequested` group as ASearcher's training agent does:
- the prompt ends with the think priming, so the first call writes its reasoning, `</think>`
  and an action in one call (stopped at the closing action tag);
- a tool's output is queued as observations: a search result is one, a page is one per chunk.
  While observations wait, each call gets the next one appended (followed by the think
  priming) and is stopped at `</think>`: a think call. A page chunk is shown in full to the
  call that reads it and as its first 100 characters to every later one;
- with nothing waiting, the call gets nothing appended and is stopped at the closing action
  tags: an action call. So every action after the first costs two calls, and every call counts
  as a turn against `max_turns`.
`AgentConfig.turns = "single_call"` gives every call the action stops instead: one call per
action, which reads everything its previous action returned. The first complete action of any
call is taken; a call without one, or with a formatting slip, goes on from the model's own
output unless `stop_on_format_error` (the reward's per-call format check zeroes the reward
anyway), and output the model ended (EOS) without an action ends the trajectory. Every call is
emitted as a `GenerationStep` at once; tool failures and timeouts come back as observations.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass
from typing import Annotated, Literal, Protocol

import msgspec
from msgspec import Meta

from asearcher.consumers.formats.prompt_templates import PromptTemplates
from asearcher.consumers.scoring.reward import (
    JudgeError,
    RewardBreakdown,
    RewardConfig,
    evaluation_scoring,
    pages_read_share,
    score_trajectory,
    score_trajectory_with_judge,
)
from asearcher.consumers.tools.toolbox import split_page_chunks
from asearcher.producers.agents.actions import STOP_STRINGS, THINK_STOP, Action, parse_call
from asearcher.producers.agents.prompt import (
    EVAL_STYLES,
    NO_PAGE,
    NO_RESULTS,
    SHORT_CHUNK_CHARS,
    TOOL_SETS,
    EvalStyle,
    ToolSet,
    agent_prompt,
    information,
    page_information,
    think_priming,
    valid_instruction_for,
)
from asearcher.producers.agents.reasoning_config import ReasoningConfig
from asearcher.producers.engines.base import GenerateParams, Generation, InferenceEngine
from asearcher.producers.rollout.trajectory import TrajectoryTokens
from asearcher.streams.service.log import get_logger
from asearcher.streams.wire.events import (
    SCORING_KEY,
    GenerationStep,
    RolloutRequested,
    SamplingSettings,
    StepTimings,
    ToolCallRequested,
    ToolResultReady,
    TrajectoryFinished,
    new_id,
)

log = get_logger(__name__)

Turns = Literal["think_then_act", "single_call"]
TURNS: tuple[str, ...] = ("think_then_act", "single_call")

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

    token_budget: Annotated[
        int,
        Meta(
            description=(
                "Tokens of one call's context plus its output (ASearcher: max_tokens_per_mb)."
            )
        ),
    ] = 32_768
    history_chars: Annotated[
        int, Meta(description="history kept in the context, in characters (ASearcher: 25k)")
    ] = 25_000
    observation_chars: Annotated[
        int,
        Meta(
            description=(
                "One observation (search results, one page chunk) longer than this is cut, "
                "with a note. Above the tool's chunk size (25,000 by default): it guards "
                "against runaway tools only."
            )
        ),
    ] = 30_000
    tool_timeout_s: Annotated[
        float, Meta(description="a result not back by then becomes an error observation")
    ] = 30.0
    turns: Annotated[Turns, Meta(description='or "single_call": one call per action')] = (
        "think_then_act"
    )
    prompt: Annotated[
        ToolSet, Meta(description='the training prompt\'s tools; or "search_only"')
    ] = "search_access"
    valid_instruction_ratio: Annotated[
        float,
        Meta(
            description=(
                "Share of questions whose training prompt asks for the most likely answer "
                'instead of allowing "the question is invalid" (ASearcher\'s valid_inst_ratio;'
                " its recipes: 0.3)."
            )
        ),
    ] = 0.3
    brief_prompt: Annotated[
        bool,
        Meta(
            description=(
                "The training prompt without its instructions (the question alone, 34 tokens "
                "instead of 451 on the learning run's tokenizer): a small policy copies from "
                "what stands near a sequence's start."
            )
        ),
    ] = False
    short_observations: Annotated[
        bool,
        Meta(
            description=(
                "Every observation, search results too, is shown in full to the call that "
                "reads it and as its first 100 characters to later ones (as page chunks are): "
                "the newest observation then stands near the prompt."
            )
        ),
    ] = False
    eval_prompt: Annotated[
        EvalStyle,
        Meta(
            description=(
                '"training": evaluations play the training prompt (valid instruction) instead'
                " of the reference's evaluation prompt; for policies too small to carry over "
                "to an unseen prompt."
            )
        ),
    ] = "reference"
    stop_on_format_error: Annotated[
        bool, Meta(description="end a trajectory at a call's formatting slip")
    ] = False
    templates: Annotated[
        PromptTemplates,
        Meta(
            description=(
                "Prompt files in the user's wording (a checkpoint trained on other prompts); "
                '"" keeps ours.'
            )
        ),
    ] = msgspec.field(default_factory=PromptTemplates)
    reasoning: Annotated[
        ReasoningConfig,
        Meta(
            description=(
                'The reasoning web agent\'s settings (workflow "asearcher-reasoning"); unused '
                "otherwise."
            )
        ),
    ] = msgspec.field(default_factory=ReasoningConfig)
    reward: RewardConfig = msgspec.field(default_factory=RewardConfig)

    def __post_init__(self) -> None:
        for name in ("token_budget", "history_chars", "observation_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 < self.tool_timeout_s < math.inf:
            raise ValueError(f"tool_timeout_s must be positive, got {self.tool_timeout_s}")
        if self.turns not in TURNS:
            raise ValueError(f"turns must be one of {', '.join(TURNS)}, got {self.turns!r}")
        if self.prompt not in TOOL_SETS:
            raise ValueError(f"prompt must be one of {', '.join(TOOL_SETS)}, got {self.prompt!r}")
        if self.eval_prompt not in EVAL_STYLES:
            raise ValueError(
                f"eval_prompt must be one of {', '.join(EVAL_STYLES)}, got {self.eval_prompt!r}"
            )
        if not 0 <= self.valid_instruction_ratio <= 1:  # NaN fails too
            raise ValueError(
                f"valid_instruction_ratio must be in [0, 1], got {self.valid_instruction_ratio}"
            )


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


@dataclass(frozen=True)
class Observation:
    """An `<information>` block waiting to enter the context, and what later contexts show of
    it (the think priming is added when it enters)."""

    text: str
    short: str | None = None  # None: shown in full in every context


def observations_of(
    tool: str, result: ToolResultReady, limit: int, short_all: bool = False
) -> list[Observation]:
    """What the model reads of one tool result: one observation, or one per page chunk; with
    `short_all` search results and errors get a short form too, as page chunks always do."""
    if result.error:
        return [_observation(f"Error: {cut_observation(result.error, limit)}", short_all)]
    if tool == "browse":
        chunks = split_page_chunks(result.text)
        if chunks:
            return [
                Observation(*page_information(number, cut_observation(chunk, limit)))
                for number, chunk in chunks
            ]
        empty = NO_PAGE
    else:
        empty = NO_RESULTS
    body = result.text if result.text.strip() else empty
    return [_observation(cut_observation(body, limit), short_all)]


def _observation(body: str, short: bool) -> Observation:
    if not short or len(body) <= SHORT_CHUNK_CHARS:
        return Observation(information(body))
    return Observation(information(body), information(body[:SHORT_CHUNK_CHARS]))


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
        self.transcript: list[str] = []  # calls and observations in order (kept for evaluation)
        self.tool_counts: dict[str, int] = {}
        self.opened: set[str] = set()  # URLs of the pages browsed without an error
        # Observations not yet shown, in order: a think-then-act call reads the next one, a
        # single call all of them. Only a call that reads them puts them in the trajectory.
        self.waiting: deque[Observation] = deque()
        # Evaluation prompts say the question is valid; training prompts draw it per question.
        self.valid_instruction = request.purpose == "eval" or valid_instruction_for(
            request.group_id, config.valid_instruction_ratio
        )

    def prompt(self) -> str:
        """The prompt text of this trajectory."""
        return agent_prompt(
            self.request.question,
            purpose=self.request.purpose,
            valid_instruction=self.valid_instruction,
            tools=self.config.prompt,
            eval_style=self.config.eval_prompt,
            templates=self.config.templates,
            brief=self.config.brief_prompt,
        )

    async def play(self) -> TrajectoryFinished:
        """Run calls until an answer, the model's end, a limit (or a slip, if asked); score."""
        self.tokens.set_prompt(self.engine.tokenizer.encode(self.prompt()))
        finish, slip = "max_turns", None
        for turn in range(self.request.sampling.max_turns):
            think_call = self._feed_observations()
            context = self.tokens.context()
            budget = self.config.token_budget - len(context)
            if budget <= 0:
                finish = "token_budget"
                break
            generation, text = await self._generate(turn, context, budget, think_call)
            parsed = parse_call(text, expect_action=not think_call)
            slip = slip or parsed.error
            ended = await self._after_call(turn, parsed.action, parsed.error, generation)
            if ended is not None:
                finish = ended
                break
            if generation.finish_reason == "length" and budget < self._per_call():
                finish = "token_budget"
                break
        return await self._finish(finish, slip)

    async def _after_call(
        self, turn: int, action: Action | None, slip: str | None, generation: Generation
    ) -> str | None:
        """Act on one call's output; the finish reason if the trajectory ends here."""
        if slip is not None and self.config.stop_on_format_error:
            return "format_error"
        if action is None:
            # Output the model ended itself (EOS) cannot be continued; output cut by the token
            # limit, or a think call, goes on from the model's own text in the next call.
            return "eos" if generation.finish_reason == "eos" else None
        call = action.tool_call()
        if call is None:
            return "answer"
        await self._act(turn, *call)
        return None

    def _feed_observations(self) -> bool:
        """Append what waits for this call, then the think priming; whether it is a think call.

        Think-then-act calls read one observation each; a single call reads all that wait.
        """
        if not self.waiting:
            return False
        think_then_act = self.config.turns == "think_then_act"
        if think_then_act:
            batch = [self.waiting.popleft()]
        else:
            batch, self.waiting = list(self.waiting), deque()
        encode, priming = self.engine.tokenizer.encode, think_priming(self.config.templates)
        for position, waiting in enumerate(batch, 1):
            tail = priming if position == len(batch) else ""
            text = waiting.text + tail
            short = None if waiting.short is None else waiting.short + tail
            shown = None if short is None else (encode(short), short)
            self.tokens.add_observation(encode(text), text, short=shown)
            self.transcript.append(text)
        return think_then_act

    def _per_call(self) -> int:
        return self.request.sampling.max_new_tokens_per_turn

    async def _generate(
        self, turn: int, context: list[int], budget: int, think_call: bool
    ) -> tuple[Generation, str]:
        """Run one call on `context` and record it: a think call stops at `</think>`."""
        sampling = self.request.sampling
        params = GenerateParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_new_tokens=min(self._per_call(), budget),
            stop=THINK_STOP if think_call else STOP_STRINGS,
            seed=None if sampling.seed is None else sampling.seed + 7919 * self.index + turn,
        )
        started = time.perf_counter()
        generation = await self.engine.generate(context, params)
        elapsed = time.perf_counter() - started
        text = self.engine.tokenizer.decode(generation.token_ids)
        self.tokens.add_generated(
            generation.token_ids, generation.logprobs, generation.version, text
        )
        self.turn_texts.append(text)
        self.transcript.append(text)
        self.steps.emit(self._step_event(turn, generation, text, elapsed))
        return generation, text

    def _step_event(
        self, turn: int, generation: Generation, text: str, elapsed: float
    ) -> GenerationStep:
        context, new_sequence = self.tokens.step_context()
        return GenerationStep(
            trajectory_id=self.trajectory_id,
            group_id=self.request.group_id,
            question_id=self.request.question_id,
            turn=turn,
            token_ids=generation.token_ids,
            logprobs=generation.logprobs,
            policy_version=generation.version,
            context_token_ids=context,
            new_sequence=new_sequence,
            text=text,
            finish_reason=generation.finish_reason,
            timings=StepTimings(generate_s=elapsed),
        )

    async def _act(self, turn: int, tool: str, arguments: dict[str, str]) -> None:
        self.tool_counts[tool] = self.tool_counts.get(tool, 0) + 1
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
        if tool == "browse" and not result.error:
            self.opened.add(arguments.get("url", ""))
        limit, short = self.config.observation_chars, self.config.short_observations
        self.waiting.extend(observations_of(tool, result, limit, short))

    async def _score(self) -> RewardBreakdown:
        return await score_request(
            self.request, self.turn_texts, self.config.reward, self.valid_instruction,
            self.trajectory_id, self.opened,
        )  # fmt: skip

    async def _finish(self, finish: str, slip: str | None) -> TrajectoryFinished:
        score = await self._score()
        score.parts["valid_instruction"] = float(self.valid_instruction)
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
            sequence_starts=tokens.sequence_starts,
            answer=score.answer,
            reward=score.reward,
            reward_parts=score.parts,
            num_turns=len(self.turn_texts),
            finish_reason=finish,
            format_error=slip or score.format_error,
            history_truncations=tokens.truncations,
            request_id=self.request.event_id,
            group_size=self.request.group_size,
            temperature=self.request.sampling.temperature,
            sample_index=self.index,
            tool_calls=dict(self.tool_counts),
            metadata=dict(self.request.metadata),
            transcript=self.transcript if self.request.purpose == "eval" else [],
        )


class AsearcherWorkflow:
    """The ASearcher agent as a rollout workflow (registered as "asearcher")."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self._said_no_pages = False

    async def run(
        self,
        engine: InferenceEngine,
        tools: ToolClient,
        steps: StepSink,
        request: RolloutRequested,
        index: int,
    ) -> TrajectoryFinished:
        """Play trajectory `index` of `request`'s group to the end and score it."""
        self._check_pages_named(request)
        return await AgentRun(request, index, engine, tools, steps, self.config).play()

    def _check_pages_named(self, request: RolloutRequested) -> None:
        """Say once when `page_reward` is set but a training question names no pages to pay
        for (a QA file without `supporting_urls`): the setting then changes nothing."""
        page_reward = self.config.reward.page_reward
        if self._said_no_pages or not page_reward or request.purpose != "train":
            return
        if not request.supporting_urls:
            self._said_no_pages = True
            log.warning(
                "page_reward %g is set but question %s names no supporting pages (its QA "
                "file has no supporting_urls): its trajectories earn no page reward",
                page_reward, request.question_id,
            )  # fmt: skip


async def score_request(
    request: RolloutRequested,
    turn_texts: list[str],
    reward: RewardConfig,
    valid_instruction: bool,
    trajectory_id: str,
    opened: Collection[str] | None = None,
) -> RewardBreakdown:
    """The reward of a trajectory of `request` whose LLM calls wrote `turn_texts` and browsed
    the pages `opened` (None: not tracked): evaluation requests by the reference evaluation's
    rules (unless they ask for training scoring), the judge asked when configured; a judge
    that gives no verdict scores 0 and says so. Only training pays for opened pages."""
    golds, aug, valid = request.gold_answers, request.aug_answers, valid_instruction
    tracked = opened is not None and request.purpose == "train"
    pages = pages_read_share(opened, request.supporting_urls) if tracked else None
    if request.purpose == "eval" and request.metadata.get(SCORING_KEY) != "training":
        reward = evaluation_scoring(reward)
    if reward.judge is None:
        return score_trajectory(
            turn_texts, golds, reward, valid_instruction=valid, aug_golds=aug, pages_read=pages
        )
    try:
        return await score_trajectory_with_judge(
            turn_texts, golds, reward, request.question, valid_instruction=valid, aug_golds=aug,
            pages_read=pages,
        )  # fmt: skip
    except JudgeError as exc:
        # A judge that gives no verdict must not lose the trajectory: score it 0 and say so.
        log.warning("judge failed for %s: %s", trajectory_id, exc)
        breakdown = score_trajectory(
            turn_texts, golds, reward, judge_score=0.0, valid_instruction=valid, aug_golds=aug,
            pages_read=pages,
        )  # fmt: skip
        breakdown.parts["judge_failed"] = 1.0
        return breakdown


async def run_trajectory(
    request: RolloutRequested,
    index: int,
    engine: InferenceEngine,
    tools: ToolClient,
    steps: StepSink,
    config: AgentConfig,
) -> TrajectoryFinished:
    """Play trajectory `index` of `request`'s group to the end and score it."""
    return await AsearcherWorkflow(config).run(engine, tools, steps, request, index)
