"""The one declaration of every topic: name, partitions, key, event kinds and broker configs.

`asearcher stream up` creates topics from `TOPICS`; producers take the record key from the
event field named by `key_field`; consumers decode with the event kinds a topic may hold.
"""

from __future__ import annotations

import msgspec

from asearcher.streams.wire.events import (
    EVENT_TYPES,
    ClaimCheck,
    DeadLetter,
    EvalResult,
    Event,
    FeederProgress,
    GenerationStep,
    QuestionSynthesized,
    RequestPlayed,
    RolloutRequested,
    ServiceStatus,
    SynthesisCandidate,
    SynthesisRequested,
    ToolCallRequested,
    ToolResultReady,
    TrainerStepFinished,
    TrajectoriesDropped,
    TrajectoryFinished,
    WeightsPublished,
)

ROLLOUT_REQUESTS = "rollout.requests"
ROLLOUT_STEPS = "rollout.steps"
TOOL_CALLS = "tool.calls"
TOOL_RESULTS = "tool.results"
TRAJECTORIES = "trajectories"
WEIGHTS = "weights"
TRAINER_METRICS = "trainer.metrics"
EVAL_REQUESTS = "eval.requests"
EVAL_TRAJECTORIES = "eval.trajectories"
EVAL_RESULTS = "eval.results"
DEAD_LETTERS = "dead.letters"
SERVICE_STATUS = "service.status"
FEEDER_PROGRESS = "feeder.progress"
EXPERT_REQUESTS = "expert.requests"
EXPERT_TRAJECTORIES = "expert.trajectories"
SYNTH_REQUESTS = "synth.requests"
SYNTH_CANDIDATES = "synth.candidates"
SYNTH_ACCEPTED = "synth.accepted"
SYNTH_REJECTED = "synth.rejected"
REQUESTS_PLAYED = "requests.played"

# Copies of each topic on a cluster that can hold them, and how many must have a write (acks=all,
# which every producer here uses): one broker can fail without losing or refusing a record.
REPLICATION_FACTOR = 3
MIN_INSYNC_REPLICAS = 2

# The broker's default max message is ~1 MiB; larger events travel through the claim check.
MAX_MESSAGE_BYTES = 1_048_588
WEEK_MS = 7 * 24 * 3600 * 1000


def replicas_on(brokers: int, wanted: int = REPLICATION_FACTOR) -> int:
    """Copies of a topic on a cluster of `brokers`: `wanted`, or as many as it can hold."""
    return max(1, min(wanted, brokers))


class TopicSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How one topic is laid out and what it carries."""

    name: str
    partitions: int
    key_field: str
    event_types: tuple[type[Event], ...]
    compacted: bool = False
    # Only closed segments are compacted: a topic read for "the latest per key" that grows fast
    # (heartbeats) rolls often, else its readers (stream status) read a week of records.
    segment_ms: int | None = None
    retention_ms: int = WEEK_MS
    max_message_bytes: int = MAX_MESSAGE_BYTES
    replication_factor: int = REPLICATION_FACTOR
    min_insync_replicas: int = MIN_INSYNC_REPLICAS
    description: str = ""

    def replicas_on(self, brokers: int) -> int:
        """The replication factor on a cluster of `brokers`: the spec's, or what it can hold."""
        return replicas_on(brokers, self.replication_factor)

    def min_insync_on(self, brokers: int) -> int:
        """`min.insync.replicas` on a cluster of `brokers`: the spec's, but always one fewer
        than the replicas (a topic whose every copy must answer stops at the first fault)."""
        return max(1, min(self.min_insync_replicas, self.replicas_on(brokers) - 1))

    def broker_config(self, brokers: int = 1) -> dict[str, str]:
        """Topic-level broker configs for creating this topic on a cluster of `brokers`."""
        config = {
            "max.message.bytes": str(self.max_message_bytes),
            "compression.type": "producer",
            "min.insync.replicas": str(self.min_insync_on(brokers)),
        }
        if self.compacted:
            config["cleanup.policy"] = "compact"
            if self.segment_ms is not None:
                config["segment.ms"] = str(self.segment_ms)
        else:
            config["cleanup.policy"] = "delete"
            config["retention.ms"] = str(self.retention_ms)
        return config

    def key_of(self, event: Event) -> str | None:
        """The record key this topic uses for `event` (None when the event lacks the field)."""
        value = getattr(event, self.key_field, None)
        return None if value is None else str(value)

    def with_name(self, name: str) -> TopicSpec:
        """The same layout under another name (tests, replays into fresh topics)."""
        return msgspec.structs.replace(self, name=name)


TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(
        name=ROLLOUT_REQUESTS,
        partitions=4,
        key_field="group_id",
        event_types=(RolloutRequested,),
        description="questions to roll out, one event per GRPO group",
    ),
    TopicSpec(
        name=ROLLOUT_STEPS,
        partitions=8,
        key_field="trajectory_id",
        event_types=(GenerationStep,),
        description="one event per generation turn",
    ),
    TopicSpec(
        name=TOOL_CALLS,
        partitions=8,
        key_field="trajectory_id",
        event_types=(ToolCallRequested,),
        description="search/browse calls written by the agent",
    ),
    TopicSpec(
        name=TOOL_RESULTS,
        partitions=8,
        key_field="trajectory_id",
        event_types=(ToolResultReady,),
        description="tool output or error, back to the rollout producer",
    ),
    TopicSpec(
        name=TRAJECTORIES,
        partitions=8,
        key_field="group_id",
        event_types=(TrajectoryFinished,),
        description="finished trajectories with per-token data, keyed by group for GRPO",
    ),
    TopicSpec(
        name=WEIGHTS,
        partitions=1,
        key_field="model",
        event_types=(WeightsPublished,),
        compacted=True,
        description="policy versions in object storage (compacted: latest per model)",
    ),
    TopicSpec(
        name=TRAINER_METRICS,
        partitions=1,
        key_field="model",
        event_types=(TrainerStepFinished, TrajectoriesDropped),
        description="one event per optimiser step (rewards, drops, loss, speed), and drops "
        "between steps",
    ),
    TopicSpec(
        name=EVAL_REQUESTS,
        partitions=4,
        key_field="group_id",
        event_types=(RolloutRequested,),
        description="evaluation questions for the evaluators, each pinned to a weight version",
    ),
    TopicSpec(
        name=EVAL_TRAJECTORIES,
        partitions=4,
        key_field="eval_key",
        event_types=(TrajectoryFinished,),
        description="finished evaluation trajectories (never trained), keyed by evaluation "
        "and benchmark",
    ),
    TopicSpec(
        name=EVAL_RESULTS,
        partitions=4,
        key_field="eval_key",
        event_types=(EvalResult,),
        description="a benchmark's scores at a weight version, one event per evaluation",
    ),
    TopicSpec(
        name=EXPERT_REQUESTS,
        partitions=4,
        key_field="group_id",
        event_types=(RolloutRequested,),
        description="questions for an expert to demonstrate (a warm start's behaviour cloning)",
    ),
    TopicSpec(
        name=EXPERT_TRAJECTORIES,
        partitions=4,
        key_field="group_id",
        event_types=(TrajectoryFinished,),
        description="demonstrations to clone (`asearcher sft`), never read by the RL trainer",
    ),
    TopicSpec(
        name=SYNTH_REQUESTS,
        partitions=4,
        key_field="seed_id",
        event_types=(SynthesisRequested,),
        description="seeds (a QA pair or a page) for the data-synthesis agent",
    ),
    TopicSpec(
        name=SYNTH_CANDIDATES,
        partitions=4,
        key_field="seed_id",
        event_types=(SynthesisCandidate,),
        description="every candidate question a seed went through, with each check's verdict",
    ),
    TopicSpec(
        name=SYNTH_ACCEPTED,
        partitions=4,
        key_field="seed_id",
        event_types=(QuestionSynthesized,),
        description="synthesized questions that passed quality, difficulty and uniqueness",
    ),
    TopicSpec(
        name=SYNTH_REJECTED,
        partitions=4,
        key_field="seed_id",
        event_types=(QuestionSynthesized,),
        description="seeds that gave no acceptable question, with their history and reasons",
    ),
    TopicSpec(
        name=SERVICE_STATUS,
        partitions=1,
        key_field="instance",
        event_types=(ServiceStatus,),
        compacted=True,
        segment_ms=10 * 60 * 1000,
        description="each service's heartbeat: state, counters and why it waits",
    ),
    TopicSpec(
        name=FEEDER_PROGRESS,
        partitions=1,
        key_field="run",
        event_types=(FeederProgress,),
        compacted=True,
        description="the request feeder's position per run, committed with its requests",
    ),
    TopicSpec(
        name=REQUESTS_PLAYED,
        partitions=4,
        key_field="played_key",
        event_types=(RequestPlayed,),
        compacted=True,
        description="the requests each consumer group played, committed with their outputs "
        "(compacted): a request sent twice is played once",
    ),
    TopicSpec(
        name=DEAD_LETTERS,
        partitions=1,
        key_field="origin_topic",
        event_types=(DeadLetter,),
        retention_ms=4 * WEEK_MS,
        description="undecodable or unhandled records, with the reason",
    ),
)

TOPICS_BY_NAME: dict[str, TopicSpec] = {spec.name: spec for spec in TOPICS}


# The declared topic each event kind lives on: its key field also keys the kind elsewhere
# (re-drives into fresh topics, test topics), so a group's trajectories stay together anywhere.
# A kind on several topics (requests and trajectories also have evaluation topics) is at home
# on the first declared.
HOME_TOPIC: dict[type[Event], TopicSpec] = {}
for _spec in TOPICS:
    for _kind in _spec.event_types:
        HOME_TOPIC.setdefault(_kind, _spec)


def record_key(topic: str, event: Event) -> str | None:
    """The key for `event` on `topic`: the topic's key field, else that of its kind's home."""
    spec = TOPICS_BY_NAME.get(topic) or HOME_TOPIC.get(type(event))
    return spec.key_of(event) if spec is not None else None


def topic_spec(name: str) -> TopicSpec:
    """The spec of a declared topic; a topic not declared here may hold any event kind."""
    spec = TOPICS_BY_NAME.get(name)
    if spec is not None:
        return spec
    return TopicSpec(
        name=name,
        partitions=1,
        key_field="trajectory_id",
        event_types=tuple(t for t in EVENT_TYPES if t is not ClaimCheck),
    )
