"""The run ledger reads the real topics and finds every broken guarantee, and only those."""

from __future__ import annotations

import random
import uuid

from asearcher.consumers.observability.run_ledger import read_ledger
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.events import (
    EvalResult,
    RolloutRequested,
    TrainerStepFinished,
    TrajectoriesDropped,
    WeightsPublished,
)
from asearcher.streams.wire.topics import (
    EVAL_RESULTS,
    EVAL_TRAJECTORIES,
    ROLLOUT_REQUESTS,
    TRAINER_METRICS,
    TRAJECTORIES,
    WEIGHTS,
)
from tests.support.samples import trajectory

RNG = random.Random(5)


class RunWriter:
    """Writes one run's events to the shared topics, as its services would."""

    def __init__(self, producer: EventProducer, run: str | None = None) -> None:
        self.run = run or f"ledger{uuid.uuid4().hex[:8]}"
        self.producer = producer

    def request(self, index: int, size: int = 2) -> str:
        group = f"{self.run}-e0-{index:06d}"
        self.producer.send(ROLLOUT_REQUESTS, RolloutRequested(
            question_id=f"q{index}", group_id=group, question="?", group_size=size,
        ))  # fmt: skip
        return group

    def play(self, group: str, sample: int) -> str:
        played = trajectory(RNG, tokens=8, group_id=group, sample_index=sample, group_size=2)
        self.producer.send(TRAJECTORIES, played)
        return played.trajectory_id

    def step(self, version: int, trained: list[str], dropped: list[str] = ()) -> None:
        self.producer.send(TRAINER_METRICS, TrainerStepFinished(
            model=self.run, version=version, step=version, trained_ids=trained,
            dropped_ids=list(dropped), dropped_stale=len(dropped),
        ))  # fmt: skip
        self.producer.send(WEIGHTS, WeightsPublished(
            model=self.run, version=version, uri=f"mem://{version}", sha256="0", step=version,
        ))  # fmt: skip

    def evaluate(self, eval_id: str, samples: list[tuple[str, int]], publish: int = 1) -> list[str]:
        metadata = {"model": self.run, "eval_id": eval_id, "benchmark": "world"}
        played = [
            trajectory(RNG, tokens=8, question_id=question, sample_index=sample, purpose="eval",
                       metadata=metadata)
            for question, sample in samples
        ]  # fmt: skip
        for event in played:
            self.producer.send(EVAL_TRAJECTORIES, event)
        for _ in range(publish):
            self.producer.send(EVAL_RESULTS, EvalResult(
                eval_id=eval_id, model=self.run, benchmark="world", policy_version=1,
                questions=2, samples_per_question=1,
            ))  # fmt: skip
        return [event.trajectory_id for event in played]


def test_a_clean_run_holds_every_guarantee_and_counts_work_in_flight(settings, codec) -> None:
    with EventProducer(settings, codec) as producer:
        run = RunWriter(producer)
        first, second, third = (run.request(i) for i in range(3))
        a, b = run.play(first, 0), run.play(first, 1)
        c, d = run.play(second, 0), run.play(second, 1)
        run.play(third, 0)  # still playing its second sample
        run.step(1, [a, b])
        producer.send(TRAINER_METRICS, TrajectoriesDropped(
            model=run.run, version=1, dropped_ids=[c, d], dropped_flat_groups=2,
        ))  # fmt: skip
        run.evaluate("ev1", [("q1", 0), ("q2", 0)])
    ledger = read_ledger(settings, codec, run.run)
    assert ledger.ok, ledger.violations
    assert (ledger.requests, ledger.groups_complete, ledger.groups_pending) == (3, 2, 1)
    assert (ledger.trajectories, ledger.trained, ledger.dropped) == (5, 2, 2)
    assert ledger.untrained_pending == 1 and ledger.dropped_by_reason == {"flat_groups": 2}
    assert (ledger.versions, ledger.newest_version, ledger.evaluations) == (1, 1, 1)


def test_every_broken_guarantee_is_named(settings, codec) -> None:
    with EventProducer(settings, codec) as producer:
        run = RunWriter(producer)
        group = run.request(0)
        a, b = run.play(group, 0), run.play(group, 1)
        run.play(group, 1)  # the request played a sample twice
        run.play(f"{run.run}-e0-999999", 0)  # a group nobody asked for
        run.step(1, [a, b])
        run.step(3, [a])  # trained twice; version 2 never published
        producer.send(TRAINER_METRICS, TrajectoriesDropped(
            model=run.run, version=3, dropped_ids=[b, "ghost"], dropped_stale=2,
        ))  # fmt: skip
        run.evaluate("ev1", [("q1", 0), ("q2", 0)], publish=2)
        evaluated = run.evaluate("ev2", [("q1", 0), ("q1", 0)])
        run.step(4, [evaluated[0]])  # an evaluation trajectory trained
        # Another run whose name extends this one's: none of its groups is this run's.
        RunWriter(producer, f"{run.run}-e0").request(0)
    ledger = read_ledger(settings, codec, run.run)
    assert ledger.requests == 1  # not the other run's
    violations = "\n".join(ledger.violations)
    for expected in (
        "1 requests yielded more than one group",
        "1 groups nobody requested",
        "1 trajectories trained twice",
        "1 trajectories both trained and dropped",
        "2 trained or dropped, never produced",  # "ghost" and the evaluation trajectory
        "versions missing: 2",
        "1 evaluations published twice",
        "1 evaluations played a (question, sample) twice",
        "1 evaluations published before all their samples",
        "1 evaluation trajectories reached the trainer",
    ):
        assert expected in violations, violations


def test_foreign_work_is_reported_apart_from_loss(settings, codec) -> None:
    """A probe request sent by hand and a hand-written trajectory, both trained by the run's
    trainer: no violation, a line naming them; a trained id found nowhere is still loss."""
    with EventProducer(settings, codec) as producer:
        run = RunWriter(producer)
        group = run.request(0)
        a, b = run.play(group, 0), run.play(group, 1)
        probe = RolloutRequested(question_id="probe", group_id=f"probe-{uuid.uuid4().hex[:6]}",
                                 question="?", group_size=1)  # fmt: skip
        producer.send(ROLLOUT_REQUESTS, probe)
        played = trajectory(RNG, tokens=8, group_id=probe.group_id, group_size=1,
                            request_id=probe.event_id)  # fmt: skip
        producer.send(TRAJECTORIES, played)
        forged = trajectory(RNG, tokens=8, group_id="hand-made", group_size=1)
        producer.send(TRAJECTORIES, forged)
        run.step(1, [a, b, played.trajectory_id, forged.trajectory_id])
    ledger = read_ledger(settings, codec, run.run)
    assert ledger.ok, ledger.violations
    assert ledger.foreign == 2 and ledger.trained == 4 and ledger.untrained_pending == 0
    assert f"{probe.group_id} (requested by no run, q=probe)" in ledger.foreign_groups
    assert "hand-made (sender unknown)" in ledger.foreign_groups

    with EventProducer(settings, codec) as producer:
        RunWriter(producer, run.run).step(2, ["lost-somewhere"])
    assert "1 trained or dropped, never produced" in "\n".join(
        read_ledger(settings, codec, run.run).violations
    )
