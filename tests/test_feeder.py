"""The request feeder: epochs reshuffled, a bounded number outstanding, never a request twice."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from asearcher.producers.rollout.feeder import (
    FeederConfig,
    FeederService,
    FeederTopics,
    last_progress,
    load_questions,
)
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.events import (
    DeadLetter,
    RolloutRequested,
    ServiceStatus,
    ToolCallRequested,
    TrajectoriesDropped,
    TrajectoryFinished,
)
from tests.conftest import read_raw, worker_command
from tests.support.qa import (
    write_qa,
)

ASEARCHER = shutil.which("asearcher", path=str(Path(sys.executable).parent)) or "asearcher"


@pytest.fixture
def feeder_config(make_topic, tmp_path: Path) -> Callable[..., FeederConfig]:
    """A config over `questions` QA items, with private topics and a fresh run and instance."""

    def make(questions: int, **fields) -> FeederConfig:
        topics = FeederTopics(
            requests=make_topic(like="rollout.requests", partitions=2),
            trajectories=make_topic(like="trajectories", partitions=2),
            dead_letters=make_topic(like="dead.letters"),
            progress=make_topic(like="feeder.progress"),
            status=make_topic(like="service.status"),
            trainer_metrics=make_topic(like="trainer.metrics"),
        )
        name = uuid.uuid4().hex[:8]
        return FeederConfig(
            qa=str(write_qa(tmp_path / f"qa-{name}.jsonl", questions)),
            run=f"run-{name}", instance=f"test-{name}", topics=topics,
            status_every_s=0.2, **fields,
        )  # fmt: skip

    return make


def requests_on(settings, codec, topic: str, isolation: str = "read_committed") -> list:
    messages = read_raw(settings, topic, isolation)
    return [codec.decode(m.value(), m.headers(), (RolloutRequested,)) for m in messages]


def epoch_orders(requests: list[RolloutRequested], epochs: int) -> list[list[str]]:
    """Each epoch's question ids in feed order (group ids end in the zero-padded position)."""
    return [
        [r.question_id for r in sorted(requests, key=lambda r: r.group_id)
         if r.metadata["epoch"] == str(epoch)]
        for epoch in range(epochs)
    ]  # fmt: skip


def assert_each_question_once_per_epoch(requests: list, epochs: int, questions: int) -> None:
    assert max(Counter(r.group_id for r in requests).values()) == 1  # no request twice
    for order in epoch_orders(requests, epochs):
        assert sorted(order) == sorted(f"q{i}" for i in range(questions))


def finished(group_id: str) -> TrajectoryFinished:
    return TrajectoryFinished(
        trajectory_id=uuid.uuid4().hex, group_id=group_id, question_id="q",
        token_ids=[], logprobs=[], loss_mask=[], token_versions=[],
    )  # fmt: skip


def test_feeder_over_two_epochs_publishes_every_question_once_per_epoch_reshuffled(
    settings, codec, feeder_config
) -> None:
    config = feeder_config(5, epochs=2, seed=1, outstanding=100, group_size=3)
    with FeederService(settings, codec, config) as feeder:
        stats = feeder.run(exit_when_done=True, timeout=30)
    assert stats.done and stats.published == 10

    requests = requests_on(settings, codec, config.topics.requests)
    assert len(requests) == 10
    assert_each_question_once_per_epoch(requests, epochs=2, questions=5)
    first, second = epoch_orders(requests, epochs=2)
    assert first != second  # seed 1 shuffles the two epochs differently
    assert min(r.group_id for r in requests) == f"{config.run}-e0-000000"
    assert all(r.gold_answers == [f"a{r.question_id[1:]}"] for r in requests)
    assert {(r.group_size, r.metadata["run"]) for r in requests} == {(3, config.run)}
    progress = last_progress(settings, codec, config.topics.progress, config.run)
    assert progress is not None and progress.finished and progress.published == 10


def test_feeder_with_nothing_finishing_stops_at_the_outstanding_bound_until_groups_finish(
    settings, codec, feeder_config
) -> None:
    config = feeder_config(8, outstanding=3)
    with FeederService(settings, codec, config) as feeder:
        assert feeder.run(timeout=2).published == 3
        published = requests_on(settings, codec, config.topics.requests)
        assert len(published) == 3
        with EventProducer(settings, codec) as producer:
            for request in published[:2]:
                for _ in range(2):  # a group has several trajectories: it finishes once
                    producer.send(config.topics.trajectories, finished(request.group_id))
            # Another kind of record keyed by the third group does not finish it: the feeder
            # reads keys and kind headers, never the values.
            stray = ToolCallRequested(call_id="c", trajectory_id="t", tool="search")
            producer.send(config.topics.trajectories, stray, key=published[2].group_id)
        assert feeder.run(timeout=3).published == 2
    assert len(requests_on(settings, codec, config.topics.requests)) == 5

    statuses = [
        codec.decode(m.value(), m.headers(), (ServiceStatus,))
        for m in read_raw(settings, config.topics.status)
    ]
    waiting = [s for s in statuses if s.state == "waiting"]
    assert waiting and waiting[0].waiting_for.startswith("3 requests outstanding (limit 3)")
    assert waiting[0].counters["outstanding"] == 3 and statuses[-1].state == "stopped"


def test_feeder_restarted_mid_epoch_continues_without_duplicates(
    settings, codec, feeder_config
) -> None:
    config = feeder_config(7, epochs=2, outstanding=100)
    with FeederService(settings, codec, config) as first:
        assert first.run(max_requests=4, timeout=20).published == 4
    with FeederService(settings, codec, config) as second:
        assert second.published == 4  # resumed from the committed position
        stats = second.run(exit_when_done=True, timeout=30)
    assert (stats.published, stats.total_published, stats.done) == (10, 14, True)
    with FeederService(settings, codec, config) as third:
        assert third.run(exit_when_done=True, timeout=10).published == 0  # the run is fed

    requests = requests_on(settings, codec, config.topics.requests)
    assert len(requests) == 14
    assert_each_question_once_per_epoch(requests, epochs=2, questions=7)


def test_feeder_passes_over_flat_questions_and_asks_them_again_later(
    settings, codec, feeder_config
) -> None:
    config = feeder_config(6, epochs=4, seed=2, outstanding=100, revisit_flat_every=3)
    with FeederService(settings, codec, config) as first:
        assert first.run(max_requests=6, timeout=20).published == 6  # epoch 0 in full
    epoch0 = sorted(requests_on(settings, codec, config.topics.requests), key=lambda r: r.group_id)
    flat = {epoch0[1].question_id, epoch0[4].question_id}
    with EventProducer(settings, codec) as producer:  # the trainer dropped two groups as flat
        producer.send(config.topics.trainer_metrics, TrajectoriesDropped(
            version=3, dropped_ids=["t1", "t2"], dropped_flat_groups=2,
            flat_groups=[epoch0[1].group_id, epoch0[4].group_id],
        ))  # fmt: skip
    # A fresh process reads the trainer's report before it feeds on.
    with FeederService(settings, codec, config) as second:
        stats = second.run(exit_when_done=True, timeout=30)
    assert (stats.total_published, stats.skipped, stats.done) == (20, 4, True)

    orders = epoch_orders(requests_on(settings, codec, config.topics.requests), epochs=4)
    assert [len(order) for order in orders] == [6, 4, 4, 6]
    assert not flat & set(orders[1]) and not flat & set(orders[2]) and flat <= set(orders[3])
    progress = last_progress(settings, codec, config.topics.progress, config.run)
    assert progress is not None and (progress.published, progress.skipped) == (20, 4)
    with FeederService(settings, codec, config) as third:  # the count survives a restart
        assert (third.published, third.outstanding) == (20, 20)
    statuses = [
        codec.decode(m.value(), m.headers(), (ServiceStatus,))
        for m in read_raw(settings, config.topics.status)
    ]
    assert statuses[-1].counters["passed_over_flat"] == 4  # `stream status` shows it


def test_feeder_passes_over_a_kind_of_question_whose_groups_were_mostly_flat(
    settings, codec, feeder_config, tmp_path: Path
) -> None:
    config = feeder_config(1, seed=4, outstanding=100, flat_kind_share=0.75,
                           flat_kind_probe_every=2)  # fmt: skip
    lines = [
        {"id": f"q{i}", "question": f"question {i}?", "answers": ["a"],
         "kind": "hard" if i % 2 else "easy"}
        for i in range(20)
    ]  # fmt: skip
    qa = tmp_path / "kinds.jsonl"
    qa.write_text("".join(msgspec.json.encode(line).decode() + "\n" for line in lines))
    config = msgspec.structs.replace(config, qa=str(qa))
    with FeederService(settings, codec, config) as first:
        assert first.run(max_requests=12, timeout=20).published == 12
    played = requests_on(settings, codec, config.topics.requests)
    hard = [r for r in played if int(r.question_id[1:]) % 2]
    assert len(hard) >= 4  # enough groups of the kind to trust its share
    with EventProducer(settings, codec) as producer:  # every hard group flat, one easy one
        for request in played * 2:  # a group's second trajectory does not count it again
            producer.send(config.topics.trajectories, finished(request.group_id))
        easy_flat = next(r for r in played if r not in hard)
        producer.send(config.topics.trainer_metrics, TrajectoriesDropped(
            version=2, dropped_ids=[], dropped_flat_groups=len(hard) + 1,
            flat_groups=[r.group_id for r in [*hard, easy_flat]],
        ))  # fmt: skip
    with FeederService(settings, codec, config) as second:
        stats = second.run(exit_when_done=True, timeout=30)
    rest = 10 - len(hard)  # hard questions not played yet: every second one is still asked
    assert (stats.skipped, stats.done) == ((rest + 1) // 2, True)
    requests = requests_on(settings, codec, config.topics.requests)
    first_ids = {r.group_id for r in played}
    later = [r for r in requests if r.group_id not in first_ids]
    assert sum(int(r.question_id[1:]) % 2 for r in later) == rest // 2
    assert len(later) - rest // 2 == 10 - (len(played) - len(hard))  # every easy one is fed


def write_hops_qa(path: Path, hops: list[int]) -> Path:
    """Questions q0.. taking `hops[i]` hops (0: the line does not say), reading pages q<i>/1..."""
    lines = [{"id": f"q{i}", "question": f"question {i}?", "answers": ["a"], "hops": h,
              "supporting_urls": [f"q{i}/{n}" for n in range(1, h + 1)]}
             for i, h in enumerate(hops)]  # fmt: skip
    path.write_text("".join(msgspec.json.encode(line).decode() + "\n" for line in lines))
    return path


def test_feeder_plays_each_question_as_often_as_its_hops_ask_and_resumes_exactly(
    settings, codec, feeder_config, tmp_path: Path
) -> None:
    qa = write_hops_qa(tmp_path / "hops.jsonl", [1, 2, 1, 2, 0])
    config = msgspec.structs.replace(
        feeder_config(1, epochs=2, seed=3, outstanding=100, plays_by_hops=[1, 2]), qa=str(qa)
    )
    with FeederService(settings, codec, config) as first:
        assert first.run(max_requests=5, timeout=20).published == 5
    with FeederService(settings, codec, config) as second:
        stats = second.run(exit_when_done=True, timeout=30)
    assert (stats.total_published, stats.done) == (14, True)  # 7 plays an epoch, 2 epochs
    requests = requests_on(settings, codec, config.topics.requests)
    assert len({r.group_id for r in requests}) == len(requests) == 14
    for order in epoch_orders(requests, epochs=2):
        assert Counter(order) == {"q0": 1, "q1": 2, "q2": 1, "q3": 2, "q4": 1}
    # Each request names the pages its answer is read from (for the page reward).
    assert {(r.question_id, tuple(r.supporting_urls)) for r in requests} == {
        ("q0", ("q0/1",)), ("q1", ("q1/1", "q1/2")), ("q2", ("q2/1",)),
        ("q3", ("q3/1", "q3/2")), ("q4", ()),
    }  # fmt: skip

    changed = msgspec.structs.replace(config, plays_by_hops=[1, 3])  # 9 plays an epoch
    with pytest.raises(ValueError, match="was fed 7 plays an epoch but .* gives 9"):
        FeederService(settings, codec, changed)
    unsaid = msgspec.structs.replace(config, qa=str(write_qa(tmp_path / "plain.jsonl", 3)))
    with pytest.raises(ValueError, match=r"plays_by_hops=\[1, 2\] needs questions that say"):
        FeederService(settings, codec, unsaid)


def count_requests(settings, topic: str, isolation: str) -> int:
    return len(read_raw(settings, topic, isolation))


@pytest.mark.slow
def test_feeder_killed_mid_batch_leaves_no_duplicate_and_nothing_missing(
    settings, codec, feeder_config, worker_env
) -> None:
    config = feeder_config(10, epochs=3, outstanding=100, pause_before_commit_s=1.0)
    topics = config.topics
    victim = subprocess.Popen(
        worker_command("feeder_process.py", msgspec.json.encode(config).decode()),
        env=worker_env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert victim.stdout.readline().strip() == "serving"
        deadline = time.monotonic() + 60
        while True:  # until a batch committed and the next one is on the broker, uncommitted
            assert time.monotonic() < deadline, "the feeder never had a batch in flight"
            committed = count_requests(settings, topics.requests, "read_committed")
            if (
                committed
                and count_requests(settings, topics.requests, "read_uncommitted") > committed
            ):
                break
            time.sleep(0.05)
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
    before = requests_on(settings, codec, topics.requests)
    assert 0 < len(before) < 30
    assert count_requests(settings, topics.requests, "read_uncommitted") > len(before)

    survivor_config = msgspec.structs.replace(config, pause_before_commit_s=0.0)
    with FeederService(settings, codec, survivor_config) as survivor:
        assert survivor.published == len(before)  # the batch in flight was aborted
        stats = survivor.run(exit_when_done=True, timeout=30)
    assert stats.done and stats.published == 30 - len(before)
    requests = requests_on(settings, codec, topics.requests)
    assert len(requests) == 30
    assert_each_question_once_per_epoch(requests, epochs=3, questions=10)


def test_feeder_counts_a_dead_lettered_request_as_finished(settings, codec, feeder_config) -> None:
    config = feeder_config(4, outstanding=2)
    topics = config.topics
    with FeederService(settings, codec, config) as feeder:
        assert feeder.run(timeout=1.5).published == 2
        first, second = sorted(
            requests_on(settings, codec, topics.requests), key=lambda r: r.group_id
        )
        with EventProducer(settings, codec) as producer:
            for origin, request in ((topics.requests, first), ("another.topic", second)):
                letter = DeadLetter(
                    origin_topic=origin, origin_partition=0, origin_offset=0,
                    reason="sampling.max_turns must be in 1..1024", error_type="InvalidRequest",
                    key=request.group_id.encode(),
                )  # fmt: skip
                producer.send(topics.dead_letters, letter)
        # Only the letter from the requests topic frees a slot.
        assert feeder.run(timeout=2).published == 1
    assert len(requests_on(settings, codec, topics.requests)) == 3


def test_load_questions_with_a_bad_line_names_the_file_and_line(tmp_path: Path) -> None:
    qa = write_qa(tmp_path / "qa.jsonl", 2)
    qa.write_text(qa.read_text() + '{"id": "q9", "answers": ["x"]}\n')
    with pytest.raises(ValueError, match=rf"^{qa}:3: no 'question' string"):
        load_questions(qa)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="holds no questions"):
        load_questions(empty)


def feed_serve(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "ASEARCHER_HOME": str(home)}
    env.pop("ASEARCHER_BOOTSTRAP_SERVERS", None)
    return subprocess.run(
        [ASEARCHER, "feed", "serve", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_feed_serve_with_a_missing_qa_file_or_negative_epochs_is_a_one_line_error(
    tmp_path: Path,
) -> None:
    missing = feed_serve("--qa", str(tmp_path / "none.jsonl"), home=tmp_path)
    assert missing.returncode == 2
    assert (
        missing.stderr.strip() == f"asearcher: error: QA file {tmp_path}/none.jsonl does not exist"
    )

    qa = write_qa(tmp_path / "qa.jsonl", 3)
    negative = feed_serve("--qa", str(qa), "--epochs", "-1", home=tmp_path)
    assert negative.returncode == 2
    assert negative.stderr.strip() == (
        "asearcher: error: feeder config: epochs must be >= 0 (0: forever), got -1"
    )
