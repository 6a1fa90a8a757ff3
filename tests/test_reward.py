"""Rewards: ASearcher's F1/EM/CEM by hand-computed cases, its per-call format check, the
invalid-question penalty, and the LLM judge (with its back-off) against a real local HTTP server."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator

import msgspec
import pytest

from asearcher.consumers.scoring.reward import (
    JudgeConfig,
    JudgeError,
    RewardConfig,
    answer_reward,
    call_format_error,
    cover_exact_match,
    evaluation_scoring,
    exact_match,
    extract_answer,
    f1_score,
    format_ok,
    is_invalid_answer,
    judge,
    pages_read_share,
    parse_verdict,
    score_trajectory,
    score_trajectory_with_judge,
)
from tests.chat_server import ChatServer as FakeJudge
from tests.chat_server import Step, chat_servers

# (prediction, golds, F1, EM, CEM) with the evaluation defaults, each computed by hand.
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
    # CEM ignores order; it is membership only.
    ("Curie Marie", ["Marie Curie"], 1.0, 0.0, 1.0),
    # Max over golds: vs "new york" P = 2/3, R = 1 -> 0.8; vs "NYC" 0.
    ("new york city", ["NYC", "New York"], 0.8, 0.0, 1.0),
    ("Paris", ["London", "Paris, France", "paris"], 1.0, 1.0, 1.0),
    ("", ["Paris"], 0.0, 0.0, 0.0),  # empty prediction
    ("Paris", [], 0.0, 0.0, 0.0),  # no golds
    # Golds that normalise to nothing (SQuAD drops articles): CEM's token list is [""], which
    # only a prediction that also normalises to nothing contains. F1 keeps articles.
    ("Paris", [""], 0.0, 0.0, 0.0),
    ("", [""], 0.0, 1.0, 1.0),
    ("a", ["a"], 1.0, 1.0, 1.0),
    ("the", ["a"], 0.0, 1.0, 1.0),
    ("", ["The"], 0.0, 1.0, 1.0),
    ("Paris", ["a"], 0.0, 0.0, 0.0),
    ("an", ["Paris"], 0.0, 0.0, 0.0),  # a prediction with nothing left covers no real gold
    ("the", ["Paris", "a"], 0.0, 1.0, 1.0),  # max over golds: the empty one matches
    # "True"/"False" are "yes"/"no" for CEM only (evaluation), and only as these exact strings.
    ("True", ["yes"], 0.0, 0.0, 1.0),
    ("no", ["False"], 0.0, 0.0, 1.0),
    ("true", ["yes"], 0.0, 0.0, 0.0),
    (" False ", ["no"], 0.0, 0.0, 0.0),  # not stripped first: " False " is not "False"
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


@pytest.mark.parametrize(
    ("prediction", "golds", "mapped_f1", "mapped_em"),
    [
        ("True", ["yes"], 1.0, 1.0),
        ("no", ["False"], 1.0, 1.0),
        ("False", ["False"], 1.0, 1.0),  # both sides mapped: still equal
        ("True", ["yes", "true"], 1.0, 1.0),  # unmapped "true" would also match
        ("TRUE", ["yes"], 0.0, 0.0),  # only the exact strings are mapped
        ("True story", ["yes"], 0.0, 0.0),
    ],
)
def test_bool_mapping_on_maps_true_false_for_f1_and_em(
    prediction: str, golds: list[str], mapped_f1: float, mapped_em: float
) -> None:
    assert f1_score(prediction, golds, bool_mapping=True) == mapped_f1
    assert exact_match(prediction, golds, bool_mapping=True) == mapped_em


def test_bool_mapping_reward_config_default_on_and_off() -> None:
    turns = ["fine</think>\n<answer>True</answer>"]
    mapped = score_trajectory(turns, ["yes"], RewardConfig())
    assert mapped.parts == {"format": 1.0, "f1": 1.0, "em": 1.0, "cem": 1.0, "invalid": 0.0}
    assert mapped.reward == 1.0
    plain = score_trajectory(turns, ["yes"], RewardConfig(bool_mapping=False))
    assert (plain.parts["f1"], plain.parts["em"], plain.parts["cem"]) == (0.0, 0.0, 1.0)
    assert plain.reward == 0.0
    # CEM maps in both of ASearcher's scorers, so the option leaves it alone.
    cem = score_trajectory(turns, ["yes"], RewardConfig(metric="cem", bool_mapping=False))
    assert cem.reward == 1.0


@pytest.mark.parametrize(
    ("prediction", "gold", "cjk_f1", "plain_f1"),
    [
        ("北京市", "北京", 0.8, 0.0),  # characters {北, 京, 市} vs {北, 京}: P = 2/3, R = 1
        # Digit runs are tokens: {年, 月, 2024, 3} vs {年, 2024}: P = 1/2, R = 1 -> 2/3.
        ("2024年3月", "2024年", 2 / 3, 0.0),
        ("上海，中国。", "上海", 2 / 3, 0.0),  # "，" and "。" are dropped: {上, 海, 中, 国}
        ("Beijing", "Beijing", 1.0, 1.0),  # a gold without CJK is scored by words
    ],
)
def test_cjk_gold_scored_by_characters_only_when_asked(
    prediction: str, gold: str, cjk_f1: float, plain_f1: float
) -> None:
    assert f1_score(prediction, [gold], cjk=True) == pytest.approx(cjk_f1)
    assert f1_score(prediction, [gold]) == pytest.approx(plain_f1)
    turns = [f"<answer>{prediction}</answer>"]
    assert score_trajectory(turns, [gold], RewardConfig()).reward == pytest.approx(cjk_f1)
    plain = RewardConfig(cjk_f1=False)
    assert score_trajectory(turns, [gold], plain).reward == pytest.approx(plain_f1)


def test_extract_answer_several_answers_picks_last_stripped() -> None:
    text = "<answer>first</answer> then <answer>\n second \n</answer>"
    assert extract_answer(text) == "second"
    assert extract_answer("<answer>open only") is None
    assert extract_answer("<answer>a\nb</answer>") == "a\nb"


# --- the per-call format check --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "error"),
    [
        # Passing calls: an action call, a think call (ends at </think>), tags ASearcher ignores.
        ("I should look it up.</think>\n<search>founder of Avalon</search>", None),
        ("The page says Rubim founded it.</think>", None),
        ("<think>nested</think> <answer>x</answer>", None),
        ("User: who?</think><answer>x</answer>", None),  # "User" is not checked
        ("<information>stray", None),  # <information> is not checked
        ("no tags at all", None),
        # One failing case per rule.
        ("go</think>\n<search>q", "unbalanced <search>"),
        ("go</think>\nq</access>", "unbalanced <access>"),
        ("<answer>x</answer></answer>", "unbalanced <answer>"),
        ("<search>a</search><answer>b</answer>", "2 action tags"),
        ("<access>u</access><access>v</access><search>q</search>", "3 action tags"),
        ("done</think>\nAssistant: <answer>x</answer>", "writes 'Assistant'"),
        ("as an assistant I think</think>", "writes 'assistant'"),
        ("a</think>b</think>", "2 </think>"),
    ],
)
def test_call_format_error_each_rule(text: str, error: str | None) -> None:
    assert call_format_error(text) == error


def test_format_ok_every_call_checked_think_calls_included() -> None:
    good = [
        "plan</think>\n<search>q</search>",
        "reading page 1</think>",  # think calls while page chunks are read
        "reading page 2</think>",
        "so</think>\n<answer>Rubim</answer>",
    ]
    assert format_ok(good) == (True, "")
    broken_think = [*good[:2], "page 2</think> and more </think>", good[3]]
    assert format_ok(broken_think) == (False, "call 3: 2 </think>")
    assert format_ok(["<search>q</search>", "Assistant", "x</think>b</think>"]) == (
        False,
        "call 2: writes 'Assistant'",  # the first failing call is named
    )


def test_format_ok_reference_check_needs_no_answer() -> None:
    # A trajectory that ran out of turns is well formed; it earns 0 for having no answer.
    assert format_ok(["p</think>\n<search>q</search>", "r</think>"]) == (True, "")
    assert format_ok([]) == (True, "")


@pytest.mark.parametrize(
    ("turns", "expected"),
    [
        (["<think>x</think><search>q</search>", "<answer>Rubim</answer>"], (True, "")),
        (["<think>a <search>q</search></think>", "ok <answer>x</answer>"], (True, "")),
        (["<search>q</search>", "<think>hm</think>"], (False, "no answer")),
        ([], (False, "no answer")),
        (["<search>q", "<answer>x</answer>"], (False, "call 1: unbalanced <search>")),
        (["<search>q</search>", "<answer>x</search>"], (False, "call 2: unbalanced <search>")),
        (["<think>x", "<answer>x</answer>"], (False, "call 1: unbalanced <think>")),
        (["x</think><answer>x</answer>"], (False, "call 1: unbalanced <think>")),
        (["<search>q</search>", "<search>a</search><answer>x</answer>"],
         (False, "call 2: 2 actions")),
        (["<answer><search>q</answer></search>"], (False, "call 1: unbalanced <answer>")),
    ],
)  # fmt: skip
def test_format_ok_nested_check_kept_as_option(
    turns: list[str], expected: tuple[bool, str]
) -> None:
    assert format_ok(turns, "nested") == expected


def test_format_check_nested_in_config_is_used() -> None:
    turns = ["<search>q</search>", "x</think><answer>Obama</answer>"]
    assert score_trajectory(turns, ["Obama"], RewardConfig()).reward == 1.0
    nested = score_trajectory(turns, ["Obama"], RewardConfig(format_check="nested"))
    assert nested.reward == 0.0 and nested.format_error == "call 2: unbalanced <think>"
    with pytest.raises(msgspec.ValidationError, match="format_check"):
        msgspec.convert({"format_check": "loose"}, RewardConfig)


# --- trajectory scores --------------------------------------------------------------------------


def test_score_trajectory_good_format_reward_is_chosen_metric() -> None:
    turns = ["p</think>\n<search>obama</search>", "r</think>", "<answer>Barack Obama</answer>"]
    for metric, reward in [("f1", 2 / 3), ("em", 0.0), ("cem", 1.0)]:
        result = score_trajectory(turns, ["Obama"], RewardConfig(metric=metric))
        assert result.reward == pytest.approx(reward)
        assert result.answer == "Barack Obama"
        assert result.parts == pytest.approx(
            {"format": 1.0, "f1": 2 / 3, "em": 0.0, "cem": 1.0, "invalid": 0.0}
        )
        assert result.format_error is None


def test_score_trajectory_failed_format_multiplies_to_zero_not_negative() -> None:
    turns = ["<search>a</search><search>b</search>", "<answer>Obama</answer>"]
    for metric in ("f1", "em", "cem"):
        result = score_trajectory(turns, ["Obama"], RewardConfig(metric=metric))
        assert result.reward == 0.0
        assert result.parts == {"format": 0.0, "f1": 1.0, "em": 1.0, "cem": 1.0, "invalid": 0.0}
        assert result.format_error == "call 1: 2 action tags"


def test_score_trajectory_failing_think_call_fails_the_trajectory() -> None:
    turns = ["p</think>\n<search>q</search>", "chunk</think> again</think>", "<answer>x</answer>"]
    result = score_trajectory(turns, ["x"], RewardConfig())
    assert result.reward == 0.0 and result.format_error == "call 2: 2 </think>"


def test_score_trajectory_answer_is_last_answer_of_any_call_stripped() -> None:
    turns = ["<answer>wrong</answer>", "think</think>", "late thought <answer>  Rubim \n</answer>"]
    result = score_trajectory(turns, ["Rubim"], RewardConfig(metric="em"))
    assert result.answer == "Rubim" and result.reward == 1.0
    # An answer written in a think call counts too.
    in_think = score_trajectory(["so <answer>Rubim</answer></think>"], ["Rubim"], RewardConfig())
    assert in_think.reward == 1.0


def test_score_trajectory_no_answer_scores_zero_on_every_metric() -> None:
    # The empty prediction would cover an empty gold (CEM 1, EM 1); no answer at all scores 0.
    assert cover_exact_match("", ["the"]) == 1.0
    result = score_trajectory(["p</think>\n<search>q</search>"], ["the"], RewardConfig())
    assert result.answer is None and result.format_error is None
    assert result.parts == {"format": 1.0, "f1": 0.0, "em": 0.0, "cem": 0.0, "invalid": 0.0}
    assert result.reward == 0.0
    # An empty answer is an answer: it covers the gold that normalises to nothing.
    empty = score_trajectory(["<answer> </answer>"], ["the"], RewardConfig(metric="cem"))
    assert empty.answer == "" and empty.reward == 1.0


# --- the invalid-question penalty ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "invalid"),
    [
        ("the question is invalid.", True),
        ("This is not a valid query", True),  # "valid" alone counts
        ("not appropriate", True),
        ("Questions remain", False),  # case-sensitive: "Questions" has no "question"
        ("Valid Point Inc.", False),
        ("Paris", False),
        (None, False),
    ],
)
def test_is_invalid_answer_reference_substrings(answer: str | None, invalid: bool) -> None:
    assert is_invalid_answer(answer) is invalid


def test_penalty_only_with_valid_instruction() -> None:
    turns = ["<answer>the question is invalid.</answer>"]
    config = RewardConfig()  # penalty -0.5 by default, as ASearcher
    penalised = score_trajectory(turns, ["x"], config, valid_instruction=True)
    assert penalised.reward == -0.5 and penalised.parts["invalid"] == 1.0
    # The prompt allowed calling the question invalid: scored as any answer (F1 0 here).
    allowed = score_trajectory(turns, ["x"], config, valid_instruction=False)
    assert allowed.reward == 0.0 and allowed.parts["invalid"] == 0.0
    # ... which gives it a reward when the gold happens to share words.
    assert score_trajectory(turns, ["invalid"], config, valid_instruction=False).reward > 0
    # The default is the valid instruction, and the old positional form still works.
    assert score_trajectory(turns, ["x"], config, None).reward == -0.5


def test_penalty_overrides_format_failure_and_is_configurable() -> None:
    broken = ["<search>", "<answer>the question is invalid</answer>"]
    result = score_trajectory(broken, ["x"], RewardConfig(invalid_penalty=-1.0))
    assert result.parts["format"] == 0.0 and result.reward == -1.0
    off = score_trajectory(broken, ["x"], RewardConfig(invalid_penalty=None))
    assert off.reward == 0.0 and "invalid" not in off.parts
    ordinary = score_trajectory(["<answer>x</answer>"], ["x"], RewardConfig())
    assert ordinary.reward == 1.0 and ordinary.parts["invalid"] == 0.0


def test_a_format_failure_earns_the_format_penalty_when_one_is_set() -> None:
    right_but_broken = ["<search>x", "<answer>x</answer>"]  # the first call leaves a tag open
    reference = score_trajectory(right_but_broken, ["x"], RewardConfig())
    assert reference.parts["format"] == 0.0 and reference.reward == 0.0
    penalised = score_trajectory(right_but_broken, ["x"], RewardConfig(format_penalty=-0.2))
    assert penalised.reward == -0.2 and penalised.parts["f1"] == 1.0
    assert penalised.format_error == reference.format_error is not None
    # A well-formed trajectory is scored as before, wrong answer included.
    wrong = score_trajectory(["<answer>y</answer>"], ["x"], RewardConfig(format_penalty=-0.2))
    assert wrong.reward == 0.0 and wrong.parts["format"] == 1.0
    # Calling the question invalid under the "most likely answer" instruction stays the worse.
    invalid = ["<search>", "<answer>the question is invalid</answer>"]
    both = RewardConfig(format_penalty=-0.2, invalid_penalty=-0.5)
    assert score_trajectory(invalid, ["x"], both).reward == -0.5
    # The evaluation scores as the reference: no format penalty.
    assert evaluation_scoring(RewardConfig(format_penalty=-0.2)).format_penalty is None


def test_reward_config_judge_metric_without_judge_rejected() -> None:
    with pytest.raises(ValueError, match="judge"):
        RewardConfig(metric="judge")
    with pytest.raises(msgspec.ValidationError, match="judge"):
        msgspec.convert({"metric": "judge"}, RewardConfig)
    with pytest.raises(msgspec.ValidationError, match="invalid_penalty"):
        msgspec.convert({"invalid_penalty": float("nan")}, RewardConfig)
    with pytest.raises(msgspec.ValidationError, match="format_penalty"):
        msgspec.convert({"format_penalty": float("inf")}, RewardConfig)
    with pytest.raises(ValueError, match="judge_score"):
        score_trajectory(["<answer>x</answer>"], ["x"], _judge_reward("http://unused/v1"))


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_attempts", 0), ("backoff_s", -1.0), ("max_backoff_s", -0.1),
     ("max_total_backoff_s", float("nan")), ("timeout_s", 0.0)],
)  # fmt: skip
def test_judge_config_bad_retry_settings_name_the_field(field: str, value: float) -> None:
    with pytest.raises(msgspec.ValidationError, match=field):
        msgspec.convert({"base_url": "http://x/v1", "model": "m", field: value}, JudgeConfig)


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


@pytest.fixture
def judge_server() -> Iterator[Callable[[list[Step]], FakeJudge]]:
    """A factory of fake judges, each serving on a free port until the test ends."""
    with chat_servers() as start:
        yield start


def _judge_config(url: str, **overrides: object) -> JudgeConfig:
    settings: dict[str, object] = {"backoff_s": 0.0, "timeout_s": 2.0, **overrides}
    return JudgeConfig(base_url=url, model="judge-model", **settings)


def _judge_reward(url: str, **overrides: object) -> RewardConfig:
    return RewardConfig(metric="judge", judge=_judge_config(url), **overrides)


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


def test_judge_prompt_from_a_template_file(judge_server, tmp_path) -> None:
    template = tmp_path / "judge.txt"
    template.write_text("Q={question} | gold={golds} | said={prediction} | {{verdict}}")
    fake = judge_server([(200, '{"judgement": "correct"}')])
    assert _ask(fake.url, prompt_file=str(template)) == 1.0
    prompt = fake.requests[0]["messages"][0]["content"]
    assert prompt == 'Q=Who? | gold=["Barack Obama", "Obama"] | said=Obama | {verdict}'
    blind = tmp_path / "blind.txt"
    blind.write_text("{question} only")  # never shows the prediction
    with pytest.raises(ValueError, match="judge.prompt_file: .* never places {prediction}"):
        _judge_config(fake.url, prompt_file=str(blind))


# Hand cases worked out from the reference's evaluation rules (`evaluation/evaluate.py`):
# EM and F1 do not map True/False; F1 splits on whitespace, so an unsegmented Chinese answer is
# one token; CEM maps True/False and needs every gold token among the prediction's.
@pytest.mark.parametrize(
    ("answer", "golds", "evaluation", "training"),
    [
        ("北京市", ["北京"], {"f1": 0.0, "em": 0.0, "cem": 0.0}, {"f1": 0.8}),
        ("北京", ["北京"], {"f1": 1.0, "em": 1.0, "cem": 1.0}, {"f1": 1.0}),
        ("True", ["yes"], {"f1": 0.0, "em": 0.0, "cem": 1.0}, {"f1": 1.0, "em": 1.0}),
        ("The Eiffel Tower", ["Eiffel Tower"], {"f1": 0.8, "em": 1.0, "cem": 1.0}, {}),
        ("Paris, France", ["paris"], {"f1": 2 / 3, "em": 0.0, "cem": 1.0}, {}),
    ],
)  # fmt: skip
def test_evaluation_scoring_follows_the_reference_evaluation(
    answer: str, golds: list[str], evaluation: dict, training: dict
) -> None:
    calls = [f"<answer>{answer}</answer>"]
    scored = score_trajectory(calls, golds, evaluation_scoring(RewardConfig()))
    assert {name: scored.parts[name] for name in evaluation} == pytest.approx(evaluation)
    trained = score_trajectory(calls, golds, RewardConfig())
    assert {name: trained.parts[name] for name in training} == pytest.approx(training)


def test_evaluation_scoring_asks_the_judge_about_every_answer(judge_server) -> None:
    fake = judge_server([(200, '{"judgement": "correct"}')])
    config = evaluation_scoring(_judge_reward(fake.url))
    broken = ["<answer>Obama</answer><search>x", "<answer>Obama</b></answer>"]
    scored = asyncio.run(score_trajectory_with_judge(broken, ["Obama"], config, "Who?"))
    assert scored.parts["format"] == 0.0 and scored.parts["judge"] == 1.0
    # Shown up to its first "</", as the reference's evaluation shows it.
    assert "Predicted answer: Obama\n" in fake.requests[0]["messages"][0]["content"]
    silent = asyncio.run(score_trajectory_with_judge(["no answer"], ["Obama"], config, "Who?"))
    assert len(fake.requests) == 2 and silent.parts["judge"] == 1.0
    # Training asks only where the answer can earn a reward.
    training = _judge_reward(fake.url)
    asyncio.run(score_trajectory_with_judge(broken, ["Obama"], training, "Who?"))
    assert len(fake.requests) == 2


def test_judge_prose_around_json_parsed(judge_server) -> None:
    fake = judge_server([(200, 'Here: {"judgement": "incorrect"} -- done')])
    assert _ask(fake.url) == 0.0


def test_judge_bare_incorrect_scores_zero(judge_server) -> None:
    fake = judge_server([(200, "Incorrect")])
    assert _ask(fake.url) == 0.0 and len(fake.requests) == 1


def test_judge_server_error_then_success_retried(judge_server) -> None:
    fake = judge_server([(500, "boom"), (429, "slow down"), (200, '{"judgement": "correct"}')])
    assert _ask(fake.url) == 1.0 and len(fake.requests) == 3


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


def test_judge_backoff_waits_are_jittered_within_bounds(judge_server) -> None:
    fake = judge_server([(503, "busy")])
    with pytest.raises(JudgeError, match="5 attempts: HTTP 503"):
        _ask(fake.url, max_attempts=5, backoff_s=0.1, max_backoff_s=0.15)
    # Ceilings 0.1, 0.15 (capped), 0.15, 0.15; each wait is drawn from [0, ceiling].
    gaps = fake.gaps()
    assert len(gaps) == 4
    for gap, ceiling in zip(gaps, [0.1, 0.15, 0.15, 0.15], strict=True):
        assert gap <= ceiling + 0.1  # plus the time of a request on a loaded machine


def test_judge_honours_retry_after(judge_server) -> None:
    fake = judge_server([(429, "later", {"Retry-After": "1"}), (200, '{"judgement": "correct"}')])
    assert _ask(fake.url, backoff_s=0.0) == 1.0
    (gap,) = fake.gaps()
    assert gap >= 0.95  # without Retry-After, backoff_s = 0 would retry at once


def test_judge_retry_after_is_capped(judge_server) -> None:
    fake = judge_server([(503, "x", {"Retry-After": "3600"}), (200, '{"judgement": "correct"}')])
    assert _ask(fake.url, max_backoff_s=0.2) == 1.0
    (gap,) = fake.gaps()
    assert 0.15 <= gap < 2.0


def test_judge_total_wait_is_bounded(judge_server) -> None:
    fake = judge_server([(503, "busy", {"Retry-After": "1"})])
    started = time.monotonic()
    # Each retry would wait 1 s; a budget of 1.5 s allows one wait, not two.
    with pytest.raises(JudgeError, match="2 attempts: HTTP 503"):
        _ask(fake.url, max_attempts=10, max_total_backoff_s=1.5)
    assert len(fake.requests) == 2 and time.monotonic() - started < 2.5


def test_score_trajectory_with_judge_verdict_becomes_reward(judge_server) -> None:
    fake = judge_server([(200, '{"judgement": "correct"}')])
    turns = ["p</think>\n<search>q</search>", "r</think>", "<answer>the 44th president</answer>"]
    result = asyncio.run(
        score_trajectory_with_judge(turns, ["Obama"], _judge_reward(fake.url), "Q")
    )
    assert result.reward == 1.0 and result.parts["judge"] == 1.0 and result.parts["f1"] == 0.0
    assert len(fake.requests) == 1


def test_score_trajectory_with_judge_bad_format_or_no_answer_skips_judge(judge_server) -> None:
    fake = judge_server([(200, '{"judgement": "correct"}')])
    for turns in (["<search>q</search>"], ["a</think>b</think><answer>Obama</answer>"]):
        result = asyncio.run(
            score_trajectory_with_judge(turns, ["Obama"], _judge_reward(fake.url), "Q")
        )
        assert result.reward == 0.0 and result.parts["judge"] == 0.0
    assert fake.requests == []


def test_score_trajectory_with_judge_penalty_only_with_valid_instruction(judge_server) -> None:
    fake = judge_server([(200, '{"judgement": "correct"}')])
    turns = ["<answer>the question is invalid</answer>"]
    config = _judge_reward(fake.url)
    penalised = asyncio.run(score_trajectory_with_judge(turns, ["x"], config, "Q"))
    assert penalised.reward == -0.5 and penalised.parts["judge"] == 0.0 and fake.requests == []
    allowed = asyncio.run(
        score_trajectory_with_judge(turns, ["x"], config, "Q", valid_instruction=False)
    )
    assert allowed.reward == 1.0 and allowed.parts["invalid"] == 0.0 and len(fake.requests) == 1


def test_page_reward_pays_the_share_of_supporting_pages_opened_and_only_in_training() -> None:
    urls = ["https://w/A", "https://w/B"]
    assert pages_read_share(["https://w/A ", "https://w/C"], urls) == 0.5
    assert pages_read_share(urls, []) is None  # the question names no pages
    config = RewardConfig(page_reward=0.2)
    wrong = ["p</think>\n<answer>Rome</answer>"]
    half = score_trajectory(wrong, ["Paris"], config, pages_read=0.5)
    assert half.reward == pytest.approx(0.1) and half.parts["pages_read"] == 0.5
    assert half.parts["page_bonus"] == pytest.approx(0.1)
    right = score_trajectory(["<answer>Paris</answer>"], ["Paris"], config, pages_read=1.0)
    assert right.reward == pytest.approx(1.2)
    # What the answer alone earned (cloning keeps right answers, not well-read wrong ones).
    assert answer_reward(right.reward, right.parts) == pytest.approx(1.0)
    assert answer_reward(half.reward, half.parts) == pytest.approx(0.0)
    # Off by default: the reward pays for the answer alone, the share still logged.
    plain = score_trajectory(wrong, ["Paris"], RewardConfig(), pages_read=1.0)
    assert plain.reward == 0.0 and plain.parts["pages_read"] == 1.0
    # A format failure or a penalised answer earns no page reward.
    broken = score_trajectory(["<answer>Rome</answer><search>x"], ["Paris"], config, pages_read=1.0)
    assert broken.reward == 0.0 and broken.parts["page_bonus"] == 0.0
    invalid = score_trajectory(["<answer>invalid</answer>"], ["Paris"], config, pages_read=1.0)
    assert invalid.reward == -0.5
    assert evaluation_scoring(config).page_reward == 0.0
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError, match="page_reward must be a finite number >= 0"):
            RewardConfig(page_reward=bad)
