"""Rewards: ASearcher's F1/EM/CEM by hand-computed cases, the format gate, and the LLM judge
against a real local HTTP server."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgspec
import pytest

from asearcher.consumers.reward import (
    JudgeConfig,
    JudgeError,
    RewardConfig,
    cover_exact_match,
    exact_match,
    extract_answer,
    f1_score,
    format_ok,
    judge,
    parse_verdict,
    score_trajectory,
    score_trajectory_with_judge,
)

# (prediction, golds, F1, EM, CEM), each computed by hand.
CASES = [
    ("Barack Obama", ["barack obama"], 1.0, 1.0, 1.0),  # same after lowercasing
    # F1 turns '.' into a space ("u s a" vs "usa": nothing shared); EM and CEM delete it.
    ("U.S.A.", ["USA"], 0.0, 1.0, 1.0),
    ("O'Neill", ["ONeill"], 0.0, 1.0, 1.0),
    # A hyphen is the opposite: F1 sees "well known" on both sides, EM "wellknown" vs "well known".
    ("well-known", ["well known"], 1.0, 0.0, 0.0),
    # Articles: EM and CEM drop them; F1 keeps "the" (P = 1/2, R = 1 -> 2/3).
    ("The Beatles", ["Beatles"], 2 / 3, 1.0, 1.0),
    # Token sets, not multisets: {the, cat} both sides -> 1 (a multiset F1 would give 0.8).
    ("the the cat", ["the cat"], 1.0, 1.0, 1.0),
    ("barack obama", ["obama"], 2 / 3, 0.0, 1.0),  # P = 1/2, R = 1
    ("john smith jr", ["john adams smith"], 2 / 3, 0.0, 0.0),  # P = R = 2/3; "adams" missing
    # Gold tokens plus more: P = 2/6, R = 1 -> F1 = 0.5; CEM covers the gold.
    ("It was Marie Curie, in 1903", ["Marie Curie"], 0.5, 0.0, 1.0),
    # Max over golds: vs "new york" P = 2/3, R = 1 -> 0.8; vs "NYC" 0.
    ("new york city", ["NYC", "New York"], 0.8, 0.0, 1.0),
    ("Paris", ["London", "Paris, France", "paris"], 1.0, 1.0, 1.0),
    ("", ["Paris"], 0.0, 0.0, 0.0),  # empty prediction
    ("Paris", [], 0.0, 0.0, 0.0),  # no golds
    ("Paris", [""], 0.0, 0.0, 0.0),  # empty gold
    # "True"/"False" are "yes"/"no" for CEM only, and only as these exact strings.
    ("True", ["yes"], 0.0, 0.0, 1.0),
    ("no", ["False"], 0.0, 0.0, 1.0),
    ("true", ["yes"], 0.0, 0.0, 0.0),
    (" False ", ["no"], 0.0, 0.0, 1.0),  # mapped after stripping
]


@pytest.mark.parametrize(("prediction", "golds", "f1", "em", "cem"), CASES)
def test_metrics_hand_computed_cases_match(
    prediction: str, golds: list[str], f1: float, em: float, cem: float
) -> None:
    assert f1_score(prediction, golds) == pytest.approx(f1)
    assert exact_match(prediction, golds) == em
    assert cover_exact_match(prediction, golds) == cem


def test_metrics_bare_string_gold_is_one_answer() -> None:
    assert exact_match("Paris", "Paris") == 1.0  # type: ignore[arg-type]


def test_extract_answer_several_answers_picks_last_stripped() -> None:
    text = "<answer>first</answer> then <answer>\n second \n</answer>"
    assert extract_answer(text) == "second"
    assert extract_answer("<answer>open only") is None
    assert extract_answer("<answer>a\nb</answer>") == "a\nb"


@pytest.mark.parametrize(
    ("turns", "expected"),
    [
        (["<think>x</think><search>q</search>", "<answer>Rubim</answer>"], (True, "")),
        (["<think>a <search>q</search></think>", "ok <answer>x</answer>"], (True, "")),
        (["<search>q</search>", "<think>hm</think>"], (False, "no answer")),
        ([], (False, "no answer")),
        (["<search>q", "<answer>x</answer>"], (False, "turn 1: unbalanced <search>")),
        (["<search>q</search>", "<answer>x</search>"], (False, "turn 2: unbalanced <search>")),
        (["<think>x", "<answer>x</answer>"], (False, "turn 1: unbalanced <think>")),
        (["<search>q</search>", "<search>a</search><answer>x</answer>"],
         (False, "turn 2: 2 actions")),
        (["<answer><search>q</answer></search>"], (False, "turn 1: unbalanced <answer>")),
    ],
)  # fmt: skip
def test_format_ok_turn_cases_give_expected_reason(
    turns: list[str], expected: tuple[bool, str]
) -> None:
    assert format_ok(turns) == expected


def test_score_trajectory_good_format_reward_is_chosen_metric() -> None:
    turns = ["<search>obama</search>", "<answer>Barack Obama</answer>"]
    for metric, reward in [("f1", 2 / 3), ("em", 0.0), ("cem", 1.0)]:
        result = score_trajectory(turns, ["Obama"], RewardConfig(metric=metric))
        assert result.reward == pytest.approx(reward)
        assert result.answer == "Barack Obama"
        assert result.parts == pytest.approx({"format": 1.0, "f1": 2 / 3, "em": 0.0, "cem": 1.0})
        assert result.format_error is None


def test_score_trajectory_failed_gate_reward_zero_parts_kept() -> None:
    turns = ["<search>a</search><search>b</search>", "<answer>Obama</answer>"]
    result = score_trajectory(turns, ["Obama"], RewardConfig(metric="em"))
    assert result.reward == 0.0
    assert result.parts == {"format": 0.0, "f1": 1.0, "em": 1.0, "cem": 1.0}
    assert result.format_error == "turn 1: 2 actions"


def test_score_trajectory_no_answer_reward_zero() -> None:
    result = score_trajectory(["<search>q</search>"], ["x"], RewardConfig())
    assert (result.reward, result.answer, result.format_error) == (0.0, None, "no answer")


def test_score_trajectory_invalid_answer_gets_penalty() -> None:
    config = RewardConfig(invalid_penalty=-0.5)
    turns = ["<answer>This is an Invalid Question.</answer>"]
    result = score_trajectory(turns, ["x"], config)
    assert result.reward == -0.5 and result.parts["invalid"] == 1.0
    ordinary = score_trajectory(["<answer>x</answer>"], ["x"], config)
    assert ordinary.reward == 1.0 and ordinary.parts["invalid"] == 0.0
    # A malformed trajectory earns 0, not the penalty.
    broken = score_trajectory(["<search>", "<answer>cannot be answered</answer>"], ["x"], config)
    assert broken.reward == 0.0 and broken.parts["invalid"] == 0.0


def test_score_trajectory_invalid_answer_without_penalty_scored_normally() -> None:
    result = score_trajectory(["<answer>cannot be answered</answer>"], ["x"], RewardConfig())
    assert result.reward == 0.0 and "invalid" not in result.parts


def test_reward_config_judge_metric_without_judge_rejected() -> None:
    with pytest.raises(ValueError, match="judge"):
        RewardConfig(metric="judge")
    with pytest.raises(msgspec.ValidationError, match="judge"):
        msgspec.convert({"metric": "judge"}, RewardConfig)
    with pytest.raises(ValueError, match="judge_score"):
        score_trajectory(["<answer>x</answer>"], ["x"], _judge_reward("http://unused/v1"))


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ('```json\n{"rationale": "same", "judgement": "Correct"}\n```', True),
        ('Sure.\n{"rationale": "differs", "judgement": "incorrect"}\nHope this helps.', False),
        ("{'rationale': 'same person', 'judgement': 'correct',}", True),
        ('{"judgment": "Incorrect"}', False),
        ("Judgement: **Incorrect**", False),
        ("incorrect", False),
        ("Correct.", True),
        ("I cannot tell whether it is correct or incorrect", None),
        ("the answer is not incorrect", None),
        ("", None),
    ],
)
def test_parse_verdict_reply_shapes_give_verdict(reply: str, verdict: bool | None) -> None:
    assert parse_verdict(reply) is verdict


# --- the judge against a real HTTP server ---------------------------------------------------------


class FakeJudge:
    """A local OpenAI-shaped server replying with a script; the last step repeats."""

    def __init__(self, script: list[tuple[int, str]]) -> None:
        self.script = script
        self.requests: list[dict] = []
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    status, content = fake.script[min(len(fake.requests), len(fake.script) - 1)]
                    fake.requests.append({"path": self.path, **body})
                    fake.headers.append(dict(self.headers))
                reply = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


@pytest.fixture
def judge_server() -> Iterator[Callable[[list[tuple[int, str]]], FakeJudge]]:
    """A factory of fake judges, each serving on a free port until the test ends."""
    started: list[FakeJudge] = []

    def start(script: list[tuple[int, str]]) -> FakeJudge:
        fake = FakeJudge(script)
        # A short poll interval keeps shutdown (once per test) fast.
        threading.Thread(target=fake.server.serve_forever, args=(0.01,), daemon=True).start()
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.server.shutdown()
        fake.server.server_close()


def _judge_config(url: str, **overrides: object) -> JudgeConfig:
    return JudgeConfig(base_url=url, model="judge-model", backoff_s=0.0, timeout_s=2.0, **overrides)


def _judge_reward(url: str) -> RewardConfig:
    return RewardConfig(metric="judge", judge=_judge_config(url))


def _ask(url: str, **overrides: object) -> float:
    config = _judge_config(url, **overrides)
    return asyncio.run(judge("Who?", "Obama", ["Barack Obama", "Obama"], config))


def test_judge_fenced_json_correct_scores_one(judge_server) -> None:
    fake = judge_server([(200, '```json\n{"rationale": "r", "judgement": "correct"}\n```')])
    assert _ask(fake.url) == 1.0
    (request,) = fake.requests
    assert request["path"] == "/v1/chat/completions" and request["model"] == "judge-model"
    prompt = request["messages"][0]["content"]
    assert "Who?" in prompt and '["Barack Obama", "Obama"]' in prompt


def test_judge_prose_around_json_parsed(judge_server) -> None:
    fake = judge_server([(200, 'Here: {"judgement": "incorrect"} -- done')])
    assert _ask(fake.url) == 0.0


def test_judge_bare_incorrect_scores_zero(judge_server) -> None:
    fake = judge_server([(200, "Incorrect")])
    assert _ask(fake.url) == 0.0 and len(fake.requests) == 1


def test_judge_server_error_then_success_retried(judge_server) -> None:
    fake = judge_server([(500, "boom"), (200, '{"judgement": "correct"}')])
    assert _ask(fake.url) == 1.0 and len(fake.requests) == 2


def test_judge_garbage_every_time_raises_after_max_attempts(judge_server) -> None:
    fake = judge_server([(200, "I'd rather not say.")])
    with pytest.raises(JudgeError, match="4 attempts"):
        _ask(fake.url, max_attempts=4)
    assert len(fake.requests) == 4


def test_judge_client_error_raises_without_retry_or_key(judge_server, monkeypatch) -> None:
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-secret-123")
    fake = judge_server([(401, "sk-secret-123 is not a valid key")])
    with pytest.raises(JudgeError, match="HTTP 401") as caught:
        _ask(fake.url, api_key_env="JUDGE_TEST_KEY")
    assert len(fake.requests) == 1 and "sk-secret" not in str(caught.value)
    assert fake.headers[0]["Authorization"] == "Bearer sk-secret-123"


def test_judge_unreachable_server_raises_after_max_attempts() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free, and nobody listens on it once closed
    with pytest.raises(JudgeError, match="2 attempts: network error"):
        _ask(f"http://127.0.0.1:{port}/v1", max_attempts=2)


def test_score_trajectory_with_judge_verdict_becomes_reward(judge_server) -> None:
    fake = judge_server([(200, '{"judgement": "correct"}')])
    turns = ["<search>q</search>", "<answer>the 44th president</answer>"]
    result = asyncio.run(
        score_trajectory_with_judge(turns, ["Obama"], _judge_reward(fake.url), "Q")
    )
    assert result.reward == 1.0 and result.parts["judge"] == 1.0 and result.parts["f1"] == 0.0


def test_score_trajectory_with_judge_bad_format_skips_judge(judge_server) -> None:
    fake = judge_server([(200, '{"judgement": "correct"}')])
    turns = ["<search>q</search>"]
    result = asyncio.run(
        score_trajectory_with_judge(turns, ["Obama"], _judge_reward(fake.url), "Q")
    )
    assert result.reward == 0.0 and result.parts["judge"] == 0.0 and fake.requests == []
