"""The evaluation processor, run as `asearcher eval process` against the test broker.

Each test starts the real CLI command in a subprocess with a config of private topics and its
own faust app id (so its consumer group and changelog topics are fresh), sends events with the
project's producer, and reads what the processor wrote back with read_committed consumers: the
processor writes in transactions (faust's exactly-once), so only committed output counts.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import msgspec
import pytest
from confluent_kafka.admin import AdminClient

from asearcher.consumers.evaluation.benchmarks import read_world_benchmark
from asearcher.consumers.evaluation.eval_gathering import EvalTally, QuestionSamples
from asearcher.consumers.evaluation.eval_processor import EvalProcessorConfig
from asearcher.consumers.evaluation.eval_scores import aggregate, sample_of
from asearcher.consumers.world.world import generate_world, write_world
from asearcher.streams.cluster.admin import end_offsets
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import (
    DeadLetter,
    EvalResult,
    RolloutRequested,
    TrajectoryFinished,
    WeightsPublished,
    new_id,
)
from asearcher.streams.wire.topics import (
    DEAD_LETTERS,
    EVAL_REQUESTS,
    EVAL_RESULTS,
    EVAL_TRAJECTORIES,
    WEIGHTS,
    topic_spec,
)
from tests.conftest import read_raw
from tests.support.processors import Processor, processor, wait_for
from tests.support.rollout import events_of, group_offsets

T = TypeVar("T")

CONTEXT_VERSION = 5  # the version of the masked (context) tokens of crafted trajectories
POLICY_VERSION = 7  # the version of the tokens the policy generated


def poll(found: Callable[[], T], timeout_s: float) -> T:
    """`found()` once it is truthy, or its last value after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    value = found()
    while not value and time.monotonic() < deadline:
        time.sleep(0.5)
        value = found()
    return value


def config_with(make_topic: Callable[..., str], **fields) -> EvalProcessorConfig:
    """A config on private topics with a fresh app id."""
    return EvalProcessorConfig(
        app_id=f"eval-test-{uuid.uuid4().hex[:10]}",
        trajectories_topic=make_topic(like=EVAL_TRAJECTORIES),
        results_topic=make_topic(like=EVAL_RESULTS),
        requests_topic=make_topic(like=EVAL_REQUESTS),
        weights_topic=make_topic(like=WEIGHTS),
        **fields,
    )


def results_in(settings: KafkaSettings, codec: EventCodec, topic: str) -> list[EvalResult]:
    return [e for e in events_of(settings, codec, topic) if isinstance(e, EvalResult)]


def results_for(
    settings: KafkaSettings, codec: EventCodec, topic: str, eval_id: str
) -> list[EvalResult]:
    return [r for r in results_in(settings, codec, topic) if r.eval_id == eval_id]


# ---------------------------------------------------------------- crafted trajectories

Scorer = Callable[[int, int], dict[str, float]]


def trajectory(
    eval_id: str, benchmark: str, questions: int, question: int, sample: int, k: int,
    parts: dict[str, float], *, model: str = "run-x", purpose: str = "eval",
) -> TrajectoryFinished:  # fmt: skip
    """Sample `sample` of question `question`: 4 context tokens, then 2 + sample generated ones;
    `sample` + 1 searches, question % 2 pages browsed, sample + 2 turns."""
    generated = 2 + sample
    qid = f"{benchmark}-q{question}"
    return TrajectoryFinished(
        trajectory_id=new_id(), group_id=f"{eval_id}/{benchmark}/{qid}", question_id=qid,
        purpose=purpose,  # type: ignore[arg-type]
        token_ids=list(range(4 + generated)), logprobs=[-0.5] * (4 + generated),
        loss_mask=[0] * 4 + [1] * generated,
        token_versions=[CONTEXT_VERSION] * 4 + [POLICY_VERSION] * generated,
        prompt_length=4, reward=parts.get("f1", 0.0), reward_parts=parts, num_turns=sample + 2,
        finish_reason="answer", group_size=k, sample_index=sample,
        tool_calls={"search": sample + 1, "browse": question % 2},
        metadata={"eval_id": eval_id, "benchmark": benchmark, "questions": str(questions),
                  "evaluator": "", "model": model},
    )  # fmt: skip


def evaluation(
    eval_id: str, benchmark: str, questions: int, k: int, scorer: Scorer
) -> list[TrajectoryFinished]:
    """Every sample of one evaluation of one benchmark."""
    return [
        trajectory(eval_id, benchmark, questions, q, s, k, scorer(q, s))
        for q in range(questions)
        for s in range(k)
    ]


def alpha_scores(q: int, s: int) -> dict[str, float]:
    """f1 cycles through 0 .. 1 in quarters; em is 1 exactly where f1 is 1: for k=3 and five
    questions that is (q1, s1), (q3, s0), (q4, s2): Avg@3 em 3/15, Pass@3 em 3/5."""
    f1 = ((3 * q + s) % 5) / 4
    return {"f1": f1, "em": float(f1 == 1.0), "cem": float(f1 >= 0.5),
            "format": 0.0 if (q, s) == (4, 1) else 1.0}  # fmt: skip


def beta_scores(q: int, s: int) -> dict[str, float]:
    """Only the last sample of even questions is right (Pass@k counts it, Avg@k dilutes it)."""
    right = q % 2 == 0 and s == 2
    return {"f1": 1.0 if right else 0.125 * s, "em": float(right), "cem": float(right),
            "format": 1.0}  # fmt: skip


def send(
    settings: KafkaSettings, codec: EventCodec, topic: str, trajectories: list[TrajectoryFinished]
) -> None:
    """Trajectories keyed by their evaluation, as the evaluators key them."""
    with EventProducer(settings, codec) as producer:
        for t in trajectories:
            producer.send(topic, t, key=t.eval_key)


def expected(trajectories: list[TrajectoryFinished], k: int) -> tuple[dict, dict]:
    return aggregate([sample_of(t) for t in trajectories], k)


def barrier(
    settings: KafkaSettings, codec: EventCodec, topic: str, key: str, running: Processor,
    results_topic: str,
) -> None:  # fmt: skip
    """Send a one-sample evaluation on `key`'s partition and wait for its result: everything
    sent on that partition before it has been handled by then."""
    marker = f"barrier-{uuid.uuid4().hex[:8]}"
    [sample] = evaluation(marker, "marker", 1, 1, lambda q, s: {"f1": 1.0})
    with EventProducer(settings, codec) as producer:
        producer.send(topic, sample, key=key)
    wait_for(lambda: results_for(settings, codec, results_topic, marker), marker, running)


# ---------------------------------------------------------------- 1. results


@pytest.mark.slow
def test_one_result_per_benchmark_with_the_scores_of_all_its_samples(
    settings, codec, claims, make_topic, tmp_path: Path
) -> None:
    config = config_with(make_topic, model="run-x")
    eval_id = f"ev-{uuid.uuid4().hex[:8]}"
    alpha = evaluation(eval_id, "alpha", 5, 3, alpha_scores)
    beta = evaluation(eval_id, "beta", 5, 3, beta_scores)
    # Another run's evaluation on the same topic is its own processor's business.
    foreign_id = f"ev-{uuid.uuid4().hex[:8]}"
    foreign = [msgspec.structs.replace(t, metadata={**t.metadata, "model": "run-y"})
               for t in evaluation(foreign_id, "alpha", 2, 1, alpha_scores)]  # fmt: skip
    mixed = alpha + beta + foreign
    random.Random(3).shuffle(mixed)  # the order of arrival must not matter
    with processor(settings, claims, config, tmp_path) as running:
        send(settings, codec, config.trajectories_topic, mixed)
        wait_for(
            lambda: len(results_for(settings, codec, config.results_topic, eval_id)) >= 2,
            "both results", running,
        )  # fmt: skip
        # A sample delivered again after its evaluation finished changes nothing.
        send(settings, codec, config.trajectories_topic, [alpha[0], beta[-1]])
        for key in {alpha[0].eval_key, beta[0].eval_key}:
            barrier(settings, codec, config.trajectories_topic, key, running,
                    config.results_topic)  # fmt: skip
        assert not running.crashes()
    results = results_for(settings, codec, config.results_topic, eval_id)
    assert sorted(r.benchmark for r in results) == ["alpha", "beta"]  # one each
    assert results_for(settings, codec, config.results_topic, foreign_id) == []
    by_benchmark = {r.benchmark: r for r in results}
    for name, samples in (("alpha", alpha), ("beta", beta)):
        result = by_benchmark[name]
        averages, best = expected(samples, 3)
        assert result.averages == pytest.approx(averages), name
        assert result.best_of_k == pytest.approx(best), name
        assert (result.questions, result.samples_per_question) == (5, 3)
        assert result.policy_version == POLICY_VERSION  # of the generated tokens only
        assert result.model == "run-x"
        assert result.eval_key == f"{eval_id}/{name}"
    # By hand (see alpha_scores and beta_scores, and `trajectory` for the counts).
    alpha_result, beta_result = by_benchmark["alpha"], by_benchmark["beta"]
    assert alpha_result.averages["em"] == pytest.approx(3 / 15)
    assert alpha_result.best_of_k["em"] == pytest.approx(3 / 5)
    assert alpha_result.averages["format"] == pytest.approx(14 / 15)
    assert alpha_result.averages["searches"] == pytest.approx(2.0)  # 1, 2, 3 per question
    assert alpha_result.averages["accesses"] == pytest.approx(2 / 5)  # questions 1 and 3
    assert alpha_result.averages["gen_len"] == pytest.approx(3.0)  # 2, 3, 4 per question
    assert alpha_result.averages["turns"] == pytest.approx(3.0)
    assert beta_result.best_of_k["em"] == pytest.approx(3 / 5)  # questions 0, 2, 4
    assert beta_result.averages["em"] == pytest.approx(3 / 15)
    # f1 per question: 0, 0.125, 1 (even) or 0, 0.125, 0.25 (odd).
    assert beta_result.averages["f1"] == pytest.approx((3 * 1.125 + 2 * 0.375) / 15)
    assert beta_result.best_of_k["f1"] == pytest.approx((3 * 1.0 + 2 * 0.25) / 5)


# ---------------------------------------------------------------- 2. SIGKILL


def topic_exists(settings: KafkaSettings, topic: str) -> bool:
    # Listing all topics creates none (naming one could, where auto-creation is on).
    return topic in AdminClient(settings.client()).list_topics(timeout=10).topics


def json_text(raw: bytes) -> str:
    """A changelog key or value: faust writes table strings as JSON strings."""
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return raw.decode()
    return value if isinstance(value, str) else raw.decode()


def committed_entries(settings: KafkaSettings, changelog: str) -> dict[str, str]:
    """The latest committed value (JSON text) of each key of a table's changelog topic."""
    if not topic_exists(settings, changelog):
        return {}
    entries: dict[str, str] = {}
    for message in read_raw(settings, changelog):
        if message.value() is not None:
            entries[json_text(message.key())] = json_text(message.value())
    return entries


def committed_tally(settings: KafkaSettings, app_id: str, key: str) -> EvalTally | None:
    """The latest committed tally of the evaluation `key`."""
    text = committed_entries(settings, f"{app_id}-tallies-changelog").get(key)
    return None if text is None else msgspec.json.decode(text, type=EvalTally)


def progress(settings: KafkaSettings, config: EvalProcessorConfig, key: str) -> str:
    """Where a processor stands on evaluation `key`: its committed tally, and per partition of
    its input its group's committed offset against the end (so a stall shows whether it did not
    read on, lost a sample, or did not publish)."""
    group = group_offsets(settings, config.app_id, config.trajectories_topic)
    # The test topics are laid out like eval.trajectories.
    partitions = topic_spec(EVAL_TRAJECTORIES).partitions
    ends = end_offsets(settings, config.trajectories_topic, partitions)
    offsets = ", ".join(f"{p}: {group.get(p)}/{ends[p][1]}" for p in sorted(ends))
    return f"tally {committed_tally(settings, config.app_id, key)}; committed/end {offsets}"


def committed_ids(settings: KafkaSettings, app_id: str, key: str) -> list[str]:
    """The trajectory ids every committed question entry of evaluation `key` holds (samples or
    counted ids); the barrier's own marker evaluation is another key."""
    ids: list[str] = []
    entries = committed_entries(settings, f"{app_id}-questions-changelog")
    for question_key, text in entries.items():
        if msgspec.json.decode(question_key)[0] != key:
            continue
        question = msgspec.json.decode(text, type=QuestionSamples)
        ids += question.counted + [s.trajectory_id for s in question.samples]
    return ids


@pytest.mark.slow
def test_a_processor_killed_mid_evaluation_resumes_and_counts_each_sample_once(
    settings, codec, claims, make_topic, tmp_path: Path
) -> None:
    config = config_with(make_topic)
    eval_id = f"ev-{uuid.uuid4().hex[:8]}"
    samples = evaluation(eval_id, "alpha", 4, 3, alpha_scores)  # 12 samples
    key = samples[0].eval_key
    early, late, rest = samples[:6], samples[6:8], samples[8:]
    running = Processor(settings, claims, config, tmp_path)
    try:
        running.start()
        send(settings, codec, config.trajectories_topic, early)
        state = wait_for(
            lambda: committed_tally(settings, config.app_id, key), "a committed tally", running
        )
        assert 0 < state.samples <= len(early) and not state.done
        # Two more, and the kill right after: they may be in an open transaction or not read yet.
        send(settings, codec, config.trajectories_topic, late)
        running.kill()
        assert not results_for(settings, codec, config.results_topic, eval_id)
        running.start()
        # Some already-sent samples again (before the evaluation could be complete), then the rest.
        send(settings, codec, config.trajectories_topic, [early[0], early[4], late[1]])
        send(settings, codec, config.trajectories_topic, rest)
        wait_for(lambda: results_for(settings, codec, config.results_topic, eval_id), "the result",
                 running, describe=lambda: progress(settings, config, key))  # fmt: skip
        send(settings, codec, config.trajectories_topic, [rest[-1]])
        barrier(settings, codec, config.trajectories_topic, key, running,
                config.results_topic)  # fmt: skip
    finally:
        running.kill()
    [result] = results_for(settings, codec, config.results_topic, eval_id)
    averages, best = expected(samples, 3)
    assert result.averages == pytest.approx(averages)
    assert result.best_of_k == pytest.approx(best)
    assert (result.questions, result.samples_per_question) == (4, 3)

    # (Polled: a read of the changelog on a loaded machine may end before its last record.)
    def done_state() -> EvalTally | None:
        state = committed_tally(settings, config.app_id, key)
        return state if state is not None and state.done else None

    final = poll(done_state, 60)
    assert final is not None, committed_tally(settings, config.app_id, key)
    assert (final.samples, final.questions_done) == (12, 4)
    assert sorted(committed_ids(settings, config.app_id, key)) == sorted(
        t.trajectory_id for t in samples
    )
    # What a stall would have printed: the tally and the group's offsets against the ends.
    described = progress(settings, config, key)
    assert "samples=12" in described and "committed/end" in described, described


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_processor_killed_after_making_a_result_publishes_it_once(
    settings, codec, claims, make_topic, tmp_path: Path
) -> None:
    # The result waits for the commit of the sample that completed it: killed in between, the
    # processor publishes nothing; restarted, it makes the result again, and only then is it out.
    config = config_with(make_topic, pause_after_result_s=30.0)
    eval_id = f"ev-{uuid.uuid4().hex[:8]}"
    samples = evaluation(eval_id, "alpha", 2, 2, alpha_scores)
    running = Processor(settings, claims, config, tmp_path)
    try:
        running.start()
        send(settings, codec, config.trajectories_topic, samples)
        poll(lambda: eval_id in running.log.read_text(errors="replace"), 120)
        running.kill()  # the result is made, its sample's offset not committed
        assert not results_for(settings, codec, config.results_topic, eval_id)
        running.start()
        wait_for(lambda: results_for(settings, codec, config.results_topic, eval_id),
                 "the result", running, timeout_s=240)  # fmt: skip
        barrier(settings, codec, config.trajectories_topic, samples[0].eval_key, running,
                config.results_topic)  # fmt: skip
    finally:
        running.kill()
    [result] = results_for(settings, codec, config.results_topic, eval_id)
    assert (result.questions, result.samples_per_question) == (2, 2)


# ---------------------------------------------------------------- 3. bad input


def letters_from(settings: KafkaSettings, codec: EventCodec, topic: str) -> list[DeadLetter]:
    return [
        e for e in events_of(settings, codec, DEAD_LETTERS)
        if isinstance(e, DeadLetter) and e.origin_topic == topic
    ]  # fmt: skip


@pytest.mark.slow
def test_bad_records_go_to_the_dead_letter_topic_and_the_processor_goes_on(
    settings, codec, claims, make_topic, tmp_path: Path
) -> None:
    config = config_with(make_topic)
    topic = config.trajectories_topic
    eval_id = f"ev-{uuid.uuid4().hex[:8]}"
    good = evaluation(eval_id, "alpha", 2, 2, alpha_scores)
    key = good[0].eval_key
    training = trajectory(eval_id, "alpha", 2, 0, 0, 2, {"f1": 1.0}, purpose="train")
    bare = msgspec.structs.replace(good[0], trajectory_id=new_id(), metadata={})
    not_a_number = trajectory(eval_id, "alpha", 2, 1, 0, 2, {"f1": float("nan"), "em": 0.0})
    too_good = trajectory(eval_id, "alpha", 2, 1, 1, 2, {"f1": 1.5})
    no_count = msgspec.structs.replace(
        good[1], trajectory_id=new_id(), metadata={**good[1].metadata, "questions": "two"}
    )
    with processor(settings, claims, config, tmp_path) as running:
        with EventProducer(settings, codec) as producer:
            producer.send_raw(topic, b"\xc1\x00 not an event", key=key.encode())
            for bad in (training, bare, not_a_number, too_good, no_count):
                producer.send(topic, bad, key=key)
            for t in good:
                producer.send(topic, t, key=key)
        wait_for(lambda: results_for(settings, codec, config.results_topic, eval_id),
                 "the result after the bad records", running)  # fmt: skip
        # The letters were sent before the result, in the same or earlier transactions.
        letters = poll(lambda: letters_from(settings, codec, topic), 5.0)
        running.check_alive()
        assert not running.crashes()  # each bad record was handled, none crashed the agent
    assert [letter.origin_offset for letter in letters] == [0, 1, 2, 3, 4, 5]
    assert [letter.error_type for letter in letters] == (
        ["EventDecodeError"] + ["InvalidEvalTrajectory"] * 5
    )
    assert letters[0].payload == b"\xc1\x00 not an event" and letters[0].key == key.encode()
    reasons = [letter.reason for letter in letters]
    assert "purpose 'train'" in reasons[1]
    assert "eval_id" in reasons[2] and "benchmark" in reasons[2]
    assert "nan" in reasons[3] and "f1" in reasons[3]
    assert "1.5" in reasons[4]
    assert "'two'" in reasons[5]
    decoded = codec.decode(letters[3].payload, letters[3].headers, (TrajectoryFinished,))
    assert decoded.trajectory_id == not_a_number.trajectory_id  # kept whole
    # The bad samples were not counted: the result is that of the good ones alone.
    [result] = results_for(settings, codec, config.results_topic, eval_id)
    averages, best = expected(good, 2)
    assert result.averages == pytest.approx(averages)
    assert result.best_of_k == pytest.approx(best)


@pytest.mark.slow
def test_a_question_count_of_unicode_digits_is_dead_lettered_not_a_crash(
    settings, codec, claims, make_topic, tmp_path: Path
) -> None:
    # "²".isdigit() is True but int("²") raises ValueError (eval_processor._reason_to_refuse).
    config = config_with(make_topic)
    topic = config.trajectories_topic
    eval_id = f"ev-{uuid.uuid4().hex[:8]}"
    good = evaluation(eval_id, "alpha", 1, 1, alpha_scores)
    odd = msgspec.structs.replace(
        good[0], trajectory_id=new_id(), metadata={**good[0].metadata, "questions": "²"}
    )
    with processor(settings, claims, config, tmp_path) as running:
        send(settings, codec, topic, [odd, *good])
        # The good sample comes after the odd one on the same partition.
        wait_for(lambda: results_for(settings, codec, config.results_topic, eval_id),
                 "the result after the odd record", running)  # fmt: skip
        letters = poll(lambda: letters_from(settings, codec, topic), 5.0)
        crashes = running.crashes()
    assert len(results_for(settings, codec, config.results_topic, eval_id)) == 1
    # Set aside with its reason, not lost to a crash of the agent (which faust restarts).
    assert [letter.origin_offset for letter in letters] == [0], crashes
    assert letters[0].error_type == "InvalidEvalTrajectory"


# ---------------------------------------------------------------- 4. continuous evaluation


def published(model: str, version: int) -> WeightsPublished:
    return WeightsPublished(model=model, version=version, uri=f"file:///w/{model}/v{version}",
                            sha256="0" * 64, step=version)  # fmt: skip


@pytest.mark.slow
def test_every_nth_version_of_the_run_is_evaluated_once(
    settings, codec, claims, make_topic, tmp_path: Path
) -> None:
    world_dir = tmp_path / "world"
    write_world(generate_world(seed=4, entities=40, questions=20), world_dir)
    questions = read_world_benchmark(world_dir)[:3]
    model = f"m-{uuid.uuid4().hex[:8]}"
    config = config_with(make_topic, model=model, every_versions=2, world_dir=str(world_dir),
                         limit=3, samples=2)  # fmt: skip
    announcements = [published(model, v) for v in (1, 2, 3, 4, 2)]
    announcements.insert(2, published("another-run", 2))  # not this run's model
    announcements.append(published(model, 6))  # the last: once its requests are out, all are

    def requests() -> list[RolloutRequested]:
        events = events_of(settings, codec, config.requests_topic)
        return [e for e in events if isinstance(e, RolloutRequested)]

    with processor(settings, claims, config, tmp_path) as running:
        with EventProducer(settings, codec) as producer:
            for announcement in announcements:
                producer.send(config.weights_topic, announcement)
        # Announcements are handled in order: once v6 is requested, all before it were.
        wait_for(lambda: sum(r.metadata["eval_id"] == f"{model}-v6" for r in requests()) >= 3,
                 "the requests for v6", running)  # fmt: skip
        found = requests()
        crashes = running.crashes()
    by_eval: dict[str, list[RolloutRequested]] = {}
    for request in found:
        by_eval.setdefault(request.metadata["eval_id"], []).append(request)
    # Requested once each: v2's second announcement asks for nothing.
    counts = {eval_id: len(mine) for eval_id, mine in by_eval.items()}
    assert counts == {f"{model}-v2": 3, f"{model}-v4": 3, f"{model}-v6": 3}, crashes
    for version in (2, 4, 6):
        eval_id = f"{model}-v{version}"
        mine = by_eval[eval_id]
        assert sorted(r.question_id for r in mine) == sorted(q.id for q in questions)
        metadata = {"eval_id": eval_id, "benchmark": "world", "questions": "3", "evaluator": "",
                    "model": model, "scoring": "reference"}  # fmt: skip
        for request in mine:
            question = next(q for q in questions if q.id == request.question_id)
            assert request.question == question.question
            assert request.gold_answers == question.answers
            assert request.policy_version == version  # pinned
            assert request.purpose == "eval" and request.group_size == 2
            assert request.group_id == f"{eval_id}/world/{question.id}"
            assert request.metadata == metadata
            assert request.sampling.temperature == pytest.approx(0.6)
