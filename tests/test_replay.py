"""Replay reads back exactly what was produced; export and re-drive preserve every event."""

from __future__ import annotations

import random
import time

import pytest
from typer.testing import CliRunner

from asearcher.cli.app import app
from asearcher.streams.codec import EventCodec
from asearcher.streams.producer import EventProducer
from asearcher.streams.replay import ReplayRange, export_jsonl, load_jsonl, read_range, redrive
from asearcher.streams.samples import episode


@pytest.fixture
def episodes_topic(settings, codec, make_topic):
    """Three sample episodes (every kind of a rollout) in one fresh 3-partition topic."""
    topic = make_topic(partitions=3)
    rng = random.Random(11)
    events = [out.event for q in range(3) for out in episode(rng, question_id=f"q{q}")]
    with EventProducer(settings, codec) as producer:
        for event in events:
            producer.send(topic, event)
    return topic, events


def replayed(settings, codec, topic, **bounds):
    return list(read_range(settings, codec, [topic], ReplayRange(**bounds)))


def test_replay_of_the_whole_topic_equals_what_was_produced(settings, codec, episodes_topic):
    topic, events = episodes_topic
    records = replayed(settings, codec, topic)
    assert sorted(r.event.event_id for r in records) == sorted(e.event_id for e in events)
    by_id = {e.event_id: e for e in events}
    assert all(r.event == by_id[r.event.event_id] for r in records)
    for partition in {r.partition for r in records}:
        offsets = [r.offset for r in records if r.partition == partition]
        assert offsets == sorted(offsets) == list(range(len(offsets)))


def test_replay_honours_offset_range_trajectory_and_kind(settings, codec, episodes_topic):
    topic, events = episodes_topic
    ranged = replayed(settings, codec, topic, from_offset=2, to_offset=5)
    assert ranged and all(2 <= r.offset < 5 for r in ranged)
    trajectory_id = events[1].trajectory_id
    one = replayed(settings, codec, topic, trajectory_id=trajectory_id)
    expected = [e for e in events if getattr(e, "trajectory_id", None) == trajectory_id]
    assert sorted(r.event.event_id for r in one) == sorted(e.event_id for e in expected)
    steps = replayed(settings, codec, topic, kinds=["GenerationStep"])
    assert len(steps) == 9 and {r.event.kind() for r in steps} == {"GenerationStep"}


def test_replay_by_time_returns_only_records_after_since(settings, codec, make_topic):
    topic = make_topic()
    rng = random.Random(5)
    first, second = episode(rng, "early"), episode(rng, "late")
    with EventProducer(settings, codec) as producer:
        for out in first:
            producer.send(topic, out.event)
        producer.flush()
        time.sleep(0.05)
        since_ms = int(time.time() * 1000)
        time.sleep(0.05)
        for out in second:
            producer.send(topic, out.event)
    records = replayed(settings, codec, topic, since_ms=since_ms)
    assert [r.event.event_id for r in records] == [o.event.event_id for o in second]
    until = replayed(settings, codec, topic, until_ms=since_ms)
    assert [r.event.event_id for r in until] == [o.event.event_id for o in first]


def test_export_to_jsonl_and_redrive_into_a_fresh_topic_preserve_every_event(
    settings, codec, episodes_topic, make_topic, tmp_path
):
    topic, events = episodes_topic
    url = (tmp_path / "export.jsonl.gz").as_uri()
    assert export_jsonl(read_range(settings, codec, [topic], ReplayRange()), url) == len(events)
    exported = list(load_jsonl(url))
    assert sorted(e.event.event_id for e in exported) == sorted(e.event_id for e in events)
    assert all(e.topic == topic for e in exported)

    target = make_topic(partitions=3)
    with EventProducer(settings, codec) as producer:
        count = redrive(read_range(settings, codec, [topic], ReplayRange()), producer, target)
    assert count == len(events)
    original = {r.event.event_id: r for r in replayed(settings, codec, topic)}
    copies = replayed(settings, codec, target)
    assert sorted(r.event.event_id for r in copies) == sorted(original)
    for copy in copies:
        assert copy.event == original[copy.event.event_id].event
        assert copy.key == original[copy.event.event_id].key


def test_replay_cli_prints_exports_and_redrives(
    settings, episodes_topic, make_topic, tmp_path, monkeypatch
):
    topic, events = episodes_topic
    monkeypatch.setenv("ASEARCHER_BOOTSTRAP_SERVERS", settings.bootstrap_servers)
    monkeypatch.setenv("ASEARCHER_HOME", str(tmp_path))
    runner = CliRunner()
    listing = runner.invoke(app, ["replay", topic, "--kind", "TrajectoryFinished"])
    assert listing.exit_code == 0, listing.output
    assert listing.output.count("TrajectoryFinished traj=") == 3

    trajectory_id = events[1].trajectory_id
    turns = runner.invoke(app, ["replay", topic, "-t", trajectory_id])
    assert turns.exit_code == 0
    assert "turn 0" in turns.output and "turn 2" in turns.output

    export = tmp_path / "cli.jsonl"
    exported = runner.invoke(app, ["replay", topic, "--export", export.as_uri()])
    assert exported.exit_code == 0
    assert len(export.read_text().splitlines()) == len(events)

    target = f"{topic}-copy"
    redriven = runner.invoke(app, ["replay", topic, "--to-topic", target, "--create"])
    assert redriven.exit_code == 0 and f"re-drove {len(events)} events" in redriven.output
    assert len(replayed(settings, EventCodec(), target)) == len(events)

    bad = runner.invoke(app, ["replay", topic, "--kind", "Nope"])
    assert bad.exit_code != 0 and "Nope" in str(bad.exception or bad.output)
