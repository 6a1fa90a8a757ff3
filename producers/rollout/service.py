"""The rollout producer service: `rollout.requests` in, steps, tool calls and trajectories out.

Inputs: `RolloutRequested` (consumer group, so producers share partitions), `ToolResultReady`
(all of `tool.results`), `WeightsPublished` (the compacted `weights` topic).
Outputs: a `GenerationStep` per LLM call and a `ToolCallRequested` per action as they happen,
and a group's `TrajectoryFinished` events in one transaction with the request's commit point, so
the trainer sees each request's group exactly once even when a producer dies mid-group.
Components: the workflow (the agent, chosen by name: `workflows.py`), an inference engine, the
Kafka tool client, the weights follower, AReaL's staleness gate, and the out-of-order
transactional intake from `streams/`.

A workflow may deliver nothing for a trajectory (None). The group is then committed with the
trajectories it has, each saying in `group_size` how many were delivered, so the trainer's
collector (which waits for `group_size` members) sees it complete. A group with nothing at all
delivered commits a `DeadLetter` for its request instead (reason: the workflow delivered no
trajectory), which frees the feeder's slot as for any request set aside, and gives its
staleness capacity back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from asearcher.producers.agents import workflows
from asearcher.producers.agents.agent import AgentConfig, check_request
from asearcher.producers.engines.base import InferenceEngine
from asearcher.producers.rollout.staleness import StalenessConfig, StalenessGate
from asearcher.producers.rollout.tool_router import KafkaToolClient
from asearcher.producers.rollout.weights_follower import WeightsFollower
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.intake import OutOfOrderIntake, static_member
from asearcher.streams.io.played import PlayedRequests
from asearcher.streams.io.producer import LOW_LATENCY, EventProducer
from asearcher.streams.io.tail import TopicTail
from asearcher.streams.service.config_file import load_config
from asearcher.streams.service.heartbeat import Heartbeat
from asearcher.streams.service.lifecycle import stop_on_signals
from asearcher.streams.service.log import get_logger
from asearcher.streams.storage.weight_reader import (
    WeightStoreError,
    WeightStoreReader,
    resolve_store_url,
)
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import (
    DeadLetter,
    Event,
    GenerationStep,
    RolloutRequested,
    TrainerStepFinished,
    TrajectoriesDropped,
    TrajectoryFinished,
)
from asearcher.streams.wire.records import Outgoing, Record
from asearcher.streams.wire.topics import (
    DEAD_LETTERS,
    EVAL_REQUESTS,
    EVAL_TRAJECTORIES,
    REQUESTS_PLAYED,
    ROLLOUT_REQUESTS,
    ROLLOUT_STEPS,
    SERVICE_STATUS,
    TOOL_CALLS,
    TOOL_RESULTS,
    TRAINER_METRICS,
    TRAJECTORIES,
    WEIGHTS,
)

log = get_logger(__name__)
GROUP = "asearcher-rollout-producers"
EVAL_GROUP = "asearcher-evaluators"
UNLOADABLE_FOR_S = 60.0  # how long an evaluator sets aside requests for a version it cannot load
TICK_S = 0.02  # how often the intake is polled while the service waits for work to finish
# train: follow the newest weights within the staleness bound; eval: an evaluator, which plays
# each request with the weight version it names and trains nothing.
Mode = Literal["train", "eval"]


class RolloutTopics(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Topic names, overridable for tests and side-by-side deployments."""

    requests: Annotated[str, Meta(description="requests to play")] = ROLLOUT_REQUESTS
    steps: Annotated[str, Meta(description="every LLM call as a GenerationStep")] = ROLLOUT_STEPS
    tool_calls: Annotated[str, Meta(description="the agent's tool calls")] = TOOL_CALLS
    tool_results: Annotated[str, Meta(description="the tool workers' answers")] = TOOL_RESULTS
    trajectories: Annotated[str, Meta(description="finished groups, for the trainer")] = (
        TRAJECTORIES
    )
    weights: Annotated[str, Meta(description="weight versions to load")] = WEIGHTS
    metrics: Annotated[
        str, Meta(description="the trainer's drops give staleness capacity back")
    ] = TRAINER_METRICS
    status: Annotated[str, Meta(description="heartbeats")] = SERVICE_STATUS
    played: Annotated[
        str, Meta(description="markers of the requests played: a copy is not played again")
    ] = REQUESTS_PLAYED

    @classmethod
    def for_eval(cls) -> RolloutTopics:
        """An evaluator's topics: its own requests in, its trajectories out of training's way."""
        return cls(requests=EVAL_REQUESTS, trajectories=EVAL_TRAJECTORIES)


class RolloutConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything `asearcher rollout serve` can be told, with defaults."""

    mode: Annotated[
        Mode,
        Meta(
            description="train: play training requests under the staleness bound; "
            "eval: each with its pinned version"
        ),
    ] = "train"
    concurrency: Annotated[int, Meta(description="trajectories played at once")] = 16
    engine_threads: Annotated[
        int | None,
        Meta(
            description=(
                "torch's intra-op threads of the CPU engine (None: torch's default, one per "
                "core). Where services share few cores, 1 each avoids oversubscription (5x "
                "faster on 2 shared cores)."
            )
        ),
    ] = None
    group_id: Annotated[str, Meta(description="the consumer group producers share")] = GROUP
    instance: Annotated[
        str | None, Meta(description="stable name: a restart under it fences its dead predecessor")
    ] = None
    model: Annotated[str, Meta(description="the model name followed on the weights topic")] = (
        "policy"
    )
    tool_pool: Annotated[
        str, Meta(description="the tool workers its calls are addressed to (ToolConfig.pool)")
    ] = ""
    # Where the trainer publishes: announcements of versions anywhere else are refused.
    store: Annotated[
        str | None,
        Meta(description="weight store URL; default $ASEARCHER_WEIGHT_STORE or <home>/weights"),
    ] = None
    drain_timeout_s: Annotated[
        float, Meta(description="on stop, how long in-flight groups may take to finish")
    ] = 60.0
    log_every_s: Annotated[float, Meta(description="period of the progress log line")] = 10.0
    status_every_s: Annotated[
        float, Meta(description="period of the heartbeat on service.status")
    ] = 5.0
    workflow: Annotated[
        str,
        Meta(
            description=(
                "The agent that plays each trajectory: a registered name or package.module:attr."
            )
        ),
    ] = workflows.DEFAULT
    agent: AgentConfig = msgspec.field(default_factory=AgentConfig)
    staleness: StalenessConfig = msgspec.field(default_factory=StalenessConfig)
    topics: RolloutTopics = msgspec.field(default_factory=RolloutTopics)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be positive, got {self.concurrency}")
        if self.engine_threads is not None and self.engine_threads < 1:
            raise ValueError(f"engine_threads must be at least 1, got {self.engine_threads}")
        for name in ("drain_timeout_s", "log_every_s", "status_every_s"):
            value = getattr(self, name)
            if not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value}")
        workflows.get(self.workflow)  # an unknown name fails here, naming the field


@dataclass
class RolloutStats:
    """What a producer has done so far."""

    groups: int = 0
    trajectories: int = 0
    generated_tokens: int = 0
    turns: int = 0
    blocked_by_staleness_s: float = 0.0
    bus_s: float = 0.0  # event-loop time spent encoding and handing events to Kafka
    commit_s: float = 0.0  # time spent in group transactions (waiting on the broker)
    started_at: float = field(default_factory=time.monotonic)
    first_group_at: float | None = None
    last_commit_at: float | None = None

    def line(self, in_flight: int, version: int) -> str:
        """One log line."""
        elapsed = max(time.monotonic() - self.started_at, 1e-9)
        return (
            f"groups={self.groups} trajectories={self.trajectories} in_flight={in_flight} "
            f"tokens/s={self.generated_tokens / elapsed:.1f} version={version} "
            f"staleness_wait_s={self.blocked_by_staleness_s:.1f}"
        )


class _Steps:
    """The agent's step sink: each step goes out at once (not part of any transaction)."""

    def __init__(self, producer: EventProducer, topic: str, stats: RolloutStats) -> None:
        self.producer, self.topic, self.stats = producer, topic, stats

    def emit(self, event: GenerationStep) -> None:
        started = time.perf_counter()
        self.stats.turns += 1
        self.stats.generated_tokens += len(event.token_ids)
        self.producer.send(self.topic, event)
        self.stats.bus_s += time.perf_counter() - started


def _reason_to_set_aside(mode: Mode) -> Callable[[Event], str | None]:
    def check(event: Event) -> str | None:
        if not isinstance(event, RolloutRequested):
            return f"expected RolloutRequested, got {event.kind()}"
        try:
            check_request(event)
        except ValueError as exc:
            return str(exc)
        if mode == "train" and event.purpose == "eval":
            return f"an evaluation request: evaluators read {EVAL_REQUESTS}, not this topic"
        if mode == "eval" and event.purpose != "eval":
            return f"purpose {event.purpose!r}: an evaluator plays evaluation requests only"
        if mode == "eval" and (event.policy_version is None or event.policy_version < 0):
            return f"an evaluation request names its weight version, got {event.policy_version}"
        return None

    return check


class RolloutService:
    """Plays requested groups with one engine until stopped."""

    def __init__(
        self,
        settings: KafkaSettings,
        codec: EventCodec,
        engine: InferenceEngine,
        config: RolloutConfig | None = None,
        **consumer_config: Any,
    ) -> None:
        self.config = config = config or RolloutConfig()
        self.engine = engine
        self.workflow = workflows.build(config.workflow, config.agent)
        self.stats = RolloutStats()
        topics = config.topics
        self.events = EventProducer(settings, codec, **LOW_LATENCY)
        self.name = OutOfOrderIntake.transactional_id("rollout", config.instance)
        self.intake = OutOfOrderIntake(
            settings,
            codec,
            config.group_id,
            topics.requests,
            self.name,
            on_revoked=self._cancel_revoked,
            validate=_reason_to_set_aside(config.mode),
            played=PlayedRequests(
                settings,
                codec,
                consumer_group=config.group_id,
                topic=topics.requests,
                played_topic=topics.played,
            ),  # fmt: skip
            **{**static_member("rollout", config.instance), **consumer_config},
        )
        self.tools = KafkaToolClient(
            settings,
            codec,
            self.events,
            calls_topic=topics.tool_calls,
            results_topic=topics.tool_results,
            pool=config.tool_pool,
        )
        self.weights = WeightsFollower(
            settings, codec, self.events, model=config.model, topic=topics.weights,
            store=WeightStoreReader(resolve_store_url(config.store)),
        )  # fmt: skip
        self.gate = StalenessGate(config.staleness, engine.version)  # rebased in serve()
        self._trainer_drops = TopicTail(
            settings, codec, topics.metrics, self._on_metrics, self.events, "end"
        )
        self.heartbeat = Heartbeat(
            self.events, "evaluator" if config.mode == "eval" else "rollout",
            config.instance or self.name,
            topic=topics.status, every_s=config.status_every_s,
        )  # fmt: skip
        self._loop: asyncio.AbstractEventLoop | None = None
        self._steps = _Steps(self.events, topics.steps, self.stats)
        self._groups: dict[tuple[int, int], asyncio.Task[bool]] = {}
        self._in_flight = 0  # admitted trajectories not yet finished
        self._unfinished: dict[tuple[int, int], int] = {}  # the same, per group
        self._waiting: list[Record] = []
        self._failure: BaseException | None = None
        self._stop_requested = False
        self._loading: asyncio.Task[None] | None = None  # an evaluator switching versions
        self._unloadable: dict[int, str] = {}  # version -> why an evaluator cannot load it
        self._settling: set[asyncio.Task[bool]] = set()  # requests skipped or set aside

    def stop(self) -> None:
        """Stop taking requests; in-flight groups get `drain_timeout_s` to finish."""
        self._stop_requested = True

    def run(self, *, max_groups: int | None = None, timeout: float | None = None) -> RolloutStats:
        """Serve until SIGINT/SIGTERM, `max_groups` finished groups, or `timeout` seconds."""
        with asyncio.Runner() as runner, stop_on_signals(self.stop):
            return runner.run(self.serve(max_groups=max_groups, timeout=timeout))

    async def serve(
        self, *, max_groups: int | None = None, timeout: float | None = None
    ) -> RolloutStats:
        """The service loop (for callers that own an event loop)."""
        # Bound to the running loop: `run` may be called again with a new one.
        self._slots = asyncio.Semaphore(self.config.concurrency)
        self._loop = asyncio.get_running_loop()
        self.tools.start()
        if self.config.mode == "train":
            self.weights.start()
            self._trainer_drops.start()
            await self._join_current_version()
            follower = asyncio.create_task(self.weights.keep_current(self.engine))
        else:  # an evaluator loads what each request names, never the newest by itself
            follower = asyncio.create_task(asyncio.Event().wait())
        deadline = None if timeout is None else time.monotonic() + timeout
        last_log = time.monotonic()
        try:
            while not self._done(max_groups, deadline):
                self._take_requests()
                self._beat()
                await asyncio.sleep(TICK_S)
                if time.monotonic() - last_log >= self.config.log_every_s:
                    last_log = time.monotonic()
                    log.info("%s", self.stats.line(self._in_flight, self.engine.version))
            self._beat("stopping", force=True)
            await self._drain()
        finally:
            self._beat("stopped", force=True)
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
        if self._failure is not None:
            raise self._failure
        return self.stats

    async def _join_current_version(self, patience_s: float = 30.0) -> None:
        """Start from the trainer's newest version, and count staleness from there."""
        deadline = time.monotonic() + patience_s
        while (
            not self.weights.caught_up()
            and time.monotonic() < deadline
            and not self._stop_requested
        ):
            await asyncio.sleep(0.05)
        latest = self.weights.latest
        if latest is not None and latest.version > self.engine.version:
            await self.weights.load(self.engine, latest)
        base = self._trainer_version()
        if self.gate.base_version != base or self.gate.started == 0:
            self.gate = StalenessGate(self.config.staleness, base)

    def _beat(self, state: str = "running", force: bool = False) -> None:
        version = self._trainer_version()
        waiting = ""
        if self._waiting and self.config.mode == "eval":
            wanted = self._waiting[0].event.policy_version  # type: ignore[union-attr]
            waiting = (
                f"loading v{wanted}" if self._loading is not None else
                f"{self._in_flight} trajectories of v{self.engine.version} to finish before "
                f"loading v{wanted}"
            )  # fmt: skip
        elif self._waiting and self._in_flight < self.config.concurrency:
            staleness = self.config.staleness
            waiting = (
                f"staleness bound: {self.gate.started} groups started, capacity "
                f"{self.gate.capacity(version)} at trainer v{version} (eta {staleness.eta}, "
                f"share {staleness.share}): waiting for the trainer to train or drop them"
            )
        elif not self._waiting and self._in_flight == 0 and state == "running":
            waiting = f"no requests on {self.config.topics.requests}"
        elapsed = max(time.monotonic() - self.stats.started_at, 1e-9)
        self.heartbeat.beat(
            state="waiting" if waiting and state == "running" else state, waiting_for=waiting,
            version=self.engine.version, force=force,
            counters={
                "groups": self.stats.groups, "trajectories": self.stats.trajectories,
                "in_flight": self._in_flight,
                "trajectories_per_s": self.stats.trajectories / elapsed,
                "tokens_per_s": self.stats.generated_tokens / elapsed,
                "staleness_wait_s": self.stats.blocked_by_staleness_s,
                "started": self.gate.started, "capacity": self.gate.capacity(version),
                "duplicates": self._duplicates(),
            },
        )  # fmt: skip

    def _duplicates(self) -> int:
        """Copies of requests already played or playing, finished unplayed."""
        return self.intake.played.duplicates if self.intake.played is not None else 0

    def _on_metrics(self, record: Record) -> None:
        # In the tail's thread: hand the trainer's drops to the event loop.
        event, loop = record.event, self._loop
        dropping = isinstance(event, TrainerStepFinished | TrajectoriesDropped)
        if dropping and event.dropped_ids and loop is not None:  # type: ignore[union-attr]
            if not loop.is_closed():
                loop.call_soon_threadsafe(
                    self.gate.dropped_by_trainer,
                    event.dropped_ids,  # type: ignore[union-attr]
                )

    def _done(self, max_groups: int | None, deadline: float | None) -> bool:
        return (
            self._stop_requested
            or self._failure is not None
            or (max_groups is not None and self.stats.groups >= max_groups)
            or (deadline is not None and time.monotonic() >= deadline)
        )

    def _take_requests(self) -> None:
        """Start waiting or new requests while slots and the staleness bound allow."""
        started = time.perf_counter()
        # Polled every tick, also when nothing new is wanted: that keeps us in the group.
        self._waiting.extend(self.intake.poll(0 if self._waiting else 4))
        self.stats.bus_s += time.perf_counter() - started
        while self._waiting:
            unplayable = self._unplayable(self._waiting[0])
            if unplayable is not None:
                self._settle(self._waiting.pop(0), unplayable)
            elif self._admits(self._waiting[0]):
                self._start_group(self._waiting.pop(0))
            else:
                break
        # Requests that cannot start yet stay in Kafka, not in memory.
        self.intake.set_paused(bool(self._waiting))
        if self._waiting and self._in_flight < self.config.concurrency:
            self.stats.blocked_by_staleness_s += TICK_S

    def _admits(self, record: Record) -> bool:
        request = record.event
        assert isinstance(request, RolloutRequested)
        if self._in_flight >= self.config.concurrency:
            return False
        playing = self._groups.get((record.partition, record.offset))
        if playing is not None and playing.cancelling():
            return False  # fetched again after a revocation: its cancelled copy has not stopped
        if self.config.mode == "train":
            return self.gate.admits(self._trainer_version())
        wanted = request.policy_version
        assert wanted is not None  # checked on intake
        if wanted == self.engine.version and self._loading is None:
            return True
        # One version at a time: the switch waits until nothing of the current one is in flight.
        if self._in_flight == 0 and self._loading is None:
            self._loading = asyncio.create_task(self._switch_to(wanted))
        return False

    def _unplayable(self, record: Record) -> str | None:
        """For an evaluator: "" for a request addressed to another evaluator group (skipped),
        a reason for one whose version cannot be loaded (set aside); None to play it."""
        request = record.event
        assert isinstance(request, RolloutRequested)
        if self.config.mode != "eval":
            return None
        if request.metadata.get("evaluator", "") not in ("", self.config.group_id):
            return ""
        assert request.policy_version is not None  # checked on intake
        return self._unloadable.get(request.policy_version)

    async def _switch_to(self, version: int) -> None:
        """Load `version` from the weight store; remember why if it cannot be loaded."""
        try:
            if version == 0:  # the initial policy is not in the store: only a fresh engine has it
                raise WeightStoreError(
                    f"version 0 is the initial policy, which this evaluator left for "
                    f"v{self.engine.version}; evaluate it with a fresh evaluator"
                )
            published = await asyncio.to_thread(self.weights.store.get, version)
            await self.engine.load_weights(published.uri, version, published.sha256)
            log.info("evaluator loaded v%d", version)
        except Exception as exc:  # a missing or broken version must not stop the evaluator
            reason = f"weight version {version} cannot be loaded: {exc}"
            log.error("%s", reason)
            # Remembered for a while only: the store may have been unreachable for a moment.
            self._unloadable[version] = reason
            asyncio.get_running_loop().call_later(
                UNLOADABLE_FOR_S, self._unloadable.pop, version, None
            )
        finally:
            self._loading = None

    def _settle(self, record: Record, reason: str) -> None:
        """Mark a request done without playing it: skipped (""), or set aside with `reason`."""
        outputs = [] if not reason else [Outgoing(DEAD_LETTERS, self._letter(record, reason))]
        task = asyncio.create_task(asyncio.to_thread(self.intake.commit, outputs, [record]))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    def _trainer_version(self) -> int:
        return self.weights.trainer_version(default=self.engine.version)

    def _start_group(self, record: Record) -> None:
        request = record.event
        assert isinstance(request, RolloutRequested)
        if (record.partition, record.offset) in self._groups:
            # Seen once in a chaos run (broker restarts, a commit blocked for a minute): the
            # same record handed out again while its group still played. Never play it twice.
            log.warning("%s is already being played (group %s): not started again",
                        record.origin, request.group_id)  # fmt: skip
            return
        self.gate.record_start()
        self._in_flight += request.group_size
        self._unfinished[(record.partition, record.offset)] = request.group_size
        if self.stats.first_group_at is None:
            self.stats.first_group_at = time.monotonic()
        task: asyncio.Task[bool] = asyncio.create_task(self._play_group(record, request))
        self._groups[(record.partition, record.offset)] = task
        task.add_done_callback(lambda t: self._group_done(record, request, t))

    async def _play_group(self, record: Record, request: RolloutRequested) -> bool:
        log.info("starting group %s (n=%d) from %s", request.group_id, request.group_size,
                 record.origin)  # fmt: skip
        key = (record.partition, record.offset)
        # A task group: if one trajectory fails, its siblings are cancelled with it.
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(self._play_one(key, request, index))
                for index in range(request.group_size)
            ]
        return await self._commit(record, [task.result() for task in tasks])

    async def _play_one(
        self, key: tuple[int, int], request: RolloutRequested, index: int
    ) -> TrajectoryFinished | None:
        try:
            async with self._slots:
                played = await self.workflow.run(
                    self.engine, self.tools, self._steps, request, index
                )
            if played is not None and not isinstance(played, TrajectoryFinished):
                raise TypeError(
                    f"workflow {self.config.workflow!r} returned {type(played).__name__}, "
                    "not a TrajectoryFinished or None"
                )
            return played
        finally:
            # A slot frees as each trajectory ends, so the next group can start filling it
            # while the rest of this group finishes.
            self._in_flight -= 1
            if key in self._unfinished:
                self._unfinished[key] -= 1

    async def _commit(self, record: Record, played: list[TrajectoryFinished | None]) -> bool:
        trajectories = delivered_group(played)
        topic = self.config.topics.trajectories
        outputs = [Outgoing(topic, t) for t in trajectories]
        if not trajectories:
            reason = f"workflow {self.config.workflow!r} delivered no trajectory for this request"
            outputs = [Outgoing(DEAD_LETTERS, self._letter(record, reason, "NothingDelivered"))]
        started = time.perf_counter()
        # Shielded: once the transaction runs it finishes, even if this group is cancelled.
        committed = await asyncio.shield(
            asyncio.to_thread(self.intake.commit, outputs, [record], bool(trajectories))
        )
        self.stats.commit_s += time.perf_counter() - started
        if not committed:
            log.info("group from %s dropped: partition revoked", record.origin)
            return False
        if trajectories:
            self.gate.track(trajectories[0].group_id, (t.trajectory_id for t in trajectories))
        else:
            self.gate.give_back()  # nothing of it will ever be trained
        self.stats.last_commit_at = time.monotonic()
        self.stats.groups += 1
        self.stats.trajectories += len(trajectories)
        return True

    def _letter(self, record: Record, reason: str, error_type: str = "Unplayable") -> DeadLetter:
        request = record.event
        assert isinstance(request, RolloutRequested)
        return DeadLetter(
            origin_topic=record.topic,
            origin_partition=record.partition,
            origin_offset=record.offset,
            reason=reason,
            error_type=error_type,
            key=(record.key or request.group_id).encode(),
            payload=self.events.codec.encode(request)[0],
        )

    def _group_done(
        self, record: Record, request: RolloutRequested, task: asyncio.Task[bool]
    ) -> None:
        key = (record.partition, record.offset)
        self._groups.pop(key, None)
        # Trajectories cancelled before they started never released their slot.
        self._in_flight -= self._unfinished.pop(key, 0)
        delivered = not task.cancelled() and task.exception() is None and task.result()
        if not delivered:
            self.gate.give_back()  # it will be played again, elsewhere
        if not task.cancelled() and task.exception() is not None:
            # A failed commit means this member can no longer vouch for its output: stop, and
            # let the group's request go to whoever takes the partition next.
            log.error("group %s failed: %r", request.group_id, task.exception())
            self._failure = self._failure or task.exception()

    def _cancel_revoked(self, partitions: list[int]) -> None:
        for (partition, _offset), task in list(self._groups.items()):
            if partition in partitions:
                task.cancel()
        # In place: `_take_requests` holds the list while it polls, and so while this runs (a
        # rebound list was overwritten by the records it had dropped; seen in CI as groups
        # played twice).
        self._waiting[:] = [r for r in self._waiting if r.partition not in partitions]

    async def _drain(self) -> None:
        """Let in-flight groups finish (up to the drain timeout), then cancel the rest."""
        tasks = list(self._groups.values())
        if tasks:
            log.info("waiting up to %.0f s for %d groups", self.config.drain_timeout_s, len(tasks))
            _, pending = await asyncio.wait(tasks, timeout=self.config.drain_timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.gather(*self._settling, return_exceptions=True)

    def close(self) -> None:
        """Leave the group, stop following topics, deliver what is queued."""
        self.tools.stop()
        self.weights.stop()
        self._trainer_drops.stop()
        self.intake.close()
        self.events.close()


def delivered_group(played: list[TrajectoryFinished | None]) -> list[TrajectoryFinished]:
    """The trajectories a group delivers: those not None, each saying how many there are."""
    delivered = [t for t in played if t is not None]
    if len(delivered) == len(played):
        return delivered
    return [msgspec.structs.replace(t, group_size=len(delivered)) for t in delivered]


def load_rollout_config(path: Path | None, **overrides: Any) -> RolloutConfig:
    """The rollout config in TOML file `path` (or the defaults), with `overrides`."""
    return load_config(RolloutConfig, "rollout config", path, **overrides)
