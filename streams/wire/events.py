"""Every event that crosses Kafka, one `msgspec.Struct` per kind.

Each event carries its kind as a tag (`"kind": "GenerationStep"`) and a `schema_version`, so a
reader in any language can dispatch on the kind and reject versions it does not know. Add a
field with a default to evolve an event; bump that event's `schema_version` default and
`SCHEMA_VERSION` together when a change is not backward compatible.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Annotated, ClassVar, Literal, TypeVar, Union, get_args

import msgspec
from msgspec import Meta

from asearcher.streams.wire.packed import Float32s, Int32s

S = TypeVar("S", bound=msgspec.Struct)

Purpose = Literal["train", "eval", "synthesis"]


def new_id() -> str:
    """A fresh random identifier (32 hex characters)."""
    return uuid.uuid4().hex


class Event(msgspec.Struct, tag_field="kind", tag=lambda name: name, kw_only=True):
    """Fields every event has. Subclasses are the event kinds."""

    SCHEMA_VERSION: ClassVar[int] = 1

    # A kind that changes incompatibly overrides both this default and SCHEMA_VERSION.
    schema_version: int = 1
    event_id: str = msgspec.field(default_factory=new_id)
    # A factory, so every event gets its own creation time rather than the import time.
    created_at: float = msgspec.field(default_factory=time.time)

    @classmethod
    def kind(cls) -> str:
        """The tag that names this event kind on the wire."""
        return cls.__struct_config__.tag

    def summary(self) -> str:
        """One short line for logs and replay listings."""
        return self.kind()

    def upgraded(self, read: Callable[[type[S]], S]) -> Event:
        """This event as its current schema version has it. A kind whose older versions kept
        fields elsewhere overrides this; `read` decodes the record again as another struct."""
        return self


class SamplingSettings(msgspec.Struct, kw_only=True):
    """How the policy samples for one request."""

    temperature: Annotated[float, Meta(description="sampling temperature (0: greedy)")] = 1.0
    top_p: Annotated[
        float, Meta(description="nucleus sampling: the smallest set of tokens with this mass")
    ] = 1.0
    max_new_tokens_per_turn: Annotated[int, Meta(description="tokens one LLM call may write")] = (
        1024
    )
    max_turns: Annotated[int, Meta(description="LLM calls of one trajectory at most")] = 32
    seed: Annotated[int | None, Meta(description="seed of the sampling (None: unseeded)")] = None


class RolloutRequested(Event, kw_only=True):
    """Ask the rollout producers for `group_size` trajectories on one question."""

    question_id: str
    group_id: str
    question: str
    gold_answers: list[str] = []
    # More accepted phrasings (a QA file's `aug_answer`): the training reward blends them in.
    aug_answers: list[str] = []
    # The pages the answer is read from (a synthetic world's question names them): a training
    # reward with `page_reward` pays for opening them. Empty: the question names none.
    supporting_urls: list[str] = []
    sampling: SamplingSettings = msgspec.field(default_factory=SamplingSettings)
    group_size: int = 16
    purpose: Purpose = "train"
    # Evaluation: play with exactly this weight version (None: whatever the producer has).
    policy_version: int | None = None
    # Copied onto every trajectory of the group. Evaluation requests carry `EVAL_KEYS` here.
    metadata: dict[str, str] = {}

    def summary(self) -> str:
        pinned = "" if self.policy_version is None else f" v={self.policy_version}"
        return f"RolloutRequested q={self.question_id} n={self.group_size} {self.purpose}{pinned}"


class StepTimings(msgspec.Struct, kw_only=True):
    """Where the time of one generation turn went, in seconds."""

    queued_s: float = 0.0
    generate_s: float = 0.0


class GenerationStep(Event, kw_only=True):
    """One generation turn of one trajectory: what the policy wrote and with which weights.

    Its number arrays are packed (int32 and float32, little-endian: MessagePack bin, base64 in
    JSON; plain arrays are read too): the bus carries one step per turn of every trajectory,
    and decoding numbers one by one was its bottleneck. Schema version 2; version 1 (plain
    arrays) still decodes. In Python, lists given to the constructor are packed on the spot.
    """

    SCHEMA_VERSION: ClassVar[int] = 2

    schema_version: int = 2
    trajectory_id: str
    group_id: str = ""
    question_id: str = ""
    turn: int
    token_ids: Int32s
    logprobs: Float32s
    policy_version: int
    # Tokens that entered the context just before this turn (the prompt for turn 0, the tool
    # output block after), masked out of the loss: steps alone rebuild the whole trajectory.
    context_token_ids: Int32s = msgspec.field(default_factory=Int32s)
    # True when this call's context did not extend the trajectory's current training sequence
    # (history was cut, or a page chunk is now shown short): a new sequence starts here and
    # `context_token_ids` hold the call's whole context. See `TrajectoryFinished.sequence_starts`.
    new_sequence: bool = False
    text: str = ""
    finish_reason: str = ""
    timings: StepTimings = msgspec.field(default_factory=StepTimings)

    def __post_init__(self) -> None:
        if not isinstance(self.token_ids, Int32s):
            self.token_ids = Int32s(self.token_ids)
        if not isinstance(self.logprobs, Float32s):
            self.logprobs = Float32s(self.logprobs)
        if not isinstance(self.context_token_ids, Int32s):
            self.context_token_ids = Int32s(self.context_token_ids)

    def summary(self) -> str:
        return (
            f"GenerationStep traj={self.trajectory_id} turn={self.turn} "
            f"tokens={len(self.token_ids)} v={self.policy_version}"
        )


class ToolCallRequested(Event, kw_only=True):
    """The agent asked for a tool: `search` (query) or `browse` (url)."""

    call_id: str
    trajectory_id: str
    turn: int = 0
    tool: str
    arguments: dict[str, str] = {}
    timeout_s: float = 30.0
    # The tool workers that answer: a run's name, for runs sharing a cluster serve different
    # corpora and a page of one world is missing from another; "" for workers started bare.
    pool: str = ""

    def summary(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.arguments.items())
        return (
            f"ToolCallRequested traj={self.trajectory_id} call={self.call_id} {self.tool}({args})"
        )


class ToolResultReady(Event, kw_only=True):
    """What a tool returned for one call: text on success, an error the agent can read otherwise."""

    call_id: str
    trajectory_id: str
    turn: int = 0
    tool: str
    text: str = ""
    error: str | None = None
    latency_s: float = 0.0
    worker: str = ""  # which tool worker answered, for debugging

    @property
    def ok(self) -> bool:
        return self.error is None

    def summary(self) -> str:
        outcome = f"error={self.error!r}" if self.error else f"chars={len(self.text)}"
        return f"ToolResultReady traj={self.trajectory_id} call={self.call_id} {outcome}"


class TrajectoryFinished(Event, kw_only=True):
    """A whole trajectory with per-token data for training, its answer and its reward."""

    trajectory_id: str
    group_id: str
    question_id: str
    purpose: Purpose = "train"
    token_ids: list[int]
    logprobs: list[float]
    loss_mask: list[int]
    token_versions: list[int]
    prompt_length: int = 0
    # The per-token lists above are one or more training sequences back to back: each holds an
    # LLM call's exact context (masked) and output, later calls that extend it included, so
    # behaviour log-probs match the context they were computed on. These are the offsets where
    # the second, third, ... sequence starts, strictly increasing within 1..len-1; empty means
    # one sequence. The trainer trains each sequence as its own row, all with this trajectory's
    # reward; a later sequence shows earlier outputs again, masked, as context.
    sequence_starts: list[int] = []
    answer: str | None = None
    reward: float = 0.0
    reward_parts: dict[str, float] = {}
    num_turns: int = 0
    finish_reason: str = ""  # answer | eos | format_error | max_turns | token_budget
    format_error: str | None = None  # why the format gate failed
    # Turns generated from a context cut to the last N characters of history (each such turn
    # starts a new training sequence, see `sequence_starts`).
    history_truncations: int = 0
    request_id: str = ""  # the RolloutRequested event this trajectory answers
    group_size: int = 0  # trajectories in this group (the request's group_size)
    temperature: float = 1.0  # the sampling temperature the log-probs were computed at
    sample_index: int = 0  # which member of its group this is (0 ... group_size - 1)
    tool_calls: dict[str, int] = {}  # calls made per tool ("search", "browse")
    metadata: dict[str, str] = {}  # the request's metadata (evaluation: `EVAL_KEYS`)
    # Evaluation only: every LLM call's text and each observation, in order, as the agent saw
    # them (what the per-question evaluation records show as history).
    transcript: list[str] = []

    @property
    def eval_key(self) -> str:
        """`<eval id>/<benchmark>`: the key every trajectory of one evaluation shares."""
        return eval_key(self.metadata.get("eval_id", ""), self.metadata.get("benchmark", ""))

    def summary(self) -> str:
        return (
            f"TrajectoryFinished traj={self.trajectory_id} group={self.group_id} "
            f"tokens={len(self.token_ids)} turns={self.num_turns} reward={self.reward:.3f}"
        )


class WeightsPublished(Event, kw_only=True):
    """A new policy version is in object storage at `uri`."""

    model: str = "policy"
    version: int
    uri: str
    sha256: str
    step: int
    metrics: dict[str, float] = {}

    def summary(self) -> str:
        return f"WeightsPublished {self.model} v={self.version} step={self.step} {self.uri}"


class StepStats(msgspec.Struct, kw_only=True):
    """What one optimiser step trained on and how its loss looked, as the step measured them
    (the trainer's and behaviour cloning's steps return it; `TrainerStepFinished` carries it)."""

    samples: int = 0  # trajectories in the batch
    tokens: int = 0  # tokens in the batch's sequences
    trained_tokens: int = 0  # tokens under the loss mask
    reward_mean: float = 0.0
    loss: float = 0.0
    clip_fraction: float = 0.0  # share of trained tokens whose ratio was clipped
    capped_fraction: float = 0.0  # share whose behaviour importance weight was capped
    seconds: float = 0.0  # the step's own time: forward, backward and the optimiser

    @property
    def tokens_per_s(self) -> float:
        """The batch's tokens over the step's time."""
        return self.tokens / max(self.seconds, 1e-9)


class _StepFiguresV1(StepStats, kw_only=True):
    """Where a version 1 `TrainerStepFinished` kept its figures: at the top level, the step's
    time as `step_s`."""

    step_s: float = 0.0


class TrainerStepFinished(Event, kw_only=True):
    """What one optimiser step did; committed in the same transaction as its offsets.

    Schema version 2 nests the step's own figures in `stats`; a version 1 record (the figures
    at the top level) decodes as version 2 with its figures moved there.
    """

    SCHEMA_VERSION: ClassVar[int] = 2

    schema_version: int = 2
    model: str = "policy"
    version: int  # the version this step produced
    step: int
    groups: int = 0
    stats: StepStats = msgspec.field(default_factory=StepStats)
    # Trained samples older than the staleness bound (importance-weighted, as AReaL trains them).
    late_samples: int = 0
    # Since the previous step:
    dropped_stale: int = 0  # late samples dropped (only with batching.drop_stale)
    dropped_flat_groups: int = 0
    dropped_small_groups: int = 0
    duplicates: int = 0
    # The ids of those flat groups: the feeder requests their questions less often.
    flat_groups: list[str] = []
    # The trajectories this step trained on (the ledger), in the order the step used them:
    # groups back to back, each group's members in the order they were collected.
    trained_ids: list[str] = []
    dropped_ids: list[str] = []  # trajectories set aside since the last step (counted above)
    idle_fraction: float = 0.0  # share of the time since the last step spent waiting for data
    # staleness_counts[k]: trained samples whose oldest token was k versions old.
    staleness_counts: list[int] = []
    # With trained_ids, what re-training from the log needs to rebuild this version exactly
    # (`asearcher retrain`):
    parent_version: int = -1  # the version the step started from (-1: not recorded)
    optimizer_step: int = 0  # steps since the trainer (re)started, this one included: 1 = fresh
    threads: int = 0  # torch's intra-op threads (they decide the order of float sums)
    ranks: int = 1  # data-parallel trainer processes
    weights_sha256: str = ""  # SHA-256 of the version's model file
    settings_sha256: str = ""  # fingerprint of the trainer settings that shape a step

    def upgraded(self, read: Callable[[type[S]], S]) -> Event:
        if self.schema_version >= 2:
            return self
        old = read(_StepFiguresV1)
        figures = {f: getattr(old, f) for f in StepStats.__struct_fields__ if f != "seconds"}
        stats = StepStats(**figures, seconds=old.step_s)
        return msgspec.structs.replace(self, schema_version=2, stats=stats)

    def summary(self) -> str:
        return (
            f"TrainerStepFinished v={self.version} groups={self.groups} "
            f"reward={self.stats.reward_mean:.3f} loss={self.stats.loss:.4f} "
            f"tokens/s={self.stats.tokens_per_s:.0f}"
        )


class TrajectoriesDropped(Event, kw_only=True):
    """Trajectories the trainer set aside between steps (flat, small or stale groups).

    Committed with their offsets as soon as they are dropped, so producers get their staleness
    capacity back at once instead of at the next step, which may never come.
    """

    model: str = "policy"
    version: int  # the trainer's version when they were dropped
    dropped_ids: list[str]
    dropped_stale: int = 0
    dropped_flat_groups: int = 0
    dropped_small_groups: int = 0
    duplicates: int = 0
    flat_groups: list[str] = []  # the ids of the flat groups dropped

    def summary(self) -> str:
        return (
            f"TrajectoriesDropped v={self.version} n={len(self.dropped_ids)} "
            f"flat={self.dropped_flat_groups} small={self.dropped_small_groups} "
            f"stale={self.dropped_stale}"
        )


class ServiceStatus(Event, kw_only=True):
    """A service's heartbeat: what it is doing and, when it waits, why (with counts)."""

    service: str  # trainer | rollout | tools | feeder
    instance: str  # the stable instance name (the record key)
    state: str = "running"  # running | waiting | stopping | stopped
    waiting_for: str = ""  # one line saying why it waits, with counts, or empty
    version: int = -1  # the policy version it works with, where it has one
    counters: dict[str, float] = {}
    pid: int = 0
    host: str = ""

    def summary(self) -> str:
        why = f": {self.waiting_for}" if self.waiting_for else ""
        return f"ServiceStatus {self.service}/{self.instance} {self.state}{why}"


class FeederProgress(Event, kw_only=True):
    """Where the request feeder of a run stands; committed with the requests it covers."""

    run: str
    epoch: int  # the epoch being fed (0-based)
    next_index: int  # position within the epoch's shuffled order
    published: int  # requests published in total
    epochs: int  # epochs to feed (0: forever)
    questions: int  # positions per epoch: the questions, each as often as `plays_by_hops` asks
    finished: bool = False
    # Positions passed over, in total: questions whose newest group was flat, not requested again
    # yet (feeder `revisit_flat_every`). `published` counts only the requests sent.
    skipped: int = 0

    def summary(self) -> str:
        return (
            f"FeederProgress {self.run} epoch={self.epoch} next={self.next_index} "
            f"published={self.published}{' finished' if self.finished else ''}"
        )


class RequestPlayed(Event, kw_only=True):
    """A request a consumer group took in and played, committed in the transaction of its
    outputs: a second copy of the same request (a retry, a re-drive) is then not played again."""

    consumer_group: str  # the group that played it: each group plays a request once
    topic: str  # the request topic it was read from
    partition: int  # ... and where: a member reloads the markers of the partitions it takes
    offset: int
    request_id: str  # the request's identity: a rollout group id, a synthesis seed id

    @property
    def played_key(self) -> str:
        """The compaction key: one marker per request and consumer group."""
        return f"{self.consumer_group}/{self.topic}/{self.request_id}"

    def summary(self) -> str:
        return (
            f"RequestPlayed {self.request_id} by {self.consumer_group} from "
            f"{self.topic}[{self.partition}]@{self.offset}"
        )


class EvalResult(Event, kw_only=True):
    """The scores of one benchmark at one weight version, once every sample of it is in.

    `averages` holds Avg@k of every per-sample measure (mean over each question x sample):
    the scores ("f1", "em", "cem", "format", and "judge" when judged) and the counts
    ("gen_len" generated tokens, "searches", "accesses" pages browsed, "turns" LLM calls).
    `best_of_k` holds Pass@k (Max@k) of each score: the mean over questions of the best of
    the first k samples.
    """

    eval_id: str
    model: str = ""  # the weights' model name (the run)
    benchmark: str
    policy_version: int
    questions: int
    samples_per_question: int  # k
    averages: dict[str, float] = {}
    best_of_k: dict[str, float] = {}

    @property
    def eval_key(self) -> str:
        return eval_key(self.eval_id, self.benchmark)

    def summary(self) -> str:
        scores = " ".join(f"{k}={v:.3f}" for k, v in sorted(self.averages.items()))
        return (
            f"EvalResult {self.eval_id} {self.benchmark} v={self.policy_version} "
            f"n={self.questions}x{self.samples_per_question} {scores}"
        )


# The metadata keys of an evaluation request (and so of its trajectories).
EVAL_KEYS = ("eval_id", "benchmark", "questions", "evaluator")
# How an evaluation request's answers are scored: "reference" (the reference's evaluation rules,
# the default of a request without the key) or "training" (the training reward's rules).
SCORING_KEY = "scoring"
# Set when an evaluation plays another run's versions (`eval run --weights-of`): its result is
# filed under that run, while `model` still names the run whose evaluation processor gathers it.
WEIGHTS_OF_KEY = "weights_of"
Scoring = Literal["reference", "training"]
SCORINGS: tuple[str, ...] = get_args(Scoring)


def eval_key(eval_id: str, benchmark: str) -> str:
    """The record key of one evaluation of one benchmark: all its events share a partition."""
    return f"{eval_id}/{benchmark}"


# --- data synthesis -----------------------------------------------------------------------------

SynthAction = Literal["base", "fuzz", "inject"]
Gate = Literal["quality", "difficulty", "uniqueness"]


class SynthFact(msgspec.Struct, frozen=True, kw_only=True):
    """A statement a synthesized question rests on, and the page it is read from."""

    statement: str
    url: str


class SynthEdit(msgspec.Struct, frozen=True, kw_only=True):
    """One step of a question's history: the base QA, a fuzz or an injection."""

    action: SynthAction
    question: str  # the question after this step
    detail: str = ""  # what the step changed, in words
    facts: list[SynthFact] = []  # the statements this step added


class GateVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """One check of a candidate question."""

    gate: Gate
    passed: bool
    reason: str = ""
    answers: list[str] = []  # difficulty: what the model without tools answered
    correct: int = 0  # difficulty: how many of those answers were right


class SynthesisRequested(Event, kw_only=True):
    """A seed for the synthesis agent: a QA pair, or a page (`page_url`) to write one from."""

    seed_id: str
    question: str = ""
    answer: str = ""
    page_url: str = ""
    metadata: dict[str, str] = {}

    def summary(self) -> str:
        seed = self.page_url or self.question
        return f"SynthesisRequested {self.seed_id} {seed[:60]!r}"


class SynthesisCandidate(Event, kw_only=True):
    """A candidate question of one seed (index 0: the base QA, then one per edit) and how each
    check went; `plan` is the writer's own state (JSON text), kept so a candidate can be
    re-checked."""

    seed_id: str
    index: int
    question: str
    answer: str
    facts: list[SynthFact] = []
    edits: list[SynthEdit] = []
    verdicts: list[GateVerdict] = []
    accepted: bool = False
    plan: str = ""

    def summary(self) -> str:
        verdict = "accepted" if self.accepted else "rejected"
        return f"SynthesisCandidate {self.seed_id}#{self.index} {verdict} {self.question[:60]!r}"


class QuestionSynthesized(Event, kw_only=True):
    """What one seed came to: its hardest accepted candidate (`accepted`), or its last candidate
    and every reason no candidate passed. `role_failures` counts the model calls that failed
    (malformed replies, refusals, errors) by role and action."""

    seed_id: str
    accepted: bool
    question: str
    answer: str
    seed_question: str = ""
    supporting_urls: list[str] = []  # the pages the facts are read from, in order
    facts: list[SynthFact] = []
    edits: list[SynthEdit] = []
    verdicts: list[GateVerdict] = []
    candidates: int = 0
    reasons: list[str] = []
    role_failures: dict[str, int] = {}
    metadata: dict[str, str] = {}

    def summary(self) -> str:
        verdict = "accepted" if self.accepted else f"rejected ({'; '.join(self.reasons)[:80]})"
        return f"QuestionSynthesized {self.seed_id} {verdict} {self.question[:60]!r}"


class DeadLetter(Event, kw_only=True):
    """A record that could not be decoded or handled, kept whole with the reason."""

    origin_topic: str
    origin_partition: int
    origin_offset: int
    reason: str
    error_type: str
    key: bytes | None = None
    payload: bytes | None = None
    headers: list[tuple[str, bytes]] = []

    def summary(self) -> str:
        return (
            f"DeadLetter {self.origin_topic}[{self.origin_partition}]@{self.origin_offset} "
            f"{self.error_type}: {self.reason}"
        )


class ClaimCheck(Event, kw_only=True):
    """Stands in on the wire for an event too large for a Kafka message (stored at `uri`)."""

    uri: str
    sha256: str
    size: int
    content_type: str
    original_kind: str

    def summary(self) -> str:
        return f"ClaimCheck {self.original_kind} {self.size} bytes at {self.uri}"


EVENT_TYPES: tuple[type[Event], ...] = (
    RolloutRequested,
    GenerationStep,
    ToolCallRequested,
    ToolResultReady,
    TrajectoryFinished,
    WeightsPublished,
    TrainerStepFinished,
    TrajectoriesDropped,
    ServiceStatus,
    FeederProgress,
    RequestPlayed,
    EvalResult,
    SynthesisRequested,
    SynthesisCandidate,
    QuestionSynthesized,
    DeadLetter,
    ClaimCheck,
)

EVENTS_BY_KIND: dict[str, type[Event]] = {cls.kind(): cls for cls in EVENT_TYPES}

# Any event kind, for fields and decoders that accept them all (exports, untyped topics).
AnyEvent = Union[EVENT_TYPES]  # noqa: UP007 - a runtime union built from the tuple
