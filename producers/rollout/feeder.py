"""The request feeder: a QA file in, `RolloutRequested` events out, epoch after epoch.

Inputs: a QA file (any layout of `consumers/formats/qa_files.py`); the keys of `trajectories` (a
group's id) and `dead.letters`, followed from the beginning (read_committed) to count the groups
that are done; its own position on the compacted `feeder.progress` topic.
Outputs: `RolloutRequested` on `rollout.requests`, each batch in ONE transaction with the
`FeederProgress` that holds the position after it, so a restart continues exactly where the last
committed batch ended: no request is published twice and none is skipped. Restarting under the
same instance fences a dead predecessor and aborts its open batch. A `ServiceStatus` heartbeat
goes to `service.status`.
Epoch e feeds every question once, in an order shuffled by (seed, e); position i of epoch e is
group `<run>-e<e>-<i:06d>`. At most `outstanding` requests are published and not yet finished
(their trajectories committed, or the request dead-lettered by a rollout producer). With
`revisit_flat_every` above 1 it also follows the trainer's metrics and passes over, for that many
epochs, a question whose newest group the trainer dropped as flat (`flat_questions.py`); the
positions passed over are counted in the progress record, so a restart's count stays exact.
With `flat_kind_share` above 0 it passes over, the same way, most questions of a kind (a
question's `kind`, e.g. a world question's template) whose groups were mostly flat
(`flat_kinds.py`): that acts within the first epoch, where a question's own history cannot.
With `plays_by_hops` an epoch plays a question as often as its hops ask (`plays.py`): its
positions are those of the questions repeated, shuffled together.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from asearcher.consumers.formats.qa_files import QaQuestion, read_qa_file
from asearcher.producers.agents.agent import check_sampling
from asearcher.producers.rollout.flat_kinds import FlatKinds
from asearcher.producers.rollout.flat_questions import (
    FlatQuestions,
    epoch_order,
    group_id_pattern,
)
from asearcher.producers.rollout.plays import check_plays, epoch_slots
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.io.tail import KeyTail, TopicTail, read_to_end
from asearcher.streams.service.config_file import load_config
from asearcher.streams.service.heartbeat import Heartbeat
from asearcher.streams.service.lifecycle import stop_on_signals
from asearcher.streams.service.log import get_logger
from asearcher.streams.service.memory import release_freed_memory
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import (
    DeadLetter,
    FeederProgress,
    Purpose,
    RolloutRequested,
    SamplingSettings,
    TrainerStepFinished,
    TrajectoriesDropped,
    TrajectoryFinished,
)
from asearcher.streams.wire.records import Record
from asearcher.streams.wire.topics import (
    DEAD_LETTERS,
    FEEDER_PROGRESS,
    ROLLOUT_REQUESTS,
    SERVICE_STATUS,
    TRAINER_METRICS,
    TRAJECTORIES,
)

log = get_logger(__name__)
BATCH = 8  # requests per transaction at most
TICK_S = 0.2  # longest wait between looks at the tails while nothing else wakes the loop
PROGRESS_READ_S = 60.0  # how long reading the progress topic to its end may take


class FeederTopics(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Topic names, overridable for tests and side-by-side deployments."""

    requests: Annotated[str, Meta(description="where the requests go")] = ROLLOUT_REQUESTS
    trajectories: Annotated[
        str, Meta(description="finished groups, counted to bound outstanding requests")
    ] = TRAJECTORIES
    dead_letters: Annotated[
        str, Meta(description="requests the producers set aside count as finished")
    ] = DEAD_LETTERS
    progress: Annotated[
        str, Meta(description="the feeder's committed position, one record per run")
    ] = FEEDER_PROGRESS
    status: Annotated[str, Meta(description="heartbeats")] = SERVICE_STATUS
    trainer_metrics: Annotated[
        str, Meta(description="the trainer's steps and drops: which groups were flat")
    ] = TRAINER_METRICS


class FeederConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything `asearcher feed serve` can be told, with defaults."""

    qa: Annotated[
        str, Meta(description="the QA file (JSON lines: id, question, answers); required")
    ] = ""
    run: Annotated[
        str, Meta(description="run name: prefixes group ids and keys the progress record")
    ] = "default"
    epochs: Annotated[int, Meta(description="passes over the QA file (0: forever)")] = 1
    seed: Annotated[
        int, Meta(description="shuffles each epoch's order (epoch e is shuffled by seed and e)")
    ] = 0
    group_size: Annotated[int, Meta(description="trajectories per request (the GRPO group)")] = 4
    revisit_flat_every: Annotated[
        int,
        Meta(
            description=(
                "a question whose newest group the trainer dropped as flat (every reward equal: "
                "no signal) is requested again only this many epochs later; 1: every epoch"
            )
        ),
    ] = 1
    flat_kind_share: Annotated[
        float,
        Meta(
            description=(
                "questions of a kind (a world question's template: what it asks, of what) are "
                "passed over, all but every `flat_kind_probe_every`-th, once at least this share "
                "of the kind's finished groups were flat (from 4 groups on); 0: off"
            )
        ),
    ] = 0.0
    flat_kind_probe_every: Annotated[
        int,
        Meta(description="of a kind passed over, every this-many-th question is still requested"),
    ] = 3
    plays_by_hops: Annotated[
        list[int],
        Meta(
            description=(
                "plays an epoch for a question of 1, 2, ... hops (the last entry for longer "
                "ones; the QA file's `hops`): [1, 2] asks a 2-hop question twice an epoch; "
                "empty: every question once"
            )
        ),
    ] = []
    outstanding: Annotated[
        int, Meta(description="requests published and not yet finished, at most")
    ] = 16
    purpose: Annotated[Purpose, Meta(description="what the trajectories are for")] = "train"
    sampling: SamplingSettings = msgspec.field(default_factory=SamplingSettings)
    instance: Annotated[
        str, Meta(description="stable transactional id suffix: a restart fences its predecessor")
    ] = "feeder"
    log_every_s: Annotated[float, Meta(description="period of the progress log line")] = 10.0
    status_every_s: Annotated[
        float, Meta(description="period of the heartbeat on the status topic")
    ] = 5.0
    pause_before_commit_s: Annotated[
        float,
        Meta(
            description=(
                "Fault injection for tests: sleep with each batch sent but not yet committed."
            )
        ),
    ] = 0.0
    topics: FeederTopics = msgspec.field(default_factory=FeederTopics)

    def __post_init__(self) -> None:
        if not self.run:
            raise ValueError("run must not be empty")
        if self.epochs < 0:
            raise ValueError(f"epochs must be >= 0 (0: forever), got {self.epochs}")
        if self.outstanding < 1:
            raise ValueError(f"outstanding must be at least 1, got {self.outstanding}")
        if self.revisit_flat_every < 1:
            raise ValueError(
                f"revisit_flat_every must be at least 1 (1: every epoch), "
                f"got {self.revisit_flat_every}"
            )
        if not 0.0 <= self.flat_kind_share <= 1.0:
            raise ValueError(
                f"flat_kind_share must be within 0..1 (0: off), got {self.flat_kind_share}"
            )
        if self.flat_kind_probe_every < 1:
            raise ValueError(
                f"flat_kind_probe_every must be at least 1, got {self.flat_kind_probe_every}"
            )
        check_plays(self.plays_by_hops)
        if not all(0 < v < float("inf") for v in (self.log_every_s, self.status_every_s)):
            raise ValueError("log_every_s and status_every_s must be positive")
        # The checks a rollout producer applies, so a bad value fails here and not in every group.
        check_sampling(self.sampling, self.group_size)


def load_feeder_config(path: Path | None, **overrides: Any) -> FeederConfig:
    """The feeder config in TOML file `path` (or the defaults), with non-None `overrides`."""
    return load_config(FeederConfig, "feeder config", path, **overrides)


def load_questions(qa: str | Path) -> list[QaQuestion]:
    """Every question of QA file `qa` (any layout `read_qa_file` reads); ValueError naming
    file:line for one that is not a question."""
    if not str(qa):
        raise ValueError("no QA file given: set qa in the config or pass --qa")
    return read_qa_file(str(qa))


def last_progress(
    settings: KafkaSettings,
    codec: EventCodec,
    topic: str,
    run: str,
    dead_letters: EventProducer | None = None,
) -> FeederProgress | None:
    """The newest committed `FeederProgress` of `run` on the (compacted) progress topic.

    An unreadable topic raises: never guess "nothing fed yet", which would feed the run again.
    """
    newest = None
    records = read_to_end(
        settings, codec, topic, dead_letters=dead_letters, timeout_s=PROGRESS_READ_S
    )
    for record in records:
        # One key per run keeps a run's records in one partition, in order: last wins.
        if isinstance(record.event, FeederProgress) and record.event.run == run:
            newest = record.event
    return newest


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """A place in the feed: the epoch and the index in that epoch's shuffled order."""

    epoch: int
    index: int


class FinishedGroups:
    """The groups of one run known to be done; fed from the tail threads.

    Counts only groups before the feed's position, so a stray record for a group the feeder has
    not published (yet) cannot open a slot that is not there.
    """

    def __init__(self, run: str) -> None:
        self._pattern = group_id_pattern(run)
        self._lock = threading.Lock()
        self._seen: set[Position] = set()
        self._ahead: set[Position] = set()  # done before the feed passed them: counted later
        self._position = Position(0, 0)
        self.count = 0
        self.changed = threading.Event()  # set when a group finishes (and to wake the loop)

    def note(self, group_id: str) -> bool:
        """Record that `group_id` is done (other runs' groups and repeats are ignored); whether
        it was new."""
        match = self._pattern.fullmatch(group_id)
        if match is None:
            return False
        done = Position(int(match[1]), int(match[2]))
        with self._lock:
            if done in self._seen:
                return False
            self._seen.add(done)
            if done < self._position:
                self.count += 1
            else:
                self._ahead.add(done)
        self.changed.set()
        return True

    def advance(self, position: Position) -> None:
        """The feed has published everything before `position`."""
        with self._lock:
            self._position = position
            reached = {p for p in self._ahead if p < position}
            self._ahead -= reached
            self.count += len(reached)


@dataclass(slots=True)
class FeederStats:
    """Where a feeder stands after `run`."""

    published: int  # requests published by this call of `run`
    total_published: int  # requests the run published, across restarts
    finished: int  # of those, groups known to be done
    skipped: int  # positions passed over as flat, across restarts
    epoch: int
    next_index: int
    done: bool  # every epoch is fed

    @property
    def outstanding(self) -> int:
        return self.total_published - self.finished

    def line(self) -> str:
        """One summary line."""
        where = "all epochs fed" if self.done else f"epoch {self.epoch} at {self.next_index}"
        passed = f", {self.skipped} flat questions passed over" if self.skipped else ""
        return (
            f"published {self.published} requests ({self.total_published} in the run), "
            f"{self.finished} finished, {self.outstanding} outstanding{passed}, {where}"
        )


class FeederService:
    """Publishes the run's requests in order, never twice, with a bounded number outstanding."""

    def __init__(self, settings: KafkaSettings, codec: EventCodec, config: FeederConfig) -> None:
        self.config = config
        self.questions = load_questions(config.qa)  # before any client: bad input fails fast
        self.slots = _slots(self.questions, config)
        topics = config.topics
        self.requests = EventProducer(settings, codec, transactional_id=f"feeder-{config.instance}")
        # Fence a predecessor first (its open batch is aborted): only then is the progress final.
        self.requests.kafka.init_transactions()
        self.status = EventProducer(settings, codec)
        self.heartbeat = Heartbeat(
            self.status, "feeder", config.instance,
            topic=topics.status, every_s=config.status_every_s,
        )  # fmt: skip
        progress = last_progress(settings, codec, topics.progress, config.run, self.status)
        self.position = self._resume(progress)
        self.skipped = progress.skipped if progress else 0
        self.finished = FinishedGroups(config.run)
        self.finished.advance(self.position)
        self.flat = FlatQuestions(
            config.run, config.seed, len(self.slots), config.revisit_flat_every
        )
        self.kinds = FlatKinds(
            config.run, config.seed, [q.kind for q in self.slots], config.flat_kind_share,
            config.flat_kind_probe_every,
        )  # fmt: skip
        self.tails = [
            KeyTail(settings, topics.trajectories, self._on_trajectory, "beginning"),
            TopicTail(settings, codec, topics.dead_letters, self._on_dead_letter, self.status,
                      "beginning"),
        ]  # fmt: skip
        # Only then do flat groups change what is fed.
        if config.revisit_flat_every > 1 or self.kinds.active:
            self.tails.append(
                TopicTail(settings, codec, topics.trainer_metrics, self._on_trainer_metrics,
                          self.status, "beginning")
            )  # fmt: skip
        for tail in self.tails:
            tail.start()
        self._stop_requested = False
        self._published_now = 0  # by the current call of run
        self._announced_done = False
        self._trimmed = False  # the start-up peak handed back once the tails caught up

    def _resume(self, progress: FeederProgress | None) -> Position:
        if progress is None:
            log.info("run %s: nothing fed yet, starting at epoch 0", self.config.run)
            return Position(0, 0)
        if progress.questions != len(self.slots):
            raise ValueError(
                f"run {self.config.run!r} was fed {progress.questions} plays an epoch but "
                f"{self.config.qa} with plays_by_hops={self.config.plays_by_hops} gives "
                f"{len(self.slots)}: restore the file and setting or start a new run"
            )
        log.info("run %s resumes: %s", self.config.run, progress.summary())
        return Position(progress.epoch, progress.next_index)

    def _on_trajectory(self, key: str, kind: str | None) -> None:
        # Trajectories are keyed by group: reading keys, not values, keeps a restart that reads
        # the whole topic small and fast (bench_follow_memory.py).
        if kind in (None, TrajectoryFinished.kind()):
            if self.finished.note(key):  # a group has many records: its kind counts it once
                self.kinds.finished(key)

    def _on_dead_letter(self, record: Record) -> None:
        letter = record.event
        # A request a producer set aside will never finish: its slot is free again.
        if isinstance(letter, DeadLetter) and letter.origin_topic == self.config.topics.requests:
            if letter.key is not None:
                self.finished.note(letter.key.decode("utf-8", "replace"))

    def _on_trainer_metrics(self, record: Record) -> None:
        event = record.event
        if isinstance(event, TrainerStepFinished | TrajectoriesDropped):
            for group_id in event.flat_groups:
                self.flat.note(group_id)
                self.kinds.flat(group_id)

    @property
    def published(self) -> int:
        """Requests the run has published, across restarts."""
        return self._count_before(self.position) - self.skipped

    @property
    def outstanding(self) -> int:
        """Requests published and not yet finished."""
        return self.published - self.finished.count

    @property
    def done(self) -> bool:
        """Every epoch is fed (never, when epochs is 0)."""
        return self._is_done(self.position)

    def _count_before(self, position: Position) -> int:
        return position.epoch * len(self.slots) + position.index

    def _is_done(self, position: Position) -> bool:
        return self.config.epochs > 0 and position.epoch >= self.config.epochs

    def stop(self) -> None:
        """Return from `run` after the current batch (thread-safe)."""
        self._stop_requested = True
        self.finished.changed.set()

    def run(
        self,
        *,
        max_requests: int | None = None,
        timeout: float | None = None,
        exit_when_done: bool = False,
    ) -> FeederStats:
        """Feed until SIGINT/SIGTERM, `stop()`, `timeout` seconds or `max_requests` published.

        Once every epoch is fed it idles (heartbeats go on) rather than exit, so a supervisor
        does not restart it forever, unless `exit_when_done`.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        next_log = time.monotonic()
        self._published_now = 0
        with stop_on_signals(self.stop):
            while not self._stop_requested and not _passed(deadline):
                self.finished.changed.clear()  # before looking: a later change wakes the wait
                if self.done:
                    self._announce_done()
                    if exit_when_done:
                        break
                elif max_requests is not None and self._published_now >= max_requests:
                    break
                else:
                    self._feed(None if max_requests is None else max_requests - self._published_now)
                self._beat()
                now = time.monotonic()
                if now >= next_log:
                    self._log_progress()
                    next_log = now + self.config.log_every_s
                wake = min(next_log, deadline or next_log) - now
                self.finished.changed.wait(max(0.0, min(TICK_S, wake)))
        self._beat(stopped=True)
        return self.stats()

    def _feed(self, budget: int | None) -> None:
        """Publish one batch if the tails are caught up and there are free slots."""
        if not all(tail.caught_up.is_set() for tail in self.tails):
            return  # a restart must count what finished before it fills slots
        if not self._trimmed:
            self._trimmed = True
            release_freed_memory("caught up with trajectories and dead letters")
        room = len(self.slots) - self.position.index
        count = min(self.config.outstanding - self.outstanding, BATCH, room)
        if budget is not None:
            count = min(count, budget)
        if count > 0:
            self._publish(count)

    def _publish(self, count: int) -> None:
        """Up to `count` requests from the position on, passing over flat questions; the
        position after them (and the positions passed over) committed with them."""
        start, plays = self.position, len(self.slots)
        order = epoch_order(self.config.seed, start.epoch, plays)
        requests: list[RolloutRequested] = []
        index, skipped = start.index, self.skipped
        while len(requests) < count and index < plays:
            slot = order[index]
            if self.flat.passes_over(slot, start.epoch) or self.kinds.passes_over(slot):
                skipped += 1
            else:
                requests.append(self._request(start.epoch, index, self.slots[slot]))
            index += 1
        position = Position(start.epoch + 1, 0) if index >= plays else Position(start.epoch, index)
        progress = FeederProgress(
            run=self.config.run, epoch=position.epoch, next_index=position.index,
            published=self._count_before(position) - skipped, epochs=self.config.epochs,
            questions=plays, finished=self._is_done(position), skipped=skipped,
        )  # fmt: skip
        self._commit(requests, progress)
        if position.epoch > start.epoch and skipped:
            log.info(
                "run %s: epoch %d fed; %d positions passed over in the run so far (their "
                "question's newest group, or most of its kind's, were flat)", self.config.run,
                start.epoch, skipped,
            )  # fmt: skip
        self.position, self.skipped = position, skipped
        self.finished.advance(position)
        self._published_now += len(requests)

    def _request(self, epoch: int, index: int, item: QaQuestion) -> RolloutRequested:
        run = self.config.run
        return item.request(
            group_id=f"{run}-e{epoch}-{index:06d}", sampling=self.config.sampling,
            group_size=self.config.group_size, purpose=self.config.purpose,
            metadata={"run": run, "epoch": str(epoch)},
        )  # fmt: skip

    def _commit(self, requests: list[RolloutRequested], progress: FeederProgress) -> None:
        """Send the batch and the position after it in one transaction."""
        topics = self.config.topics
        with self.requests.transaction():
            for request in requests:
                self.requests.send(topics.requests, request)
            self.requests.send(topics.progress, progress)
            if self.config.pause_before_commit_s > 0:
                self.requests.kafka.flush()  # on the broker, uncommitted, while a test kills us
                time.sleep(self.config.pause_before_commit_s)

    def _announce_done(self) -> None:
        if not self._announced_done:
            self._announced_done = True
            log.info("run %s: all %d epochs fed", self.config.run, self.config.epochs)

    def _state(self) -> tuple[str, str]:
        """The heartbeat's state and, when waiting, why."""
        if self.done:
            return "waiting", f"all {self.config.epochs} epochs fed"
        if not all(tail.caught_up.is_set() for tail in self.tails):
            return "waiting", (
                "reading trajectories and dead letters to count finished groups"
                + (", and the trainer's metrics for flat groups" if len(self.tails) > 2 else "")
            )
        outstanding, limit = self.outstanding, self.config.outstanding
        if outstanding >= limit:
            return "waiting", (
                f"{outstanding} requests outstanding (limit {limit}): "
                "waiting for rollout producers to finish groups"
            )
        return "running", ""

    def _beat(self, *, stopped: bool = False) -> None:
        """A heartbeat if one is due; always the last one, when `stopped`."""
        state, waiting_for = ("stopped", "") if stopped else self._state()
        self.heartbeat.beat(
            state=state, waiting_for=waiting_for, force=stopped,
            counters={
                "published": self.published, "finished": self.finished.count,
                "outstanding": self.outstanding, "epoch": self.position.epoch,
                "passed_over_flat": self.skipped,
            },
        )  # fmt: skip

    def _log_progress(self) -> None:
        position, epochs = self.position, self.config.epochs or "unlimited"
        where = (
            f"all {epochs} epochs fed"
            if self.done
            else f"epoch {position.epoch} (of {epochs}) at {position.index}/{len(self.slots)}"
        )
        log.info(
            "run %s %s: published=%d finished=%d outstanding=%d passed_over=%d",
            self.config.run, where, self.published, self.finished.count, self.outstanding,
            self.skipped,
        )  # fmt: skip
        if self.kinds.active:
            log.info("run %s: kinds of question passed over: %s", self.config.run,
                     self.kinds.summary())  # fmt: skip

    def stats(self) -> FeederStats:
        """Where the feeder stands now."""
        return FeederStats(
            published=self._published_now,
            total_published=self.published,
            finished=self.finished.count,
            skipped=self.skipped,
            epoch=self.position.epoch,
            next_index=self.position.index,
            done=self.done,
        )

    def close(self) -> None:
        """Stop the tails and deliver pending heartbeats; committed batches are durable."""
        for tail in self.tails:
            tail.stop()
        self.status.close()
        self.requests.close()

    def __enter__(self) -> FeederService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _slots(questions: list[QaQuestion], config: FeederConfig) -> list[QaQuestion]:
    """An epoch's plays; ValueError where `plays_by_hops` is set and no question says its hops
    (it would change nothing, silently)."""
    if config.plays_by_hops and not any(q.hops for q in questions):
        raise ValueError(
            f"plays_by_hops={config.plays_by_hops} needs questions that say their hops, and "
            f"{config.qa} names none: drop the setting or add `hops` to its lines"
        )
    slots = epoch_slots(questions, config.plays_by_hops)
    if len(slots) > len(questions):
        log.info("%d questions, %d plays an epoch (plays_by_hops=%s)", len(questions),
                 len(slots), config.plays_by_hops)  # fmt: skip
    return slots


def _passed(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline
