"""`asearcher retrain`: a run's training rebuilt from its events, under a new name.

The run's saved config gives the trainer's settings (with `--set` overrides for a counterfactual),
its topics and its store; the trainer's step events give the ledger (which trajectories, in which
order, from which version, with a fresh optimiser or not); the trajectories topic gives the data.
The new run gets its own store, its own saved config and its own announcements, so `ask --run` and
`eval run --run` reach it, and the original run is never written to.
"""

from __future__ import annotations

import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from asearcher.cli.errors import CliError, as_cli_error
from asearcher.streams.wire.events import new_id

if TYPE_CHECKING:
    from asearcher.cli.run.config import Paths, RunConfig
    from asearcher.streams.storage.weight_reader import PublishedVersion
    from asearcher.streams.wire.events import TrainerStepFinished, TrajectoryFinished
    from asearcher.trainer.policy.step import StepResult
    from asearcher.trainer.runtime.config import TrainerConfig
    from asearcher.trainer.runtime.retrain import Retrainer
    from asearcher.trainer.runtime.weight_publisher import WeightStore

# Settings a counterfactual may change: the trainer's own (the data is the log's).
SETTABLE = "trainer.config."


@dataclass
class VersionCheck:
    """One rebuilt version beside the original."""

    version: int
    trajectories: int
    loss: float
    original_sha256: str
    rebuilt_sha256: str

    @property
    def same(self) -> bool:
        return self.original_sha256 == self.rebuilt_sha256


@dataclass
class RetrainReport:
    """What `retrain` rebuilt, and where it first differed from the original (with --verify)."""

    run: str
    new: str
    start_version: int
    store: str
    versions: list[VersionCheck] = field(default_factory=list)
    difference: str = ""  # with --verify: the first version that differs and by how much


@dataclass
class RetrainRequest:
    """What the user asked for."""

    run: str
    new: str
    until: int | None = None
    verify: bool = False
    settings: list[str] = field(default_factory=list)  # "trainer.config.FIELD=VALUE"
    trajectories_topic: str | None = None  # default: the run's trajectories topic


def counterfactual_config(original: RunConfig, new: str, settings: list[str]) -> RunConfig:
    """The original run config renamed `new`, with its own store and the `settings` applied."""
    from asearcher.cli.run.config import RunConfig

    raw = msgspec.to_builtins(msgspec.structs.replace(original, name=new, store=None))
    for setting in settings:
        path, value = _parse_setting(setting)
        table = raw
        *parents, leaf = path.split(".")
        for part in parents:
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise CliError(f"--set {setting}: {part} is not a table")
        table[leaf] = value
    try:
        return msgspec.convert(raw, RunConfig)
    except (msgspec.ValidationError, ValueError) as exc:
        raise CliError(f"--set: {exc}") from exc


def _parse_setting(setting: str) -> tuple[str, Any]:
    """`trainer.config.FIELD=VALUE`, VALUE read as TOML (a bare word as a string)."""
    path, sep, text = setting.partition("=")
    path = path.strip()
    if not sep or not path.startswith(SETTABLE) or path == SETTABLE:
        raise CliError(f"--set {setting!r}: expected {SETTABLE}FIELD=VALUE")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    return path, value


@dataclass
class RetrainPlan:
    """Both runs' trainer settings and stores, checked before anything is read or written."""

    request: RetrainRequest
    new_config: RunConfig
    old: TrainerConfig
    new: TrainerConfig
    new_where: Paths


def plan(home: Path, request: RetrainRequest) -> RetrainPlan:
    """Check what the user asked for against the saved run config: one-line errors, no broker."""
    from asearcher.cli.run.config import paths, resolve, saved_run_config
    from asearcher.trainer.runtime.weight_publisher import WeightStore

    if request.verify and request.settings:
        raise CliError("--verify compares with the run's own settings: drop --set")
    if request.new == request.run:
        raise CliError("--as must name a new run, not the one re-trained")
    with as_cli_error(ValueError):
        original = saved_run_config(home, request.run)
        new_config = counterfactual_config(original, request.new, request.settings)
        old = resolve(original, paths(original, home)).trainer
        new_where = paths(new_config, home)
        new = resolve(new_config, new_where).trainer
    if old.timed_step is not None:
        raise CliError(f"run {request.run!r} only timed its steps (trainer.config.timed_step)")
    if WeightStore(new_where.store).versions() or (new_where.configs / "run.json").exists():
        raise CliError(f"run {request.new!r} already exists under {home}: choose another name")
    return RetrainPlan(request, new_config, old, new, new_where)


def retrain(
    connection: Any, plan: RetrainPlan,
    on_step: Callable[[int, int, VersionCheck], None] = lambda done, total, check: None,
) -> RetrainReport:  # fmt: skip
    """Rebuild the planned run's versions from its log as the new run."""
    from asearcher.cli.run.config import write_run_config
    from asearcher.streams.io.replay import ReadError
    from asearcher.trainer.runtime.config import step_fingerprint
    from asearcher.trainer.runtime.retrain import Retrainer, RetrainError, check_replayable
    from asearcher.trainer.runtime.retrain_ranks import process_group
    from asearcher.trainer.runtime.weight_publisher import WeightStore

    request, old, new = plan.request, plan.old, plan.new
    with as_cli_error(ReadError):
        steps = _ledger(connection, old.topics.metrics, request.run, request.until)
        topic = request.trajectories_topic or old.topics.trajectories
        wanted = {tid for step in steps for tid in step.trained_ids}
        trajectories = _trajectories(connection, topic, wanted)
    with as_cli_error(RetrainError):
        ranks = check_replayable(steps, step_fingerprint(old) if request.verify else None)
        # Every batch found before the new run is made: a failure must not take its name.
        batches = [_batch(step, trajectories) for step in steps]
    old_store, new_store = WeightStore(old.store or ""), WeightStore(plan.new_where.store)
    write_run_config(plan.new_config, plan.new_where)
    report = RetrainReport(
        run=request.run, new=request.new, start_version=steps[0].parent_version,
        store=new_store.root_url,
    )  # fmt: skip
    model_dir = Path(new.model_dir or "")
    with (
        process_group(ranks, new, model_dir, plan.new_where.configs),
        _Announcer(connection, new.topics, request.new) as announcer,
    ):
        start = _copy_start(old_store, new_store, report.start_version, announcer)
        retrainer = Retrainer(new, model_dir, new_store, start)
        fingerprint = step_fingerprint(new)
        for number, (step, batch) in enumerate(zip(steps, batches, strict=True), 1):
            check = _rebuild(retrainer, step, batch, announcer, fingerprint)
            report.versions.append(check)
            on_step(number, len(steps), check)
            if request.verify and not check.same:
                report.difference = _difference(old_store, new_store, step.version)
                break
        # Only here: after an error the other ranks may be inside a collective, and leaving
        # the process group kills them instead.
        retrainer.close()
    return report


def _rebuild(
    retrainer: Retrainer, step: TrainerStepFinished, batch: list, announcer: _Announcer,
    fingerprint: str,
) -> VersionCheck:  # fmt: skip
    """One step re-trained, published and announced under the new run."""
    from asearcher.trainer.runtime.retrain import RetrainError

    with as_cli_error(RetrainError):
        published, result = retrainer.step(step, batch)
    announcer.step(step, published, result, fingerprint)
    retrainer.store.mark_announced(published.version)  # its announcement was delivered
    return VersionCheck(step.version, len(step.trained_ids), result.stats.loss,
                        step.weights_sha256, _model_sha(published))  # fmt: skip


def _ledger(connection: Any, topic: str, run: str, until: int | None) -> list[TrainerStepFinished]:
    """The run's steps in version order, up to `until`."""
    from asearcher.consumers.observability.run_ledger import topic_events
    from asearcher.streams.wire.events import TrainerStepFinished

    steps: dict[int, TrainerStepFinished] = {}
    for event in topic_events(connection.settings, connection.codec, topic):
        if isinstance(event, TrainerStepFinished) and event.model == run:
            steps.setdefault(event.version, event)
    ordered = [steps[v] for v in sorted(steps) if until is None or v <= until]
    if not ordered:
        upto = f" up to v{until}" if until is not None else ""
        raise CliError(f"run {run!r} has no trainer steps{upto} on {topic}")
    return ordered


def _trajectories(connection: Any, topic: str, wanted: set[str]) -> dict[str, TrajectoryFinished]:
    """The first copy of each wanted trajectory on `topic` (redeliveries are the same event)."""
    from asearcher.consumers.observability.run_ledger import topic_events
    from asearcher.streams.wire.events import TrajectoryFinished

    found: dict[str, TrajectoryFinished] = {}
    for event in topic_events(connection.settings, connection.codec, topic):
        if isinstance(event, TrajectoryFinished) and event.trajectory_id in wanted:
            found.setdefault(event.trajectory_id, event)
    return found


def _batch(step: TrainerStepFinished, trajectories: dict[str, TrajectoryFinished]) -> list:
    from asearcher.trainer.runtime.retrain import batch_of

    return batch_of(step, trajectories)


def _model_sha(version: PublishedVersion) -> str:
    from asearcher.trainer.runtime.retrain import model_sha256

    return model_sha256(version)


def _copy_start(
    old: WeightStore, new: WeightStore, version: int, announcer: _Announcer
) -> PublishedVersion | None:
    """The version the run's training started from, copied into the new store (None: v0, the
    initial policy, which both runs read from the model directory)."""
    from asearcher.streams.storage.weight_reader import WeightStoreError

    if version == 0:
        return None
    try:
        manifest = old.get(version).manifest
        files = {name: old.read_file(version, name) for name in manifest.files}
    except WeightStoreError as exc:
        raise CliError(
            f"v{version}, where the run's training started, is not in its store {old.root_url}: "
            f"{exc}"
        ) from exc
    published = new.publish(
        version, manifest.step, manifest.parent_version, files, config=manifest.config,
        tokenizer_files=manifest.tokenizer_files, trained_ids=manifest.trained_ids,
        model=announcer.model, recipe=manifest.recipe,
    )  # fmt: skip
    announcer.weights(published)
    announcer.producer.flush()
    new.mark_announced(version)
    return published


def _difference(old: WeightStore, new: WeightStore, version: int) -> str:
    """The first differing version and its largest weight difference (if the original's
    weights are still in its store; the log keeps only their checksum)."""
    from asearcher.streams.storage.weight_reader import WeightStoreError, load_state_dict

    try:
        original = old.get(version)
    except WeightStoreError:
        return (
            f"v{version} differs from the original (its checksum); the original weights are no "
            f"longer in {old.root_url}, so the size of the difference is unknown"
        )
    _, a = load_state_dict(original.uri, original.sha256, old.storage_options)
    _, b = load_state_dict(new.uri_of(version), new.get(version).sha256, new.storage_options)
    name, largest = max(
        ((key, float((a[key].float() - b[key].float()).abs().max())) for key in a if key in b),
        key=lambda item: item[1], default=("-", 0.0),
    )  # fmt: skip
    return f"v{version} differs from the original: largest difference {largest:.3g} in {name}"


class _Announcer:
    """Announces the new run's versions and steps under its own name."""

    def __init__(self, connection: Any, topics: Any, model: str) -> None:
        from asearcher.streams.io.producer import EventProducer

        self.topics, self.model = topics, model
        self.producer = EventProducer(connection.settings, connection.codec)

    def __enter__(self) -> _Announcer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.producer.close()

    def weights(self, published: PublishedVersion, metrics: dict[str, float] | None = None) -> None:
        from asearcher.streams.wire.events import WeightsPublished

        self.producer.send(self.topics.weights, WeightsPublished(
            model=self.model, version=published.version, uri=published.uri,
            sha256=published.sha256, step=published.version, metrics=metrics or {},
        ))  # fmt: skip

    def step(self, step: TrainerStepFinished, published: PublishedVersion, result: StepResult,
             fingerprint: str) -> None:  # fmt: skip
        """The rebuilt step's event (its ledger the original's) and its version's announcement,
        delivered before the next step starts."""
        self.producer.send(self.topics.metrics, msgspec.structs.replace(
            step, model=self.model, event_id=new_id(), created_at=time.time(),
            stats=result.stats,
            # Nothing was set aside here: the original's drops stay the original's.
            dropped_ids=[], dropped_stale=0, dropped_flat_groups=0, dropped_small_groups=0,
            flat_groups=[], duplicates=0, idle_fraction=0.0,
            weights_sha256=_model_sha(published), settings_sha256=fingerprint,
        ))  # fmt: skip
        stats = result.stats
        self.weights(published, {"reward_mean": stats.reward_mean, "loss": stats.loss})
        self.producer.flush()
