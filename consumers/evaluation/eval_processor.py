"""The evaluation processor: finished evaluation trajectories in, one `EvalResult` per benchmark
and weight version out; and, during a run, evaluation requests for every Nth version.

A faust-streaming app. `eval.trajectories` is keyed by `<eval id>/<benchmark>`, so all samples
of one evaluation of one benchmark meet on one partition, where two tables (backed by changelog
topics) keep their running scores: entries of bounded size per evaluation and per question
(`eval_gathering`). When every question has all its samples, the processor sends the
`EvalResult`. The tables and the result are written in the transaction that commits the input
offset (faust's exactly-once processing; the result is published with that commit, see
`streams.faust_app.transactional_output`): killed at any point, a restarted processor rebuilds
the tables from their changelogs, neither counts a sample twice nor loses one, and publishes
each result once. A question keeps its samples' trajectory ids, so a trajectory delivered twice
counts once.

Continuous evaluation: the processor follows `weights`; for each version of the run's model
that is a multiple of `every_versions`, it requests an evaluation of that version on the
configured benchmarks (on `eval.requests`, pinned to that version), once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import msgspec
from faust.types import EventT, StreamT
from msgspec import Meta

from asearcher.consumers.evaluation.benchmarks import (
    WORLD_BENCHMARK,
    BenchmarkQuestion,
    eval_requests,
    read_benchmark,
    read_world_benchmark,
)
from asearcher.consumers.evaluation.eval_gathering import count_sample
from asearcher.consumers.evaluation.eval_scores import sample_of
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.service.faust_app import (
    FaustEvents,
    StagedWrites,
    make_app,
    raw_topic,
    run_worker,
    transactional_output,
)
from asearcher.streams.service.log import get_logger
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import (
    SamplingSettings,
    TrajectoryFinished,
    WeightsPublished,
)
from asearcher.streams.wire.topics import (
    EVAL_REQUESTS,
    EVAL_RESULTS,
    EVAL_TRAJECTORIES,
    WEIGHTS,
    topic_spec,
)

log = get_logger(__name__)


class EvalProcessorConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What the evaluation processor aggregates, and what it requests during a run."""

    app_id: Annotated[
        str, Meta(description="the faust app (its consumer group and changelog topics)")
    ] = "asearcher-eval"
    model: Annotated[
        str,
        Meta(
            description=(
                "The run whose evaluations this processor gathers (their requests say "
                '`model`) and whose versions it evaluates continuously; "": every evaluation,'
                " none continuously."
            )
        ),
    ] = ""
    every_versions: Annotated[
        int,
        Meta(
            description=(
                "Evaluate each version of `model` that is a multiple of this (0, or no model:"
                " never)."
            )
        ),
    ] = 0
    benchmarks: Annotated[
        list[str], Meta(description="benchmarks evaluated (world: the run's world, of `split`)")
    ] = msgspec.field(default_factory=lambda: [WORLD_BENCHMARK])
    data_dir: Annotated[
        str | None, Meta(description="benchmarks as <data_dir>/<name>/<split>.jsonl")
    ] = None
    world_dir: Annotated[
        str | None, Meta(description='the synthetic world whose questions of `split` are "world"')
    ] = None
    split: Annotated[
        str,
        Meta(
            description=(
                'split of the benchmarks: "test" (held out), or "valid" (the synthetic world\'s'
                " validation questions, kept out of training: what a version is chosen by)"
            )
        ),
    ] = "test"
    samples: Annotated[int, Meta(description="k: samples per question")] = 4
    limit: Annotated[int | None, Meta(description="questions per benchmark (None: all)")] = None
    evaluator: Annotated[str, Meta(description='the evaluator group asked ("": any)')] = ""
    sampling: SamplingSettings = msgspec.field(
        default_factory=lambda: SamplingSettings(temperature=0.6, top_p=0.95)
    )
    trajectories_topic: Annotated[str, Meta(description="evaluation trajectories it scores")] = (
        EVAL_TRAJECTORIES
    )
    results_topic: Annotated[
        str, Meta(description="where it sends one EvalResult per benchmark and version")
    ] = EVAL_RESULTS
    requests_topic: Annotated[str, Meta(description="where it asks for continuous evaluations")] = (
        EVAL_REQUESTS
    )
    weights_topic: Annotated[
        str, Meta(description="versions it follows for continuous evaluation")
    ] = WEIGHTS
    pause_after_result_s: Annotated[
        float,
        Meta(
            description=(
                "Fault injection for tests: sleep this long after a result is made, before "
                "its commit."
            )
        ),
    ] = 0.0

    def __post_init__(self) -> None:
        if self.every_versions < 0:
            raise ValueError(f"every_versions must be >= 0, got {self.every_versions}")
        if self.samples < 1:
            raise ValueError(f"samples must be at least 1, got {self.samples}")


def _reason_to_refuse(trajectory: TrajectoryFinished) -> str | None:
    metadata = trajectory.metadata
    if trajectory.purpose != "eval":
        return f"purpose {trajectory.purpose!r}: not an evaluation trajectory"
    missing = [k for k in ("eval_id", "benchmark", "questions") if not metadata.get(k)]
    if missing:
        return f"evaluation metadata lacks {', '.join(missing)}"
    # isdecimal, not isdigit: "²" is a digit that int() refuses.
    if not metadata["questions"].isdecimal() or int(metadata["questions"]) < 1:
        return f"metadata questions={metadata['questions']!r} is not a positive count"
    if trajectory.group_size < 1:
        return f"group_size {trajectory.group_size} is not positive"
    return None


class EvalProcessor:
    """The faust app and its agents."""

    def __init__(
        self, settings: KafkaSettings, codec: EventCodec, config: EvalProcessorConfig, datadir: Path
    ) -> None:
        self.config = config
        # Results wait for the commit of the sample that completed them, in its transaction.
        self.app = make_app(config.app_id, settings, datadir, stream_publish_on_commit=True)
        self.events = FaustEvents(self.app, codec, settings)
        # Values are JSON text, so the changelogs read like every other topic. Both tables are
        # updated from eval.trajectories, whose key puts an evaluation on one partition.
        self.tallies = self.app.Table(
            "tallies", key_type=str, value_type=str, default=None,
            partitions=topic_spec(EVAL_TRAJECTORIES).partitions,
        )  # fmt: skip
        self.questions = self.app.Table(
            "questions", key_type=str, value_type=str, default=None,
            partitions=topic_spec(EVAL_TRAJECTORIES).partitions,
        )  # fmt: skip
        # A table is partitioned like the topic whose records update it: `weights` has one.
        self.requested = self.app.Table(
            "requested", key_type=str, value_type=str, default=None,
            partitions=topic_spec(WEIGHTS).partitions,
        )  # fmt: skip
        self.results = transactional_output(self.app, config.results_topic)
        self.requests = raw_topic(self.app, config.requests_topic)
        self.app.agent(raw_topic(self.app, config.trajectories_topic), name="gather")(self._gather)
        if config.every_versions and config.model:
            self.app.agent(raw_topic(self.app, config.weights_topic), name="schedule")(
                self._schedule
            )

    async def _gather(self, stream: StreamT) -> None:
        async for event in stream.events():
            trajectory = await self.events.decode(event, (TrajectoryFinished,))
            if isinstance(trajectory, TrajectoryFinished):
                await self._add(event, trajectory)

    async def _add(self, event: EventT, trajectory: TrajectoryFinished) -> None:
        if self.config.model and trajectory.metadata.get("model") != self.config.model:
            return  # another run's evaluation: its own processor gathers it
        reason = _reason_to_refuse(trajectory)
        try:
            sample = sample_of(trajectory) if reason is None else None
        except ValueError as exc:
            reason = str(exc)
        if reason is not None or sample is None:
            await self.events.set_aside(event, reason or "unusable", "InvalidEvalTrajectory")
            return
        tallies, questions = StagedWrites(self.tallies), StagedWrites(self.questions)
        result = count_sample(tallies, questions, trajectory, sample)
        # The entries and the result go out in the transaction that commits this sample's offset.
        await self.events.commit_writes(event, tallies, questions)
        if result is not None:
            await self.events.send_with_commit(event, self.results, result)
            log.info("%s", result.summary())
            if self.config.pause_after_result_s:
                await asyncio.sleep(self.config.pause_after_result_s)

    async def _schedule(self, stream: StreamT) -> None:
        async for event in stream.events():
            announced = await self.events.decode(event, (WeightsPublished,))
            if not isinstance(announced, WeightsPublished):
                continue
            version, every = announced.version, self.config.every_versions
            if announced.model != self.config.model or version < 1 or version % every:
                continue
            eval_id = f"{announced.model}-v{version}"
            if self.requested.get(eval_id) is not None:
                continue  # asked already (the announcement was read again)
            await self._request(eval_id, version)
            await self.events.set_with_commit(event, self.requested, eval_id, "1")

    async def _request(self, eval_id: str, version: int) -> None:
        config = self.config
        for benchmark in config.benchmarks:
            try:
                questions = self._questions(benchmark)
            except ValueError as exc:
                log.error("cannot evaluate %s on %s: %s", eval_id, benchmark, exc)
                continue
            requests = eval_requests(
                questions, eval_id=eval_id, benchmark=benchmark, k=config.samples,
                policy_version=version, sampling=config.sampling, evaluator=config.evaluator,
            )  # fmt: skip
            for request in requests:
                request.metadata["model"] = config.model
                await self.events.send(self.requests, request)
            log.info("requested %s: %d questions of %s x %d samples at v%d", eval_id,
                     len(requests), benchmark, config.samples, version)  # fmt: skip

    def _questions(self, benchmark: str) -> list[BenchmarkQuestion]:
        config = self.config
        if benchmark == WORLD_BENCHMARK and config.world_dir:
            questions = read_world_benchmark(Path(config.world_dir), config.split)
        elif config.data_dir:
            questions = read_benchmark(config.data_dir, benchmark, config.split)
        else:
            raise ValueError(f"no data_dir (and no world for {WORLD_BENCHMARK!r})")
        return questions[: config.limit]


def serve_eval_processor(
    settings: KafkaSettings,
    codec: EventCodec,
    config: EvalProcessorConfig,
    datadir: Path,
    log_level: str = "INFO",
) -> int:
    """Run the evaluation processor until SIGINT/SIGTERM; the worker's exit status."""
    return run_worker(EvalProcessor(settings, codec, config, datadir).app, log_level)
