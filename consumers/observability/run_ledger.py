"""A run's ledger, proven from its topics: what was asked, produced, trained, dropped, published
and evaluated, and every place where a guarantee does not hold.

The guarantees (see ARCHITECTURE.md): every training request yields exactly one group (its
`group_size` trajectories, one per sample index); every trajectory is trained exactly once or
dropped with a reason, never both; weight versions follow each other without gaps; an
evaluation's result is published once and counts each (question, sample) once; evaluation
trajectories are never trained. Work still in flight when the ledger is read (a group half
played, a trajectory not yet trained) is counted as pending, not as a violation.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterator

import msgspec

from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.replay import bounded_reader, read_spans, topic_spans
from asearcher.streams.wire.codec import EventCodec, EventDecodeError
from asearcher.streams.wire.events import (
    EVENT_TYPES,
    EvalResult,
    Event,
    RolloutRequested,
    TrainerStepFinished,
    TrajectoriesDropped,
    TrajectoryFinished,
    WeightsPublished,
    eval_key,
)
from asearcher.streams.wire.topics import (
    EVAL_RESULTS,
    EVAL_TRAJECTORIES,
    ROLLOUT_REQUESTS,
    TRAINER_METRICS,
    TRAJECTORIES,
    WEIGHTS,
)

SHOWN = 5  # example ids quoted per violation


class RunLedger(msgspec.Struct, kw_only=True):
    """Counts per guarantee, and the violations (empty when every guarantee holds)."""

    run: str
    requests: int = 0
    groups_complete: int = 0
    groups_pending: int = 0  # requested, fewer trajectories than group_size so far
    trajectories: int = 0
    trained: int = 0
    dropped: int = 0
    dropped_by_reason: dict[str, int] = {}
    untrained_pending: int = 0  # produced, neither trained nor dropped yet
    versions: int = 0
    newest_version: int = 0
    evaluations: int = 0
    eval_trajectories: int = 0
    undecodable: int = 0  # records of the run's topics nothing could decode (dead-lettered)
    # Why those records could not be read, with how many each (e.g. a claim check missing).
    unreadable: dict[str, int] = {}
    # Trajectories the run's trainer trained or dropped that the run's feeder never asked for
    # (a `rollout request` probe, a hand-written event): not loss, reported apart.
    foreign: int = 0
    foreign_groups: list[str] = []  # examples, with their request's sender where known
    violations: list[str] = []

    @property
    def ok(self) -> bool:
        return not self.violations


def topic_events(
    settings: KafkaSettings, codec: EventCodec, topic: str, why: Counter[str] | None = None
) -> Iterator[Event | None]:
    """Every committed event of `topic` (None for a record that does not decode: it was
    dead-lettered when a service met it; the ledger counts it, in `why` by reason, and sends
    nothing)."""
    consumer = bounded_reader(settings, f"read-{topic}")
    try:
        for message in read_spans(consumer, topic_spans(consumer, topic), timeout_s=300):
            try:
                yield codec.decode(message.value(), message.headers(), EVENT_TYPES)
            except EventDecodeError as exc:
                if why is not None:
                    why[f"{topic}: {str(exc)[:100]}"] += 1
                yield None
    finally:
        consumer.close()


def _examples(ids) -> str:
    ids = sorted(ids)
    more = f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else ""
    return ", ".join(ids[:SHOWN]) + more


def read_ledger(settings: KafkaSettings, codec: EventCodec, run: str) -> RunLedger:
    """Read the run's topics to their ends now and check every guarantee.

    Downstream topics are read first (what was trained, then what was produced, then what was
    requested): on a live run, everything a later-read topic's output depends on was written
    before the earlier snapshot was taken, so work in flight never looks like a violation.
    """
    ledger = RunLedger(run=run)
    trained, dropped, stepped = _read_training(ledger, settings, codec)
    _check_versions(ledger, settings, codec, stepped)
    evaluated = _check_evaluations(ledger, settings, codec)
    samples, ids, foreign = _read_trajectories(ledger, settings, codec, run)
    requests = _read_requests(ledger, settings, codec, run)
    _check_groups(ledger, requests, samples, ids)
    taken = _count_foreign(ledger, trained, dropped, foreign, settings, codec)
    _check_training(ledger, trained, dropped, set(ids) | taken)
    if mixed := evaluated & (set(trained) | set(dropped)):
        ledger.violations.append(
            f"{len(mixed)} evaluation trajectories reached the trainer: {_examples(mixed)}"
        )
    return ledger


def _ours(group_id: str, run: str) -> bool:
    """Whether `group_id` is one of the feeder's for `run` (<run>-e<epoch>-<index>)."""
    return re.match(rf"{re.escape(run)}-e\d+-\d+$", group_id) is not None


def _read_requests(ledger: RunLedger, settings, codec, run: str) -> dict[str, int]:
    requests: dict[str, int] = {}
    for event in topic_events(settings, codec, ROLLOUT_REQUESTS):
        if isinstance(event, RolloutRequested) and _ours(event.group_id, run):
            if event.group_id in requests:
                ledger.violations.append(f"group {event.group_id} was requested twice")
            requests[event.group_id] = event.group_size
    ledger.requests = len(requests)
    return requests


def _read_trajectories(
    ledger: RunLedger, settings, codec, run: str
) -> tuple[dict[str, Counter[int]], Counter[str], dict[str, TrajectoryFinished]]:
    """The run's samples per group and trajectory ids, and every other trajectory by id."""
    samples: dict[str, Counter[int]] = defaultdict(Counter)
    ids: Counter[str] = Counter()
    others: dict[str, TrajectoryFinished] = {}
    why: Counter[str] = Counter()
    for event in topic_events(settings, codec, TRAJECTORIES, why):
        if event is None:
            ledger.undecodable += 1
        elif isinstance(event, TrajectoryFinished) and _ours(event.group_id, run):
            ids[event.trajectory_id] += 1
            samples[event.group_id][event.sample_index] += 1
        elif isinstance(event, TrajectoryFinished):
            others[event.trajectory_id] = event
    ledger.trajectories = len(ids)
    ledger.unreadable = dict(why)
    return samples, ids, others


def _count_foreign(
    ledger: RunLedger,
    trained: Counter[str],
    dropped: Counter[str],
    others: dict[str, TrajectoryFinished],
    settings,
    codec,
) -> set[str]:
    """Count the trained or dropped trajectories of requests the run's feeder did not send;
    their ids."""
    foreign = [others[i] for i in set(trained) | set(dropped) if i in others]
    ledger.foreign = len(foreign)
    if not foreign:
        return set()
    senders = _senders({t.request_id for t in foreign}, settings, codec)
    groups = sorted({t.group_id for t in foreign})
    ledger.foreign_groups = [
        f"{group} ({senders.get(group, 'sender unknown')})" for group in groups[:SHOWN]
    ]
    return {t.trajectory_id for t in foreign}


def _senders(request_ids: set[str], settings, codec) -> dict[str, str]:
    """Who sent the requests `request_ids`, by group: the request's producer where it says."""
    found = {}
    for event in topic_events(settings, codec, ROLLOUT_REQUESTS):
        if isinstance(event, RolloutRequested) and event.event_id in request_ids:
            origin = event.metadata.get("run") or event.metadata.get("eval_id") or "no run"
            found[event.group_id] = f"requested by {origin}, q={event.question_id}"
    return found


def _check_groups(
    ledger: RunLedger,
    requests: dict[str, int],
    samples: dict[str, Counter[int]],
    ids: Counter[str],
) -> None:
    if twice := [i for i, n in ids.items() if n > 1]:
        ledger.violations.append(f"{len(twice)} trajectories published twice: {_examples(twice)}")
    if orphans := set(samples) - set(requests):
        ledger.violations.append(f"{len(orphans)} groups nobody requested: {_examples(orphans)}")
    overfull = []
    for group_id, size in requests.items():
        played = samples.get(group_id, Counter())
        if any(n > 1 for n in played.values()) or len(played) > size:
            overfull.append(group_id)
        elif len(played) == size:
            ledger.groups_complete += 1
        else:
            ledger.groups_pending += 1
    if overfull:
        ledger.violations.append(
            f"{len(overfull)} requests yielded more than one group (a sample played twice): "
            f"{_examples(overfull)}"
        )


def _read_training(
    ledger: RunLedger, settings, codec
) -> tuple[Counter[str], Counter[str], set[int]]:
    """Trained and dropped trajectory ids, and the versions the steps produced."""
    stepped: set[int] = set()
    trained: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for event in topic_events(settings, codec, TRAINER_METRICS):
        if not isinstance(event, TrainerStepFinished | TrajectoriesDropped):
            continue
        if event.model != ledger.run:
            continue
        dropped.update(event.dropped_ids)
        for reason in ("dropped_stale", "dropped_flat_groups", "dropped_small_groups",
                       "duplicates"):  # fmt: skip
            reasons[reason.removeprefix("dropped_")] += getattr(event, reason)
        if isinstance(event, TrainerStepFinished):
            trained.update(event.trained_ids)
            stepped.add(event.version)
    ledger.dropped_by_reason = {k: v for k, v in reasons.items() if v}
    return trained, dropped, stepped


def _check_training(
    ledger: RunLedger, trained: Counter[str], dropped: Counter[str], produced: set[str]
) -> None:
    ledger.trained, ledger.dropped = len(trained), len(dropped)
    checks = (
        ([i for i, n in trained.items() if n > 1], "trajectories trained twice"),
        ([i for i, n in dropped.items() if n > 1], "trajectories dropped twice"),
        (set(trained) & set(dropped), "trajectories both trained and dropped"),
        ((set(trained) | set(dropped)) - produced, "trained or dropped, never produced"),
    )  # fmt: skip
    for bad, what in checks:
        if bad:
            ledger.violations.append(f"{len(bad)} {what}: {_examples(bad)}")
    ledger.untrained_pending = len(produced - set(trained) - set(dropped))


def _check_versions(ledger: RunLedger, settings, codec, stepped: set[int]) -> None:
    # `weights` is compacted (older announcements go); the steps' own record stays longer.
    versions = stepped | {
        event.version
        for event in topic_events(settings, codec, WEIGHTS)
        if isinstance(event, WeightsPublished) and event.model == ledger.run
    }
    ledger.versions = len(versions)
    ledger.newest_version = max(versions, default=0)
    if missing := sorted(set(range(1, ledger.newest_version + 1)) - set(versions)):
        ledger.violations.append(f"versions missing: {_examples(map(str, missing))}")


def _check_evaluations(ledger: RunLedger, settings, codec) -> set[str]:
    """Check every evaluation of the run; the ids of its evaluation trajectories."""
    results: Counter[str] = Counter()
    expected: dict[str, int] = {}
    for event in topic_events(settings, codec, EVAL_RESULTS):
        if isinstance(event, EvalResult) and event.model == ledger.run:
            results[event.eval_key] += 1
            expected[event.eval_key] = event.questions * event.samples_per_question
    ledger.evaluations = len(results)
    if twice := [k for k, n in results.items() if n > 1]:
        ledger.violations.append(f"{len(twice)} evaluations published twice: {_examples(twice)}")
    samples: dict[str, Counter[tuple[str, int]]] = defaultdict(Counter)
    evaluated: set[str] = set()
    for event in topic_events(settings, codec, EVAL_TRAJECTORIES):
        if isinstance(event, TrajectoryFinished) and event.metadata.get("model") == ledger.run:
            key = eval_key(event.metadata.get("eval_id", ""), event.metadata.get("benchmark", ""))
            samples[key][(event.question_id, event.sample_index)] += 1
            evaluated.add(event.trajectory_id)
    counted_twice = [e for e, played in samples.items() if any(n > 1 for n in played.values())]
    if counted_twice:
        ledger.violations.append(
            f"{len(counted_twice)} evaluations played a (question, sample) twice: "
            f"{_examples(counted_twice)}"
        )
    short = [e for e, n in expected.items() if len(samples.get(e, ())) < n]
    if short:
        ledger.violations.append(
            f"{len(short)} evaluations published before all their samples: {_examples(short)}"
        )
    ledger.eval_trajectories = len(evaluated)
    return evaluated
