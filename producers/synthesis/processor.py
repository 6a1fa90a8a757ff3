"""The synthesis processor: seeds in, synthesized questions out, exactly once per seed.

A faust-streaming app like the evaluation processor. It reads `SynthesisRequested` seeds from
`synth.requests` (keyed by seed id, 4 partitions: more replicas take partitions and add
throughput), plays the synthesis agent on each (`synthesis.synthesize`; pages are read through
the tool workers on `tool.calls`), and sends every candidate with its verdicts to
`synth.candidates` and the seed's outcome to `synth.accepted` or `synth.rejected`, all in the
transaction that commits the seed's offset (faust's exactly-once processing). Killed mid-seed,
a restarted processor plays that seed again and the aborted transaction's records are never
read (read_committed); a table of finished seeds (backed by its changelog) makes a seed sent
twice give one outcome.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import msgspec
from faust.types import EventT, StreamT
from msgspec import Meta

from asearcher.consumers.scoring.chat_endpoint import ChatEndpointConfig
from asearcher.consumers.synthesis.roles import Checker, Delayed, Writer
from asearcher.producers.rollout.tool_router import KafkaToolClient
from asearcher.producers.synthesis.agent import SynthConfig, synthesize
from asearcher.producers.synthesis.llm_roles import ChatModel
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.service.faust_app import (
    FaustEvents,
    make_app,
    raw_topic,
    run_worker,
    transactional_output,
)
from asearcher.streams.service.log import get_logger
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import SynthesisCandidate, SynthesisRequested
from asearcher.streams.wire.topics import (
    SYNTH_ACCEPTED,
    SYNTH_CANDIDATES,
    SYNTH_REJECTED,
    SYNTH_REQUESTS,
    TOOL_CALLS,
    TOOL_RESULTS,
    topic_spec,
)

log = get_logger(__name__)
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
        str, Meta(description="the faust app (its consumer group and changelog topics)")
    ] = "asearcher-synth"
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
                "Fault injection for tests: sleep this long after each seed's output, before "
                "its commit."
            )
        ),
    ] = 0.0


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


class SynthProcessor:
    """The faust app and its agent."""

    def __init__(
        self,
        settings: KafkaSettings,
        codec: EventCodec,
        config: SynthProcessorConfig,
        datadir: Path,
    ) -> None:
        self.settings, self.codec, self.config = settings, codec, config
        # Outputs wait for the commit of their seed's offset and go out in its transaction.
        self.app = make_app(config.app_id, settings, datadir, stream_publish_on_commit=True)
        self.events = FaustEvents(self.app, codec, settings)
        self.writer, self.checker = build_roles(config)
        # Finished seeds by id, so a seed sent twice is synthesized once. The table is updated
        # from synth.requests, keyed by seed id, so it is partitioned like that topic.
        self.finished = self.app.Table(
            "finished",
            key_type=str,
            value_type=str,
            default=None,
            partitions=topic_spec(SYNTH_REQUESTS).partitions,
        )
        self.candidates = transactional_output(self.app, config.candidates_topic)
        self.accepted = transactional_output(self.app, config.accepted_topic)
        self.rejected = transactional_output(self.app, config.rejected_topic)
        self.tools: KafkaToolClient | None = None
        self.producer: EventProducer | None = None
        self.app.agent(raw_topic(self.app, config.requests_topic), name="synthesize")(self._run)

    def _tool_client(self) -> KafkaToolClient:
        # Started lazily, from the agent's running loop, which the client delivers results to.
        if self.tools is None:
            self.producer = EventProducer(self.settings, self.codec)
            self.tools = KafkaToolClient(
                self.settings,
                self.codec,
                self.producer,
                calls_topic=self.config.tool_calls_topic,
                results_topic=self.config.tool_results_topic,
                pool=self.config.tool_pool,
            )
            self.tools.start()
        return self.tools

    async def _run(self, stream: StreamT) -> None:
        async for event in stream.events():
            seed = await self.events.decode(event, (SynthesisRequested,))
            if not isinstance(seed, SynthesisRequested):
                continue
            if not seed.seed_id or not (seed.question or seed.page_url):
                await self.events.set_aside(
                    event, "a seed needs seed_id and a question or a page_url", "InvalidSeed"
                )
                continue
            if self.config.job and seed.metadata.get("job") != self.config.job:
                continue  # another job's seed: its own processors play it
            if self.finished.get(seed.seed_id) is not None:
                log.info("seed %s was synthesized already; skipped", seed.seed_id)
                continue
            await self._synthesize(event, seed)

    async def _synthesize(self, event: EventT, seed: SynthesisRequested) -> None:
        candidates: list[SynthesisCandidate] = []
        outcome = await synthesize(seed, self.writer, self.checker, self._tool_client(),
                                   self.config.synthesis, candidates.append)  # fmt: skip
        if self.config.pause_per_seed_s:
            await asyncio.sleep(self.config.pause_per_seed_s)
        # Published with the commit of the seed's offset, in its transaction, the table entry
        # too: all or nothing.
        for candidate in candidates:
            await self.events.send_with_commit(event, self.candidates, candidate)
        target = self.accepted if outcome.accepted else self.rejected
        await self.events.send_with_commit(event, target, outcome)
        status = "accepted" if outcome.accepted else "rejected"
        await self.events.set_with_commit(event, self.finished, seed.seed_id, status)
        log.info("%s", outcome.summary())


def serve_synth_processor(
    settings: KafkaSettings,
    codec: EventCodec,
    config: SynthProcessorConfig,
    datadir: Path,
    log_level: str = "INFO",
) -> int:
    """Run the synthesis processor until SIGINT/SIGTERM; the worker's exit status."""
    processor = SynthProcessor(settings, codec, config, datadir)
    try:
        return run_worker(processor.app, log_level)
    finally:
        if processor.tools is not None:
            processor.tools.stop()
