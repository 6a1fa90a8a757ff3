"""Requests that decode but cannot work are refused with one line, never played or crashed on."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import pytest

from asearcher.cli.app import main
from asearcher.producers.agents.agent import (
    MAX_GROUP_SIZE,
    MAX_SEED,
    MAX_TURNS_LIMIT,
    check_request,
)
from asearcher.producers.engines.base import ScriptedEngine
from asearcher.producers.rollout.service import RolloutConfig, RolloutService
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.events import DeadLetter, RolloutRequested, SamplingSettings
from tests.support.rollout import FAST_GROUP, events_of, fresh_topics


def request(question: str = "Who?", group_size: int = 1, **sampling) -> RolloutRequested:
    return RolloutRequested(
        question_id="q",
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        question=question,
        group_size=group_size,
        sampling=SamplingSettings(**sampling),
    )


BAD = {
    "temperature-nan": (request(temperature=float("nan")), "temperature"),
    "temperature-inf": (request(temperature=float("inf")), "temperature"),
    "temperature-negative": (request(temperature=-1.0), "temperature"),
    "temperature-tiny": (request(temperature=1e-300), "temperature"),
    "top-p-nan": (request(top_p=float("nan")), "top_p"),
    "top-p-zero": (request(top_p=0.0), "top_p"),
    "top-p-above-one": (request(top_p=1.5), "top_p"),
    "seed-u64-max": (request(seed=2**64 - 1), "seed"),
    "seed-torch-limit": (request(seed=2**63 - 1), "seed"),
    "seed-negative": (request(seed=-1), "seed"),
    "max-new-tokens-zero": (request(max_new_tokens_per_turn=0), "max_new_tokens_per_turn"),
    "max-new-tokens-negative": (request(max_new_tokens_per_turn=-5), "max_new_tokens_per_turn"),
    "max-new-tokens-huge": (request(max_new_tokens_per_turn=2**62), "max_new_tokens_per_turn"),
    "max-turns-zero": (request(max_turns=0), "max_turns"),
    "max-turns-negative": (request(max_turns=-1), "max_turns"),
    "max-turns-huge": (request(max_turns=2**40), "max_turns"),
    "group-size-zero": (request(group_size=0), "group_size"),
    "group-size-negative": (request(group_size=-3), "group_size"),
    "group-size-huge": (request(group_size=MAX_GROUP_SIZE + 1), "group_size"),
    "question-empty": (request(question=""), "question"),
    "question-blank": (request(question=" \n\t"), "question"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_check_request_bad_value_is_refused_with_one_line_naming_it(case: str) -> None:
    bad, field = BAD[case]
    with pytest.raises(ValueError) as refused:
        check_request(bad)
    reason = str(refused.value)
    assert field in reason and "\n" not in reason.strip() and "got" in reason


@pytest.mark.parametrize(
    "good",
    [
        request(temperature=0.0),  # greedy
        request(temperature=0.01, top_p=1e-3),
        request(temperature=100.0, top_p=1.0),
        request(seed=0),
        request(seed=MAX_SEED, group_size=MAX_GROUP_SIZE, max_turns=MAX_TURNS_LIMIT),
        request(max_new_tokens_per_turn=1, max_turns=1),
    ],
)
def test_check_request_values_at_the_limits_are_accepted(good: RolloutRequested) -> None:
    check_request(good)


def test_check_request_largest_seed_with_its_offsets_fits_a_torch_generator() -> None:
    torch = pytest.importorskip("torch")
    # The agent derives a seed per trajectory and turn (see AgentRun._generate).
    largest = MAX_SEED + 7919 * (MAX_GROUP_SIZE - 1) + (MAX_TURNS_LIMIT - 1)
    torch.Generator().manual_seed(largest)
    # What a request seed of 2**64 - 1 became for its second trajectory: the engine crashed.
    with pytest.raises((ValueError, RuntimeError, OverflowError)):
        torch.Generator().manual_seed(2**64 - 1 + 7919)


def qa_file(tmp_path: Path) -> Path:
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"id": "q1", "question": "Who?", "answers": ["me"]}\n')
    return qa


@pytest.mark.parametrize(
    "value",
    ["nan", "inf", "-inf", "-1", "0", "1e-300"],
)
def test_rollout_request_cli_bad_temperature_exits_2_with_one_line(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    args = ["rollout", "request", "--qa", str(qa_file(tmp_path)), "--limit", "1"]
    # No broker is given: the options must be refused before anything connects.
    monkeypatch.setattr(sys, "argv", ["asearcher", *args, f"--temperature={value}"])
    with pytest.raises(SystemExit) as exited:
        main()
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.count("\n") == 1 and err.startswith("asearcher: error: --temperature: "), err


@pytest.mark.parametrize(
    ("option", "value"),
    [("--group-size", "0"), ("--group-size", "5000"), ("--max-turns", "0"),
     ("--max-new-tokens", "0"), ("--max-new-tokens", "99999999999")],
)  # fmt: skip
def test_rollout_request_cli_bad_option_names_the_option(
    option: str, value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    args = ["rollout", "request", "--qa", str(qa_file(tmp_path)), "--limit", "1"]
    monkeypatch.setattr(sys, "argv", ["asearcher", *args, option, value])
    with pytest.raises(SystemExit) as exited:
        main()
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.startswith(f"asearcher: error: {option}: "), err


def rollout(settings, codec, topics, group: str) -> RolloutService:
    engine = ScriptedEngine(lambda prompt: "<think>easy</think><answer>x</answer>")
    config = RolloutConfig(topics=topics, group_id=group)
    return RolloutService(settings, codec, engine, config, **FAST_GROUP)


def dead_letters_of(settings, codec, topic: str) -> list[DeadLetter]:
    return [
        e
        for e in events_of(settings, codec, "dead.letters")
        if isinstance(e, DeadLetter) and e.origin_topic == topic
    ]


def test_rollout_service_nan_temperature_and_u64_seed_are_dead_lettered_and_it_goes_on(
    settings, codec, make_topic
) -> None:
    topics, group = fresh_topics(make_topic), f"rollout-{uuid.uuid4().hex[:6]}"
    nan = request(temperature=float("nan"))
    huge_seed = request(seed=2**64 - 1)
    good = request()
    with EventProducer(settings, codec) as producer:
        for event in (nan, huge_seed, good):
            producer.send(topics.requests, event, key="same-partition")
    first = rollout(settings, codec, topics, group)
    stats = first.run(max_groups=1, timeout=60)
    first.close()
    assert stats.groups == 1
    [finished] = events_of(settings, codec, topics.trajectories)
    assert finished.group_id == good.group_id
    reasons = sorted(letter.reason for letter in dead_letters_of(settings, codec, topics.requests))
    assert len(reasons) == 2 and "sampling.seed" in reasons[0] and "temperature" in reasons[1]

    time.sleep(1)
    again = rollout(settings, codec, topics, group)  # a restart in the same group
    restarted = again.run(timeout=5)
    again.close()
    assert restarted.groups == 0
    assert len(dead_letters_of(settings, codec, topics.requests)) == 2
    assert len(events_of(settings, codec, topics.trajectories)) == 1
