"""A run's metrics as TensorBoard scalars: the trainer's steps and the evaluation results.

`MetricsWriter` turns the events of one run (`model == run`) into scalars, the weight version
as the step, so training and evaluation curves share their x axis:

- `train/*` from every `TrainerStepFinished`: reward, loss, clipping, batch size, staleness
  mean and max, speed, idle share, and the drops committed with the step (`train/dropped/*`);
- `train/dropped_between_steps/*` from every `TrajectoriesDropped`;
- `eval/<benchmark>/<measure>` (Avg@k) and `eval/<benchmark>/<score>_pass@<k>` (Pass@k) from
  every `EvalResult`.

`metrics_app` is the stream processor around it: a faust app that follows `trainer.metrics` and
`eval.results` and writes each event as it comes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import faust
from faust.types import StreamT
from tensorboard.compat.proto.event_pb2 import Event as TensorBoardEvent
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from asearcher.streams.cluster.settings import KafkaSettings, claim_store, state_dir
from asearcher.streams.service.faust_app import FaustEvents, make_app, raw_topic, run_worker
from asearcher.streams.service.log import get_logger
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import (
    EvalResult,
    Event,
    TrainerStepFinished,
    TrajectoriesDropped,
)
from asearcher.streams.wire.topics import EVAL_RESULTS, TRAINER_METRICS, topic_spec

log = get_logger(__name__)

TRAINER_KINDS = topic_spec(TRAINER_METRICS).event_types
EVAL_KINDS = topic_spec(EVAL_RESULTS).event_types
# Event files this processor writes end so, to tell them from a trainer's own TensorBoard files.
FILE_SUFFIX = ".asearcher-metrics"

Scalars = dict[str, float]


def staleness_stats(counts: Sequence[int]) -> tuple[float, int] | None:
    """Mean and max staleness of `counts` (counts[k]: samples k versions old); None if empty."""
    total = sum(counts)
    if total <= 0:
        return None
    mean = sum(age * count for age, count in enumerate(counts)) / total
    oldest = max(age for age, count in enumerate(counts) if count > 0)
    return mean, oldest


def trajectories_per_s(
    previous_version: int, previous_at: float, step: TrainerStepFinished
) -> float | None:
    """Trajectories trained per wall-clock second between the step that made `previous_version`
    (at `previous_at`) and `step`; None unless `step` made the very next version."""
    elapsed = step.created_at - previous_at
    # Only between consecutive versions: across a restart or a gap the interval means nothing.
    if step.version != previous_version + 1 or elapsed <= 0:
        return None
    return step.stats.samples / elapsed


def step_scalars(step: TrainerStepFinished) -> Scalars:
    """The `train/*` scalars of one optimiser step."""
    stats = step.stats
    scalars: Scalars = {
        "train/reward_mean": stats.reward_mean,
        "train/loss": stats.loss,
        "train/clip_fraction": stats.clip_fraction,
        "train/capped_fraction": stats.capped_fraction,
        "train/groups": step.groups,
        "train/samples": stats.samples,
        "train/tokens": stats.tokens,
        "train/trained_tokens": stats.trained_tokens,
        "train/step_s": stats.seconds,
        "train/tokens_per_s": stats.tokens_per_s,
        "train/idle_fraction": step.idle_fraction,
        "train/dropped/stale_samples": step.dropped_stale,
        "train/dropped/flat_groups": step.dropped_flat_groups,
        "train/dropped/small_groups": step.dropped_small_groups,
        "train/dropped/duplicates": step.duplicates,
    }
    stats = staleness_stats(step.staleness_counts)
    if stats is not None:
        scalars["train/staleness_mean"], scalars["train/staleness_max"] = stats
    return scalars


def drop_scalars(drop: TrajectoriesDropped) -> Scalars:
    """What the trainer set aside on its own, between two steps."""
    return {
        "train/dropped_between_steps/stale_samples": drop.dropped_stale,
        "train/dropped_between_steps/flat_groups": drop.dropped_flat_groups,
        "train/dropped_between_steps/small_groups": drop.dropped_small_groups,
        "train/dropped_between_steps/duplicates": drop.duplicates,
    }


def eval_scalars(result: EvalResult) -> Scalars:
    """Avg@k of every measure and Pass@k of every score of one benchmark at one version."""
    prefix = f"eval/{result.benchmark}"
    scalars = {f"{prefix}/{name}": value for name, value in result.averages.items()}
    k = result.samples_per_question
    # k in the tag: Pass@4 and Pass@8 are different measures and must not share a curve.
    scalars.update({f"{prefix}/{name}_pass@{k}": value for name, value in result.best_of_k.items()})
    return scalars


class MetricsWriter:
    """Writes the events of run `run` as TensorBoard scalars into `logdir`.

    Stateless but for the previous step's time (trajectories per second are measured between
    consecutive steps), so a processor that restarts mid-topic writes the same points.
    """

    def __init__(self, run: str, logdir: Path, *, flush_s: float = 5.0) -> None:
        self.run, self.logdir = run, logdir
        self.files = EventFileWriter(str(logdir), flush_secs=flush_s, filename_suffix=FILE_SUFFIX)
        self.written = 0  # events written (not scalars)
        self.ignored = 0  # events of other runs or kinds
        self._previous_step: tuple[int, float] | None = None  # (version, created_at)
        self._closed = False

    def scalars(self, event: Event) -> tuple[int, Scalars] | None:
        """The step (weight version) and scalars of `event`, None if it is not this run's."""
        if getattr(event, "model", None) != self.run:
            return None
        if isinstance(event, TrainerStepFinished):
            return event.version, {**step_scalars(event), **self._throughput(event)}
        if isinstance(event, TrajectoriesDropped):
            return event.version, drop_scalars(event)
        if isinstance(event, EvalResult):
            return event.policy_version, eval_scalars(event)
        return None

    def _throughput(self, step: TrainerStepFinished) -> Scalars:
        previous, self._previous_step = self._previous_step, (step.version, step.created_at)
        rate = None if previous is None else trajectories_per_s(*previous, step)
        return {} if rate is None else {"train/trajectories_per_s": rate}

    def write(self, event: Event) -> int:
        """Queue the scalars of `event` (the event's creation time as their wall time); return
        how many, 0 for an event of another run or kind."""
        found = self.scalars(event)
        if found is None:
            self.ignored += 1
            return 0
        step, scalars = found
        values = [Summary.Value(tag=tag, simple_value=float(v)) for tag, v in scalars.items()]
        record = TensorBoardEvent(
            wall_time=event.created_at, step=step, summary=Summary(value=values)
        )
        self.files.add_event(record)
        self.written += 1
        return len(values)

    def flush(self) -> None:
        """Write every queued scalar to disk."""
        if not self._closed:
            self.files.flush()

    def close(self) -> None:
        """Flush and close the event file (again: nothing)."""
        if not self._closed:
            self._closed = True
            self.files.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def metrics_app_id(run: str) -> str:
    """The metrics processor's faust app id for run `run`: its consumer group, and the prefix
    of the topics and transactional ids it owns."""
    return f"asearcher-{run}-metrics"


def metrics_app(
    settings: KafkaSettings,
    codec: EventCodec,
    run: str,
    logdir: Path,
    datadir: Path,
    *,
    metrics_topic: str = TRAINER_METRICS,
    eval_topic: str = EVAL_RESULTS,
    writer: MetricsWriter | None = None,
) -> faust.App:
    """A faust app that writes run `run`'s metrics and evaluation results into `logdir`.

    Its consumer group is `asearcher-<run>-metrics`, so a restart continues from its committed
    offsets. `writer` (default: a fresh one on `logdir`) is closed when the app stops.
    """
    # At least once rather than exactly once: the event files are outside Kafka, so no Kafka
    # transaction can make their writes atomic with the offsets. A record read again after a
    # crash repeats a point at the same step, which TensorBoard shows harmlessly.
    app = make_app(metrics_app_id(run), settings, datadir, exactly_once=False)
    events = FaustEvents(app, codec, settings)
    sink = writer if writer is not None else MetricsWriter(run, logdir)

    async def consume(stream: StreamT, kinds: tuple[type[Event], ...]) -> None:
        async for record in stream.events():
            event = await events.decode(record, kinds)
            # Flushed at once: the offset is committed once the body is done, and a point
            # committed but still in memory would be lost by a crash. Steps come seconds apart.
            if event is not None and sink.write(event):
                sink.flush()

    async def trainer_metrics(stream: StreamT) -> None:
        await consume(stream, TRAINER_KINDS)

    async def eval_results(stream: StreamT) -> None:
        await consume(stream, EVAL_KINDS)

    async def close_writer(sender: faust.App, **_: Any) -> None:
        log.info("metrics of %s: %d events written to %s", run, sink.written, logdir)
        sink.close()

    app.agent(raw_topic(app, metrics_topic), name=f"{run}-trainer-metrics")(trainer_metrics)
    app.agent(raw_topic(app, eval_topic), name=f"{run}-eval-results")(eval_results)
    app.on_before_shutdown.connect(close_writer)
    return app


def serve_metrics(
    settings: KafkaSettings,
    run: str,
    logdir: Path,
    home: str | Path | None = None,
    log_level: str = "INFO",
    *,
    codec: EventCodec | None = None,
    metrics_topic: str = TRAINER_METRICS,
    eval_topic: str = EVAL_RESULTS,
) -> int:
    """Write run `run`'s metrics into `logdir` until SIGINT/SIGTERM; the worker's exit status.

    faust's own files go under the state directory `home`; `codec` defaults to one with the
    claim-check store there.
    """
    codec = codec if codec is not None else EventCodec(claim_store(None, home))
    app_id = metrics_app_id(run)
    writer = MetricsWriter(run, logdir)
    app = metrics_app(
        settings, codec, run, logdir, state_dir(home) / "faust" / app_id,
        metrics_topic=metrics_topic, eval_topic=eval_topic, writer=writer,
    )  # fmt: skip
    log.info("writing the metrics of run %s to %s", run, logdir)
    try:
        return run_worker(app, log_level)
    finally:
        writer.close()  # what is queued still gets out
