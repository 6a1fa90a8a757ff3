"""The metrics processor: events of one run become TensorBoard scalars, the version as the step."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from asearcher.consumers.observability.metrics_processor import (
    MetricsWriter,
    staleness_stats,
    trajectories_per_s,
)
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.events import (
    DeadLetter,
    EvalResult,
    StepStats,
    TrainerStepFinished,
    TrajectoriesDropped,
)
from asearcher.streams.wire.topics import DEAD_LETTERS, EVAL_RESULTS, TRAINER_METRICS
from tests.support.rollout import events_of

RUN = "exp1"


def read_scalars(logdir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar in `logdir`: tag -> [(step, value, wall time)] in file order."""
    accumulator = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {
        tag: [(s.step, s.value, s.wall_time) for s in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def step(version: int, stats: StepStats | None = None, model: str = RUN, **fields
         ) -> TrainerStepFinished:  # fmt: skip
    return TrainerStepFinished(
        model=model, version=version, step=version, stats=stats or StepStats(), **fields
    )


def result(version: int, benchmark: str, model: str = RUN, **fields) -> EvalResult:
    return EvalResult(eval_id=f"e{version}", model=model, benchmark=benchmark,
                      policy_version=version, questions=8, **fields)  # fmt: skip


# Values exact in float32 (TensorBoard's simple_value), so equality is the right check.
FIRST = step(1, StepStats(reward_mean=0.5, loss=-0.125, samples=16, tokens=4096, seconds=2.0),
             staleness_counts=[2, 1, 1], dropped_stale=3, dropped_flat_groups=1,
             idle_fraction=0.25, created_at=1000.0)  # fmt: skip
SECOND = step(2, StepStats(reward_mean=0.75, loss=0.25, samples=16, tokens=1024, seconds=1.0),
              staleness_counts=[0, 4], duplicates=2, created_at=1004.0)  # fmt: skip
DROPPED = TrajectoriesDropped(model=RUN, version=2, dropped_ids=["a", "b"], dropped_flat_groups=2,
                              created_at=1005.0)  # fmt: skip
EVAL = result(2, "hotpotqa", samples_per_question=4, averages={"f1": 0.375, "em": 0.25,
              "searches": 2.5}, best_of_k={"f1": 0.625, "em": 0.5}, created_at=1010.0)  # fmt: skip
OTHER_STEP = step(3, model="exp2", stats=StepStats(reward_mean=0.0625), created_at=1011.0)
OTHER_EVAL = result(3, "nq", model="exp2", samples_per_question=1, averages={"f1": 1.0})


def test_staleness_stats_and_throughput() -> None:
    assert staleness_stats([2, 1, 1]) == (0.75, 2)
    assert staleness_stats([0, 0, 3]) == (2.0, 2)
    assert staleness_stats([]) is None and staleness_stats([0, 0]) is None
    assert trajectories_per_s(1, 1000.0, SECOND) == 4.0  # 16 samples in 4 s
    assert trajectories_per_s(0, 1000.0, SECOND) is None  # not the next version
    assert trajectories_per_s(1, 1004.0, SECOND) is None  # no time passed


def test_writer_round_trips_through_tensorboard(tmp_path: Path) -> None:
    with MetricsWriter(RUN, tmp_path) as writer:
        counts = [writer.write(e) for e in (FIRST, OTHER_STEP, SECOND, DROPPED, EVAL, OTHER_EVAL)]
    assert counts[1] == counts[5] == 0  # another run's events
    assert writer.written == 4 and writer.ignored == 2
    scalars = read_scalars(tmp_path)

    def points(tag: str) -> list[tuple[int, float]]:
        return [(s, v) for s, v, _ in scalars[tag]]

    assert points("train/reward_mean") == [(1, 0.5), (2, 0.75)]
    assert points("train/loss") == [(1, -0.125), (2, 0.25)]
    assert points("train/staleness_mean") == [(1, 0.75), (2, 1.0)]
    assert points("train/staleness_max") == [(1, 2.0), (2, 1.0)]
    assert points("train/tokens_per_s") == [(1, 2048.0), (2, 1024.0)]
    assert points("train/idle_fraction") == [(1, 0.25), (2, 0.0)]
    assert points("train/dropped/stale_samples") == [(1, 3.0), (2, 0.0)]
    assert points("train/dropped/duplicates") == [(1, 0.0), (2, 2.0)]
    assert points("train/trajectories_per_s") == [(2, 4.0)]  # needs the previous step
    assert points("train/dropped_between_steps/flat_groups") == [(2, 2.0)]
    assert points("eval/hotpotqa/f1") == [(2, 0.375)]
    assert points("eval/hotpotqa/searches") == [(2, 2.5)]
    assert points("eval/hotpotqa/f1_pass@4") == [(2, 0.625)]
    assert points("eval/hotpotqa/em_pass@4") == [(2, 0.5)]
    # The events' own times, so a replay draws the same timeline.
    assert [w for _, _, w in scalars["train/reward_mean"]] == [1000.0, 1004.0]
    assert not [tag for tag in scalars if tag.startswith("eval/nq")]
    assert all(s in (1, 2) for tag in scalars for s, _, _ in scalars[tag])  # nothing of exp2


def test_a_step_without_staleness_counts_has_no_staleness_scalars(tmp_path: Path) -> None:
    with MetricsWriter(RUN, tmp_path) as writer:
        writer.write(step(5, StepStats(reward_mean=0.5)))
    scalars = read_scalars(tmp_path)
    assert "train/reward_mean" in scalars
    assert "train/staleness_mean" not in scalars and "train/staleness_max" not in scalars


# -- the faust app against the broker --------------------------------------------------------------

RUNNER = """
import json, sys
from pathlib import Path
from asearcher.consumers.observability.metrics_processor import serve_metrics
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.cluster.settings import KafkaSettings, claim_store

a = json.loads(sys.argv[1])
serve_metrics(KafkaSettings(bootstrap_servers=a["bootstrap"]), a["run"], Path(a["logdir"]),
              a["home"], "INFO", codec=EventCodec(claim_store(a["claims"])),
              metrics_topic=a["metrics"], eval_topic=a["eval"])
"""


def wait_for(logdir: Path, done, timeout_s: float, worker: subprocess.Popen, log: Path) -> dict:
    deadline = time.monotonic() + timeout_s
    scalars: dict = {}
    while time.monotonic() < deadline:
        assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
        if logdir.exists():
            scalars = read_scalars(logdir)
            if done(scalars):
                return scalars
        time.sleep(0.5)
    raise AssertionError(f"the event files never held every event: {sorted(scalars)}")


def test_the_faust_app_writes_a_runs_events_and_stops_on_sigterm(
    settings, codec, claims, make_topic, tmp_path: Path
) -> None:
    metrics, evals = make_topic(like=TRAINER_METRICS), make_topic(like=EVAL_RESULTS)
    with EventProducer(settings, codec) as producer:
        producer.send_raw(metrics, b"\x00 not an event", key=RUN)  # dead-lettered, then skipped
        for event in (FIRST, OTHER_STEP, SECOND, DROPPED):
            producer.send(metrics, event)
        for event in (EVAL, OTHER_EVAL):
            producer.send(evals, event)
    logdir, log = tmp_path / "tb", tmp_path / "worker.log"
    arguments = {"bootstrap": settings.bootstrap_servers, "run": RUN, "logdir": str(logdir),
                 "home": str(tmp_path / "home"), "claims": claims.base_url, "metrics": metrics,
                 "eval": evals}  # fmt: skip
    with log.open("wb") as output:
        worker = subprocess.Popen(
            [sys.executable, "-c", RUNNER, json.dumps(arguments)],
            stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        scalars = wait_for(
            logdir,
            lambda s: (
                len(s.get("train/reward_mean", [])) == 2
                and "eval/hotpotqa/f1_pass@4" in s
                and "train/dropped_between_steps/flat_groups" in s
            ),
            timeout_s=45,
            worker=worker,
            log=log,
        )
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert code == 0, log.read_text(errors="replace")[-3000:]
    assert [(s, v) for s, v, _ in scalars["train/reward_mean"]] == [(1, 0.5), (2, 0.75)]
    assert [(s, v) for s, v, _ in scalars["eval/hotpotqa/em_pass@4"]] == [(2, 0.5)]
    assert not [tag for tag in scalars if tag.startswith("eval/nq")]
    letters = [e for e in events_of(settings, codec, DEAD_LETTERS) if isinstance(e, DeadLetter)]
    assert [letter.origin_offset for letter in letters if letter.origin_topic == metrics] == [0]
