"""The trainer service: `trajectories` in, versioned weights and `WeightsPublished` out.

Inputs: `TrajectoryFinished` (consumer group, read_committed). Outputs: each step's weights in
the weight store (safetensors + manifest, the manifest last), then, in ONE Kafka transaction,
the step's `WeightsPublished` and `TrainerStepFinished` events and the commit points of every
trajectory the step trained or set aside. A trajectory is therefore trained into exactly one
announced version, even across crashes:
- dead before the weights were written: nothing happened, the batch is consumed again;
- dead after writing version v but before the commit: v was never announced; on restart the
  trainer deletes it (a store version newer than the last announced one is an orphan) and
  trains v again from the same uncommitted trajectories.
On restart the policy is the last announced version (verified against its checksum) and
consumption resumes at the committed commit points. The optimiser state starts afresh.

Between steps, trajectories set aside (flat, small or stale groups) are committed at once with
a `TrajectoriesDropped` event, so rollout producers get their staleness capacity back without
waiting for a step that may never come; when no step comes for a while, the trainer says why
(`stall.py`) in its log and in its heartbeat on `service.status`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import msgspec

from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.intake import OutOfOrderIntake, static_member
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.io.tail import read_to_end
from asearcher.streams.service.heartbeat import Heartbeat
from asearcher.streams.service.lifecycle import stop_on_signals
from asearcher.streams.service.log import get_logger
from asearcher.streams.service.memory import release_freed_memory
from asearcher.streams.storage.state_dicts import fit_state_dict
from asearcher.streams.storage.weight_reader import (
    MODEL_FILE,
    PublishedVersion,
    VersionChain,
    WeightStoreError,
    load_state_dict,
)
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import (
    Event,
    TrainerStepFinished,
    TrajectoriesDropped,
    TrajectoryFinished,
    WeightsPublished,
)
from asearcher.streams.wire.records import Outgoing, Record
from asearcher.trainer.policy.batching import Group, GroupCollector, staleness
from asearcher.trainer.policy.step import StepResult, timed_step, train_on_batch
from asearcher.trainer.runtime.collectives import broadcast, leave_world, rank_and_world
from asearcher.trainer.runtime.config import TrainerConfig, step_fingerprint
from asearcher.trainer.runtime.stall import WaitTracker, why_waiting
from asearcher.trainer.runtime.validation import reason_to_refuse
from asearcher.trainer.runtime.weight_publisher import WeightStore

log = get_logger(__name__)
POLL_RECORDS = 500
# A step (and a large model's upload) holds the polling thread for minutes: allow an hour.
TRAINER_CONSUMER = {"max.poll.interval.ms": 3_600_000}


def last_announced(
    settings: KafkaSettings, codec: EventCodec, topic: str, model: str, store: WeightStore
) -> PublishedVersion | None:
    """The newest version of `model` the (compacted) weights topic announces in `store`'s chain.

    Announcements outside the chain are logged and ignored; tombstones are dead-lettered by the
    decoder. An unreadable topic raises: "nothing announced" is not evidence of anything.
    """
    chain = VersionChain(store, model)
    for record in read_to_end(settings, codec, topic):
        event = record.event
        if not isinstance(event, WeightsPublished) or event.model != model:
            continue
        try:
            chain.admit(event.version, event.uri, event.sha256, event.step)
        except WeightStoreError as exc:
            log.warning("ignoring %s at %s: %s", event.summary(), record.origin, exc)
    return chain.newest


class TrainerService:
    """Trains the policy on finished trajectories, one version per batch of groups."""

    def __init__(
        self,
        settings: KafkaSettings,
        codec: EventCodec,
        config: TrainerConfig,
        model_dir: Path,
        store: WeightStore,
        **consumer_config: Any,
    ) -> None:
        from asearcher.trainer.runtime.deepspeed_setup import ensure_distributed

        ensure_distributed()  # the other ranks wait for this rank's broadcasts below
        self.config, self.model_dir, self.store = config, model_dir, store
        # Read once: every published version carries the same model config.
        self._model_config = json.loads((model_dir / "config.json").read_text())
        topics = config.topics
        # Fence a predecessor first (its open transaction is aborted): only then is the last
        # announced version final, and a newer version in the store surely an orphan.
        self.intake = OutOfOrderIntake(
            settings, codec, config.group_id, topics.trajectories,
            OutOfOrderIntake.transactional_id("trainer", config.instance),
            validate=self._refuse,
            keeps_records=True,  # the only member: a copy fetched again is ignored by its id
            **{**TRAINER_CONSUMER, **static_member("trainer", config.instance), **consumer_config},
        )  # fmt: skip
        announced = self._resume_point(last_announced(
            settings, codec, topics.weights, config.model, store
        ))  # fmt: skip
        self.version = announced.version if announced is not None else 0
        self._drop_orphans()
        broadcast(announced)  # the other ranks start from the same version
        self.engine = build_engine(model_dir, announced, config, store.storage_options)
        self.skipped_steps = 0  # steps whose loss or gradient was not finite
        self.collector = GroupCollector(config.batching)
        # Counters at the last step or drop report: events carry the drops since then.
        self._counted = msgspec.structs.replace(self.collector.counters)
        self.steps: list[TrainerStepFinished] = []
        self._fingerprint = step_fingerprint(config)
        self._records: dict[str, Record] = {}  # trajectory id -> its record, until committed
        self._duplicates: list[Record] = []
        self._largest_group = 1  # trajectories per group, the most seen: sizes what is polled
        self._stop_requested = False
        self._idle_s = 0.0
        self._since_step = time.monotonic()
        self.wait = WaitTracker(stall_after_s=config.stall_after_s)
        self.heartbeat = Heartbeat(
            EventProducer(settings, codec), "trainer", config.instance,
            topic=topics.status, every_s=config.status_every_s,
        )  # fmt: skip
        self._last_log = time.monotonic()

    def _refuse(self, event: Event) -> str | None:
        """Why `event` must be dead-lettered instead of trained (then its group goes on
        without it), or None."""
        reason = reason_to_refuse(event, int(self._model_config["vocab_size"]), self.version)
        if reason is not None and isinstance(event, TrajectoryFinished):
            log.warning("set aside %s: %s", event.trajectory_id[:12], reason)
            self.collector.refuse(event)
        return reason

    def _resume_point(self, on_topic: PublishedVersion | None) -> PublishedVersion | None:
        """The newest announced version by the topic or by the store's marks, every stored
        version up to it marked (stores from before the marks, or a crash before marking)."""
        marked = self.store.announced()
        newest = on_topic
        if marked and (on_topic is None or marked[-1] > on_topic.version):
            newest = self.store.get(marked[-1])
            log.warning(
                "the weights topic announces %s, the store marks v%d as announced (the topic was "
                "wiped, compacted after a tombstone or re-created): resuming at v%d",
                "nothing" if on_topic is None else f"up to v{on_topic.version}",
                newest.version, newest.version,
            )  # fmt: skip
        if newest is not None:
            for version in self.store.versions():
                if version <= newest.version and version not in marked:
                    self.store.mark_announced(version)  # announced, or before one that was
        return newest

    def _drop_orphans(self) -> None:
        """Delete the version a step that crashed before its commit left, and nothing else."""
        newer = [v for v in self.store.versions() if v > self.version]
        if newer == [self.version + 1]:
            log.warning("removing v%d: written but never announced", newer[0])
            self.store.remove(newer)
        elif newer:
            # Not what a crashed step leaves (one version, the next): deleting them would act
            # on the absence of evidence, keeping them would collide with the versions to come.
            raise RuntimeError(
                f"the weight store {self.store.root_url} holds versions {newer} after v"
                f"{self.version}, the last announced one, that no step of this trainer left: "
                f"move them away or point the trainer at another store"
            )

    def stop(self) -> None:
        """Finish the current step (if any), then return from `run` (thread-safe)."""
        self._stop_requested = True

    def run(self, *, max_steps: int | None = None, timeout: float | None = None) -> int:
        """Train until SIGINT/SIGTERM, `max_steps` steps, or `timeout` seconds; returns the steps
        taken (versions published; skipped steps do not count)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        taken = 0
        with stop_on_signals(self.stop):
            while not self._stop_requested and (max_steps is None or taken < max_steps):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                batch = self._next_batch()
                if batch is None:
                    self._commit_drops()
                    self._report_wait()
                    continue
                if self._train(batch):
                    taken += 1
                self._beat(force=True)
        self._beat(state="stopped", force=True)
        return taken

    def _report_wait(self) -> None:
        """Log and publish why no step comes, once the wait is long enough to matter."""
        self.wait.flat_rewards.update(self.collector.flat_rewards)
        self.collector.flat_rewards.clear()
        reason = ""
        if self.wait.stalled():
            reason = why_waiting(self.wait.snapshot(
                self.version, self.collector.counters, len(self._records),
                self.collector.filling_groups, self.collector.ready_groups,
                self.config.batching.groups_per_batch,
            ))  # fmt: skip
        if time.monotonic() - self._last_log >= self.config.log_every_s:
            self._last_log = time.monotonic()
            if reason:
                log.warning("%s", reason)
            else:
                log.info("v%d waiting: %d trajectories held", self.version, len(self._records))
        self._beat(state="waiting" if reason else "running", waiting_for=reason)

    def _beat(self, state: str = "running", waiting_for: str = "", force: bool = False) -> None:
        counters = self.collector.counters
        last = self.steps[-1] if self.steps else None
        self.heartbeat.beat(
            state=state, waiting_for=waiting_for, version=self.version, force=force,
            counters={
                "steps": len(self.steps), "held": len(self._records),
                "fetching_paused": int(self.intake.paused),
                "ready_groups": self.collector.ready_groups,
                "filling_groups": self.collector.filling_groups,
                "dropped_flat_groups": counters.dropped_flat_groups,
                "dropped_small_groups": counters.dropped_small_groups,
                "dropped_stale": counters.dropped_stale_samples,
                "skipped_steps": self.skipped_steps,
                "reward_mean": last.stats.reward_mean if last else 0.0,
                "tokens_per_s": last.stats.tokens_per_s if last else 0.0,
                "idle_fraction": last.idle_fraction if last else 0.0,
            },
        )  # fmt: skip

    def _next_batch(self) -> list[Group] | None:
        records = self.intake.poll(self._hold_back())
        if not records:
            started = time.monotonic()
            time.sleep(0.05)
            self._idle_s += time.monotonic() - started
        for record in records:
            self._add(record)
        self.wait.arrived += len(records)
        return self.collector.take_batch(self.version)

    def _hold_back(self) -> int:
        """Stop fetching while enough usable groups wait for steps, resume below that; the
        records to take now (the groups missing, at the largest group size seen).

        Only complete, usable groups count: they alone make steps, so holding back on them
        cannot starve a step, while a trainer behind a backlog holds a few batches, not the
        backlog (the soak measured its memory growing with it).
        """
        room = self.config.batching.hold_groups - self.collector.ready_groups
        self.intake.set_paused(room <= 0)
        return min(POLL_RECORDS, max(room, 1) * self._largest_group)

    def _commit_drops(self, force: bool = False) -> None:
        """Commit what was set aside since the last step, with a `TrajectoriesDropped`."""
        counters = self.collector.counters
        if counters == self._counted and not self._duplicates and not force:
            return
        pending = self.collector.pending_trajectory_ids()
        dropped = [r for tid, r in self._records.items() if tid not in pending]
        last, self._counted = self._counted, msgspec.structs.replace(counters)
        event = TrajectoriesDropped(
            model=self.config.model, version=self.version,
            dropped_ids=sorted(r.event.trajectory_id for r in dropped),  # type: ignore[attr-defined]
            dropped_stale=counters.dropped_stale_samples - last.dropped_stale_samples,
            dropped_flat_groups=counters.dropped_flat_groups - last.dropped_flat_groups,
            dropped_small_groups=counters.dropped_small_groups - last.dropped_small_groups,
            duplicates=counters.duplicates_ignored - last.duplicates_ignored,
            flat_groups=self.collector.drain_flat_groups(),
        )  # fmt: skip
        outputs = [Outgoing(self.config.topics.metrics, event)] if dropped else []
        if not self.intake.commit(outputs, dropped + self._duplicates):
            raise RuntimeError("trajectories' partitions were revoked while dropping")
        for record in dropped:
            self._records.pop(record.event.trajectory_id, None)  # type: ignore[attr-defined]
        self._duplicates.clear()
        if dropped:
            log.info("%s", event.summary())

    def _add(self, record: Record) -> None:
        trajectory = record.event
        assert isinstance(trajectory, TrajectoryFinished)
        before = self.collector.counters.duplicates_ignored
        self._largest_group = max(self._largest_group, trajectory.group_size)
        self.collector.add(trajectory)
        if self.collector.counters.duplicates_ignored > before:
            self._duplicates.append(record)  # done at once: its original is trained or held
        else:
            self._records[trajectory.trajectory_id] = record

    def _train(self, batch: list[Group]) -> bool:
        """Train on `batch` and publish the version; False if the step was skipped."""
        from asearcher.trainer.runtime.deepspeed_setup import full_state_dict

        broadcast(batch)
        timed = self.config.timed_step
        if timed is not None:
            result = timed_step(batch, timed.fixed_s, timed.per_sample_s)
        else:
            result = train_on_batch(
                self.engine, batch, self.config.objective, self.config.batching.micro_batch_tokens
            )
        state = full_state_dict(self.engine)  # every rank gathers (a collective under ZeRO-3)
        # In the order trained: re-training from the log feeds the same batch the same way.
        trained = [t.trajectory_id for group in batch for t in group.trajectories]
        if result.skipped:
            self._skip(trained)
            return False
        _refuse_non_finite(state, self.version + 1)
        published = self._publish(state, trained)
        if self.config.pause_before_commit_s:
            time.sleep(self.config.pause_before_commit_s)
        self._commit(published, result, trained, batch)
        release_freed_memory(f"v{self.version} trained", quiet=True)  # streams/service/memory.py
        return True

    def _skip(self, trained: list[str]) -> None:
        """Set a skipped step's trajectories aside: training on them again would fail again."""
        self.skipped_steps += 1
        log.warning(
            "v%d: step skipped, a loss or gradient was not finite (%d skipped so far); its %d "
            "trajectories are dropped", self.version, self.skipped_steps, len(trained),
        )  # fmt: skip
        self._commit_drops(force=True)

    def _publish(self, state: dict[str, Any], trained: list[str]) -> PublishedVersion:
        return self.store.publish_state_dict(
            self.version + 1, step=self.version + 1, parent_version=self.version,
            state_dict=state, config=self._model_config,
            tokenizer_dir=self.model_dir, trained_ids=trained, model=self.config.model,
        )  # fmt: skip

    def _commit(
        self, published: PublishedVersion, result: StepResult, trained: list[str],
        batch: list[Group],
    ) -> None:  # fmt: skip
        pending = self.collector.pending_trajectory_ids()
        done = [r for tid, r in self._records.items() if tid not in pending]
        dropped = sorted({tid for tid in self._records if tid not in pending} - set(trained))
        step = self._step_event(published, result, trained, dropped, batch)
        topics = self.config.topics
        announcement = WeightsPublished(
            model=self.config.model, version=published.version, uri=published.uri,
            sha256=published.sha256, step=published.version,
            metrics={"reward_mean": result.stats.reward_mean, "loss": result.stats.loss},
        )  # fmt: skip
        outputs = [Outgoing(topics.weights, announcement), Outgoing(topics.metrics, step)]
        if not self.intake.commit(outputs, done + self._duplicates):
            # Another member owns some of these trajectories now: this step must not count.
            raise RuntimeError("trajectories' partitions were revoked during the step")
        self.store.mark_announced(published.version)  # only now: the announcement is durable
        for record in done:
            self._records.pop(record.event.trajectory_id, None)  # type: ignore[attr-defined]
        self._duplicates.clear()
        self.version = published.version
        self.steps.append(step)
        self.wait.stepped(self.collector.counters)
        self.collector.flat_rewards.clear()  # they were counted before this step
        log.info("%s", step.summary())
        self.store.prune(self.config.keep_last, self.config.keep_every)

    def _step_event(
        self, published: PublishedVersion, result: StepResult, trained: list[str],
        dropped: list[str], batch: list[Group],
    ) -> TrainerStepFinished:  # fmt: skip
        import torch

        counters, last = self.collector.counters, self._counted
        self._counted = msgspec.structs.replace(counters)
        elapsed = max(time.monotonic() - self._since_step, 1e-9)
        idle, self._idle_s, self._since_step = self._idle_s, 0.0, time.monotonic()
        version = published.version
        return TrainerStepFinished(
            model=self.config.model, version=version, step=version,
            groups=len(batch), staleness_counts=_staleness_counts(batch, self.version),
            stats=result.stats,
            late_samples=counters.late_samples_kept - last.late_samples_kept,
            dropped_stale=counters.dropped_stale_samples - last.dropped_stale_samples,
            dropped_flat_groups=counters.dropped_flat_groups - last.dropped_flat_groups,
            dropped_small_groups=counters.dropped_small_groups - last.dropped_small_groups,
            duplicates=counters.duplicates_ignored - last.duplicates_ignored,
            dropped_ids=dropped, trained_ids=trained,
            flat_groups=self.collector.drain_flat_groups(),
            idle_fraction=min(1.0, idle / elapsed),
            parent_version=self.version, optimizer_step=len(self.steps) + 1,
            threads=torch.get_num_threads(), ranks=rank_and_world()[1],
            weights_sha256=published.manifest.files[MODEL_FILE],
            settings_sha256=self._fingerprint,
        )  # fmt: skip

    def close(self) -> None:
        """Leave the group (every committed step is durable) and release the other ranks."""
        self.intake.close()
        self.heartbeat.producer.close()
        broadcast(None)
        leave_world()


def _refuse_non_finite(state: dict[str, Any], version: int) -> None:
    """Raise rather than publish `version` with NaN or infinite weights."""
    import torch

    bad = [name for name, tensor in state.items() if not bool(torch.isfinite(tensor).all())]
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise RuntimeError(
            f"v{version} not published: its weights are not finite ({shown}); the last "
            f"announced version stays v{version - 1}"
        )


def _staleness_counts(batch: list[Group], trainer_version: int) -> list[int]:
    """counts[k]: samples of `batch` whose oldest generated token is k versions old."""
    ages = [staleness(t, trainer_version) for group in batch for t in group.trajectories]
    counts = [0] * (max(ages, default=-1) + 1)
    for age in ages:
        counts[max(age, 0)] += 1
    return counts


def build_engine(
    model_dir: Path,
    announced: PublishedVersion | None,
    config: TrainerConfig,
    storage_options: dict[str, Any] | None,
) -> Any:
    """The DeepSpeed engine over the policy, at the announced version if there is one."""
    import torch
    from transformers import AutoModelForCausalLM

    from asearcher.trainer.runtime.deepspeed_setup import deepspeed_config, initialize

    torch.manual_seed(config.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if announced is not None:
        _, state = load_state_dict(announced.uri, announced.sha256, storage_options)
        model.load_state_dict(fit_state_dict(model, state))
        log.info("starting from %s v%d", config.model, announced.version)
    return initialize(model, deepspeed_config(config.deepspeed))


def serve_other_rank(config: TrainerConfig, model_dir: Path, store: WeightStore) -> int:
    """What ranks > 0 run: start from rank 0's version, then train on what it broadcasts."""
    from asearcher.trainer.runtime.deepspeed_setup import ensure_distributed
    from asearcher.trainer.runtime.distributed import follow_rank_zero  # imports DeepSpeed: lazily

    if config.timed_step is not None:
        raise ValueError("trainer timed_step runs in one trainer process only (processes = 1)")
    ensure_distributed()
    announced = broadcast(None)
    engine = build_engine(model_dir, announced, config, store.storage_options)
    return follow_rank_zero(engine, config.objective, config.batching.micro_batch_tokens)
