"""Every event kind survives Kafka unchanged, and the published JSON Schema describes it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import msgspec
import pytest

from asearcher.streams.io.consumer import EventConsumer
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.codec import CONTENT_TYPES, EventCodec, EventDecodeError, header_value
from asearcher.streams.wire.events import (
    EVENT_TYPES,
    ClaimCheck,
    DeadLetter,
    EvalResult,
    Event,
    FeederProgress,
    GateVerdict,
    GenerationStep,
    QuestionSynthesized,
    RequestPlayed,
    RolloutRequested,
    SamplingSettings,
    ServiceStatus,
    StepStats,
    SynthEdit,
    SynthesisCandidate,
    SynthesisRequested,
    SynthFact,
    ToolCallRequested,
    ToolResultReady,
    TrainerStepFinished,
    TrajectoriesDropped,
    WeightsPublished,
)
from asearcher.streams.wire.schema import export_schemas
from tests.conftest import read_raw
from tests.support.samples import generation_step, trajectory


def one_of_each() -> list[Event]:
    rng = random.Random(7)
    return [
        RolloutRequested(
            question_id="q1",
            group_id="g1",
            question="Who founded Avalon?",
            gold_answers=["J. Doe", "Jane Doe"],
            sampling=SamplingSettings(temperature=0.7, max_turns=64, seed=3),
            group_size=16,
            purpose="eval",
            metadata={"benchmark": "demo"},
        ),
        generation_step(rng, tokens=64, turn=2, trajectory_id="t1", text="<search>x</search>"),
        ToolCallRequested(call_id="c1", trajectory_id="t1", tool="browse", arguments={"url": "u"}),
        ToolResultReady(call_id="c1", trajectory_id="t1", tool="browse", error="timeout after 30s"),
        trajectory(rng, tokens=128, answer="J. Doe", reward=0.5, reward_parts={"f1": 0.5}),
        WeightsPublished(version=3, uri="file:///w/3", sha256="ab" * 32, step=12, metrics={"l": 1}),
        TrainerStepFinished(
            version=4,
            step=4,
            groups=8,
            stats=StepStats(reward_mean=0.5, loss=0.25, samples=16, seconds=1.5),
            dropped_ids=["t1"],
            staleness_counts=[3, 1],
        ),
        TrajectoriesDropped(version=4, dropped_ids=["t2", "t3"], dropped_flat_groups=1),
        ServiceStatus(
            service="trainer",
            instance="run-trainer",
            state="waiting",
            waiting_for="no step for 30s",
            counters={"held": 4.0},
        ),
        FeederProgress(run="r", epoch=1, next_index=3, published=13, epochs=2, questions=10),
        RequestPlayed(
            consumer_group="c", topic="rollout.requests", partition=1, offset=7, request_id="g1"
        ),
        EvalResult(
            eval_id="e",
            benchmark="hotpot",
            policy_version=3,
            questions=2,
            samples_per_question=4,
            averages={"f1": 0.5},
            best_of_k={"f1": 1.0},
        ),
        SynthesisRequested(seed_id="s1", question="Who wrote X?", answer="Ann"),
        SynthesisCandidate(
            seed_id="s1",
            index=1,
            question="Who wrote the book published by Y?",
            answer="Ann",
            facts=[SynthFact(statement="Y published X.", url="https://w/Y")],
            edits=[SynthEdit(action="inject", question="Who wrote the book published by Y?")],
            verdicts=[GateVerdict(gate="difficulty", passed=True, answers=["Bo"], correct=0)],
            accepted=True,
            plan='{"chain": [1, 2]}',
        ),  # fmt: skip
        QuestionSynthesized(
            seed_id="s1",
            accepted=False,
            question="q",
            answer="a",
            reasons=["too easy"],
            role_failures={"writer.fuzz": 2},
            supporting_urls=["https://w/Y"],
        ),  # fmt: skip
        DeadLetter(
            origin_topic="x",
            origin_partition=1,
            origin_offset=5,
            reason="bad",
            error_type="E",
            key=b"k",
            payload=b"\xff\x00",
            headers=[("h", b"\x01")],
        ),  # fmt: skip
    ]


def test_every_event_kind_covered_by_round_trip_sample() -> None:
    kinds = {type(e) for e in one_of_each()}
    assert kinds | {ClaimCheck} == set(EVENT_TYPES)


@pytest.mark.parametrize("wire_format", ["msgpack", "json"])
def test_every_event_kind_round_trips_through_kafka_unchanged(
    settings, make_topic, claims, wire_format
) -> None:
    topic = make_topic(partitions=3)
    sent = one_of_each()
    codec = EventCodec(claims, wire_format=wire_format)
    with EventProducer(settings, codec) as producer:
        for event in sent:
            producer.send(topic, event, key="same-key")  # one partition keeps the order
    received = []
    with EventConsumer(settings, f"g-{topic}", [topic], codec) as consumer:
        stats = consumer.run(lambda r: received.append(r.event), max_messages=len(sent), timeout=30)
    assert stats.handled == len(sent)
    assert received == sent


def test_records_carry_kind_version_and_content_type_headers(settings, make_topic, codec) -> None:
    topic = make_topic()
    with EventProducer(settings, codec) as producer:
        producer.send(topic, one_of_each()[0])
    [message] = read_raw(settings, topic)
    assert header_value(message.headers(), "kind") == "RolloutRequested"
    assert header_value(message.headers(), "schema-version") == "1"
    assert header_value(message.headers(), "content-type") == "application/msgpack"
    assert message.key() == b"g1"  # rollout requests are keyed by group id


def _json_view(value: bytes, headers) -> dict:
    """What a third-party client sees: the record as plain JSON data (bytes as base64)."""
    if header_value(headers, "content-type") == "application/json":
        return json.loads(value)
    return json.loads(msgspec.json.encode(msgspec.msgpack.decode(value)))


def test_exported_json_schema_validates_real_events(settings, make_topic, codec, tmp_path) -> None:
    export_schemas(tmp_path)
    topic = make_topic()
    with EventProducer(settings, codec) as producer:
        for event in one_of_each():
            producer.send(topic, event)
    messages = read_raw(settings, topic)
    assert len(messages) == len(one_of_each())
    for message in messages:
        kind = header_value(message.headers(), "kind")
        schema = json.loads((tmp_path / f"{kind}.schema.json").read_text())
        jsonschema.validate(_json_view(message.value(), message.headers()), schema)


def test_exported_json_schema_rejects_an_event_missing_a_required_field(tmp_path: Path) -> None:
    export_schemas(tmp_path)
    schema = json.loads((tmp_path / "GenerationStep.schema.json").read_text())
    value, _ = EventCodec(wire_format="json").encode(generation_step(random.Random(1), tokens=3))
    event = json.loads(value)
    del event["token_ids"]
    with pytest.raises(jsonschema.ValidationError, match="token_ids"):
        jsonschema.validate(event, schema)
    manifest = json.loads((tmp_path / "topics.json").read_text())
    assert {t["name"]: t["kinds"] for t in manifest["topics"]}["tool.calls"] == [
        "ToolCallRequested"
    ]


def test_decode_rejects_a_newer_schema_version_and_the_wrong_kind() -> None:
    codec = EventCodec()
    step = generation_step(random.Random(2), tokens=4)
    value, headers = codec.encode(msgspec.structs.replace(step, schema_version=99))
    with pytest.raises(EventDecodeError, match="schema version 99"):
        codec.decode(value, headers, (GenerationStep,))
    value, headers = codec.encode(step)
    with pytest.raises(EventDecodeError, match="ToolCallRequested"):
        codec.decode(value, headers, (ToolCallRequested,))


def test_json_written_by_hand_is_accepted_when_its_content_type_says_json() -> None:
    codec = EventCodec()
    value = b'{"kind":"ToolCallRequested","call_id":"c","trajectory_id":"t","tool":"search"}'
    event = codec.decode(value, [("content-type", b"application/json")], (ToolCallRequested,))
    assert event == ToolCallRequested(
        call_id="c", trajectory_id="t", tool="search", event_id=event.event_id,
        created_at=event.created_at,
    )  # fmt: skip
    assert event.schema_version == 1


def test_each_event_gets_its_own_creation_time_and_id() -> None:
    first, second = (ToolCallRequested(call_id="c", trajectory_id="t", tool="s") for _ in "ab")
    assert first.event_id != second.event_id
    assert first.created_at <= second.created_at


@pytest.mark.parametrize("wire_format", ["json", "msgpack"])
def test_a_version_1_trainer_step_decodes_as_version_2_with_its_figures_moved(
    wire_format: str,
) -> None:
    old = {"kind": "TrainerStepFinished", "schema_version": 1, "version": 3, "step": 3,
           "samples": 16, "reward_mean": 0.5, "loss": 0.25, "step_s": 2.0, "tokens": 800,
           "tokens_per_s": 400.0, "trained_ids": ["t1"]}  # fmt: skip
    codec = EventCodec(wire_format=wire_format)
    value = msgspec.json.encode(old) if wire_format == "json" else msgspec.msgpack.encode(old)
    content_type = CONTENT_TYPES[wire_format].encode()
    event = codec.decode(value, [("content-type", content_type)], (TrainerStepFinished,))
    expected = StepStats(samples=16, tokens=800, reward_mean=0.5, loss=0.25, seconds=2.0)
    assert (event.version, event.trained_ids, event.stats) == (3, ["t1"], expected)
    assert event.stats.tokens_per_s == 400.0
    # Written again (replay --export, --to-topic), it is a version 2 record with its figures.
    again = codec.decode(*codec.encode(event), (TrainerStepFinished,))
    assert (again.schema_version, again.stats) == (2, expected)
    assert TrainerStepFinished(version=4, step=4).schema_version == 2
