"""The synthesis processor: seeds in, synthesized questions out, exactly once per seed.

It reads `SynthesisRequested` seeds from `synth.requests` (keyed by seed id, 4 partitions: more
replicas take partitions and add throughput) as a member of its job's consumer group, plays the
synthesis agent on each (`synthesis.synthesize`; pages are read through the tool workers on
`tool.calls`), and sends every candidate with its verdicts to `synth.candidates` and the seed's
outcome to `synth.accepted` or `synth.rejected` in ONE transaction with the seed's offset and a
marker on `requests.played` (`streams/io/intake.py`, the rollout producer's intake). Killed
mid-seed, the next owner of the partition plays that seed again and the aborted transaction's
records are never read (read_committed); a seed sent twice is played once (the marker).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta

from asearcher.consumers.scoring.chat_endpoint import ChatEndpointConfig
from asearcher.consumers.synthesis.roles import Checker, Delayed, Writer
from asearcher.producers.rollout.tool_router import KafkaToolClient
from asearcher.producers.synthesis.agent import SynthConfig, synthesize
from asearcher.producers.synthesis.llm_roles import ChatModel
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.intake import OutOfOrderIntake, static_member
from asearcher.streams.io.played import PlayedRequests
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.service.lifecycle import stop_on_signals
from asearcher.streams.service.log import get_logger
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import Event, SynthesisCandidate, SynthesisRequested
from asearcher.streams.wire.records import Outgoing, Record
from asearcher.streams.wire.topics import (
    REQUESTS_PLAYED,
    SYNTH_ACCEPTED,
    SYNTH_CANDIDATES,
    SYNTH_REJECTED,
    SYNTH_REQUESTS,
    TOOL_CALLS,
    TOOL_RESULTS,
)

log = get_logger(__name__)
TICK_S = 0.05  # how often the intake is polled while seeds play
DRAIN_S = 60.0  # how long seeds in play may finish after a stop
WORLD = "world"  # the rule-based role on the synthetic world's knowledge graph
ROLE_KINDS = (WORLD, "endpoint", "engine")


class SynthRole(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Who plays a role: "world" (rule-based, on the world's graph), "endpoint" (any
    OpenAI-compatible server, e.g. vLLM's, as `endpoint` describes) or "engine" (an inference
    engine of this process: `engine` on the weights in `model_dir`)."""

    kind: Annotated[str, Meta(description="world | endpoint | engine")] = WORLD
    endpoint: Annotated[
        ChatEndpointConfig | None,
        Meta(
            description="an OpenAI-compatible endpoint playing the role "
            "(None: a local model or the rules)"
        ),
    ] = None
    engine: Annotated[str, Meta(description="the local engine of model_dir")] = "transformers"
    model_dir: Annotated[
        str,
        Meta(
            description='a local model playing the role ("": the rule-based role '
            "on the world's graph)"
        ),
    ] = ""
    max_new_tokens: Annotated[
        int, Meta(description="kind engine: room to think before the JSON reply")
    ] = 1024
    temperature: Annotated[float, Meta(description="kind engine")] = 0.6
    latency_s: Annotated[
        float,
        Meta(
            description=(
                "Seconds each call waits first: a stand-in for a model's latency on the world"
                " roles, to measure what scales with model calls without a model."
            )
        ),
    ] = 0.0
    prompt_files: Annotated[
        dict[str, str],
        Meta(
            description=(
                'Model-backed roles: prompt name (llm_roles.PROMPTS, e.g. "fuzz") -> a file '
                "with that prompt in the user's wording, using the placeholders of the "
                "project's prompt."
            )
        ),
    ] = {}

    def __post_init__(self) -> None:
        if self.latency_s < 0:
            raise ValueError(f"a synthesis role's latency_s must be >= 0, not {self.latency_s}")
        if self.kind not in ROLE_KINDS:
            raise ValueError(f"a synthesis role's kind must be one of {', '.join(ROLE_KINDS)}, "
                             f"not {self.kind!r}")  # fmt: skip
        if self.kind == "endpoint" and self.endpoint is None:
            raise ValueError("an endpoint role needs endpoint (base_url and model)")
        if self.prompt_files:
            from asearcher.producers.synthesis.llm_roles import load_prompts

            load_prompts(self.prompt_files)  # a bad file or placeholder is named here
        if self.kind == "engine" and not self.model_dir:
            raise ValueError("an engine role needs model_dir")


class SynthProcessorConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What the synthesis processor reads, writes and plays."""

    app_id: Annotated[
        str, Meta(description="the consumer group of the job's processors (one per job)")
    ] = "asearcher-synth"
    instance: Annotated[
        str,
        Meta(
            description=(
                'this replica\'s stable name ("": none): restarted under it, a processor takes '
                "its partitions back at once and fences its dead predecessor"
            )
        ),
    ] = ""
    concurrency: Annotated[int, Meta(description="seeds played at once by one processor")] = 1
    job: Annotated[
        str, Meta(description='only seeds whose metadata names this job ("": every seed)')
    ] = ""
    world_seed: Annotated[int, Meta(description='the world whose graph the "world" roles use')] = 0
    world_entities: Annotated[
        int, Meta(description="size of the synthetic world the rule-based roles know")
    ] = 300
    known_share: Annotated[
        float, Meta(description="facts the world checker knows without tools")
    ] = 0.5
    writer: SynthRole = msgspec.field(default_factory=SynthRole)
    checker: SynthRole = msgspec.field(default_factory=SynthRole)
    synthesis: SynthConfig = msgspec.field(default_factory=SynthConfig)
    requests_topic: Annotated[str, Meta(description="seeds to synthesize from")] = SYNTH_REQUESTS
    candidates_topic: Annotated[
        str, Meta(description="every candidate question with its verdicts")
    ] = SYNTH_CANDIDATES
    accepted_topic: Annotated[str, Meta(description="questions that passed every check")] = (
        SYNTH_ACCEPTED
    )
    rejected_topic: Annotated[str, Meta(description="seeds that gave no acceptable question")] = (
        SYNTH_REJECTED
    )
    played_topic: Annotated[
        str, Meta(description="markers of the seeds played (a seed sent twice is played once)")
    ] = REQUESTS_PLAYED
    tool_calls_topic: Annotated[str, Meta(description="page reads, sent to the tool workers")] = (
        TOOL_CALLS
    )
    tool_results_topic: Annotated[str, Meta(description="the tool workers' answers")] = TOOL_RESULTS
    tool_pool: Annotated[
        str, Meta(description="the tool workers its page reads are addressed to (ToolConfig.pool)")
    ] = ""
    pause_per_seed_s: Annotated[
        float,
        Meta(
            description=(
                "Fault injection for tests: sleep this long after each seed's synthesis, "
                "before its commit."
            )
        ),
    ] = 0.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {self.concurrency}")


def build_roles(config: SynthProcessorConfig) -> tuple[Writer, Checker]:
    """The writer and the checker `config` names."""
    writer: Writer | None = None
    checker: Checker | None = None
    if WORLD in (config.writer.kind, config.checker.kind):
        from asearcher.consumers.synthesis.world_roles import WorldChecker, WorldWriter
        from asearcher.consumers.world.world import build_graph

        graph = build_graph(config.world_seed, config.world_entities)
        if config.writer.kind == WORLD:
            writer = WorldWriter(graph, seed=config.world_seed)
        if config.checker.kind == WORLD:
            checker = WorldChecker(graph, seed=config.world_seed, known_share=config.known_share)
    if writer is None:
        from asearcher.producers.synthesis.llm_roles import LlmWriter

        writer = LlmWriter(chat_model(config.writer), prompts=config.writer.prompt_files)
    if checker is None:
        from asearcher.producers.synthesis.llm_roles import LlmChecker

        checker = LlmChecker(chat_model(config.checker), prompts=config.checker.prompt_files)
    if config.writer.latency_s:
        writer = Delayed(writer, config.writer.latency_s)  # type: ignore[assignment]
    if config.checker.latency_s:
        checker = Delayed(checker, config.checker.latency_s)  # type: ignore[assignment]
    return writer, checker


def chat_model(role: SynthRole) -> ChatModel:
    """The chat model behind a model-backed role."""
    from asearcher.producers.synthesis.llm_roles import EndpointChat, EngineChat

    if role.endpoint is not None:
        return EndpointChat(role.endpoint)
    from asearcher.producers.engines.registry import make_engine

    engine = make_engine(role.engine, Path(role.model_dir))
    return EngineChat(engine, max_new_tokens=role.max_new_tokens, temperature=role.temperature)


def place(record: Record) -> tuple[int, int]:
    """Where a seed was read: its partition and offset."""
    return record.partition, record.offset


def reason_to_set_aside(event: Event) -> str | None:
    """Why a seed cannot be played (it goes to the dead-letter topic), or None."""
    if (
        isinstance(event, SynthesisRequested)
        and event.seed_id
        and (event.question or event.page_url)
    ):
        return None
    return "a seed needs seed_id and a question or a page_url"


class SynthProcessor:
    """Plays the seeds of its job, `concurrency` at a time, until stopped."""

    def __init__(self, settings: KafkaSettings, codec: EventCodec, config: SynthProcessorConfig):
        self.config = config
        self.writer, self.checker = build_roles(config)
        self.intake = OutOfOrderIntake(
            settings, codec, config.app_id, config.requests_topic,
            OutOfOrderIntake.transactional_id(config.app_id, config.instance or None),
            on_revoked=self._cancel_revoked, validate=reason_to_set_aside,
            played=PlayedRequests(settings, codec, consumer_group=config.app_id,
                                  topic=config.requests_topic, played_topic=config.played_topic),
            **static_member(config.app_id, config.instance or None),
        )  # fmt: skip
        self.calls = EventProducer(settings, codec)
        self.tools = KafkaToolClient(
            settings, codec, self.calls, calls_topic=config.tool_calls_topic,
            results_topic=config.tool_results_topic, pool=config.tool_pool,
        )  # fmt: skip
        self.synthesized = 0
        self._waiting: list[Record] = []
        self._playing: dict[tuple[int, int], asyncio.Task[object]] = {}
        self._failure: BaseException | None = None
        self._stop_requested = False

    def stop(self) -> None:
        """Take no more seeds; those in play get `DRAIN_S` to finish."""
        self._stop_requested = True

    def run(self, timeout: float | None = None) -> int:
        """Serve until SIGINT/SIGTERM, `stop()` or `timeout` seconds; the seeds synthesized."""
        with asyncio.Runner() as runner, stop_on_signals(self.stop):
            runner.run(self.serve(timeout))
        return self.synthesized

    async def serve(self, timeout: float | None = None) -> None:
        """The service loop (for callers that own an event loop)."""
        self.tools.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (self._stop_requested or self._failure is not None
                   or (deadline is not None and time.monotonic() >= deadline)):  # fmt: skip
            self._take_seeds()
            await asyncio.sleep(TICK_S)
        if self._playing:
            log.info("stopping: %d seed(s) in play get %.0f s to finish", len(self._playing),
                     DRAIN_S)  # fmt: skip
            await asyncio.wait(list(self._playing.values()), timeout=DRAIN_S)
        if self._failure is not None:
            raise self._failure

    def _take_seeds(self) -> None:
        # Polled every tick, also when full: that keeps this member in its group.
        free = self.config.concurrency - len(self._playing)
        self._waiting.extend(self.intake.poll(0 if self._waiting else free))
        while self._waiting and len(self._playing) < self.config.concurrency:
            if place(self._waiting[0]) in self._playing:
                break  # fetched again after a revocation: its cancelled copy has not stopped
            self._start(self._waiting.pop(0))
        # Seeds that cannot start yet wait in Kafka, not in memory.
        self.intake.set_paused(bool(self._waiting))

    def _start(self, record: Record) -> None:
        seed = record.event
        assert isinstance(seed, SynthesisRequested)  # checked on intake
        if self.config.job and seed.metadata.get("job") != self.config.job:
            # Another job's seed: its own processors play it; done here without outputs.
            task = asyncio.create_task(self._commit(record, [], False))
        else:
            task = asyncio.create_task(self._synthesize(record, seed))
        self._playing[place(record)] = task
        task.add_done_callback(lambda ended: self._ended(record, ended))

    async def _synthesize(self, record: Record, seed: SynthesisRequested) -> None:
        candidates: list[SynthesisCandidate] = []
        outcome = await synthesize(seed, self.writer, self.checker, self.tools,
                                   self.config.synthesis, candidates.append)  # fmt: skip
        if self.config.pause_per_seed_s:
            await asyncio.sleep(self.config.pause_per_seed_s)
        target = self.config.accepted_topic if outcome.accepted else self.config.rejected_topic
        outputs = [Outgoing(self.config.candidates_topic, c) for c in candidates]
        if await self._commit(record, [*outputs, Outgoing(target, outcome)], True):
            self.synthesized += 1
            log.info("%s", outcome.summary())

    async def _commit(self, record: Record, outputs: list[Outgoing], played: bool) -> bool:
        # Shielded: once the transaction runs it finishes, even if the seed is cancelled.
        committed = await asyncio.shield(
            asyncio.to_thread(self.intake.commit, outputs, [record], played)
        )
        if not committed:
            log.info("seed from %s dropped: its partition was revoked", record.origin)
        return committed

    def _ended(self, record: Record, task: asyncio.Task[object]) -> None:
        self._playing.pop(place(record), None)
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            # The seed is not committed: whoever owns its partition next plays it again.
            self._failure = task.exception()

    def _cancel_revoked(self, partitions: list[int]) -> None:
        # Runs in the polling thread (this loop's): seeds of a lost partition cannot commit.
        for (partition, _), task in list(self._playing.items()):
            if partition in partitions:
                task.cancel()
        # In place: the caller may hold the list while it polls (and so while this runs).
        self._waiting[:] = [r for r in self._waiting if r.partition not in partitions]

    def close(self) -> None:
        """Leave the group and stop the tool client."""
        self.intake.close()
        self.tools.stop()
        self.calls.close()
