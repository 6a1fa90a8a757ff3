"""Rewards for search-agent trajectories, scored as the ASearcher evaluation scores them.

Inputs are the assistant turns of one trajectory and the gold answers of its question; the output
is a `RewardBreakdown`: the reward the trainer uses plus every metric, for logging.
Components:
- metrics, each the max over the gold answers, matching ASearcher's `evaluation/evaluate.py` so
  that figures compare with the paper's tables: `f1_score` (token sets, punctuation becomes a
  space), `exact_match` (SQuAD normalisation) and `cover_exact_match` (every gold token appears
  in the prediction, with "True"/"False" read as "yes"/"no");
- `extract_answer` (the last `<answer>`) and `format_ok`, the gate a trajectory must pass to earn
  anything;
- `score_trajectory` (synchronous) and `score_trajectory_with_judge`, which first asks an
  LLM judge (`judge`, any OpenAI-compatible endpoint) whether the answer is right.

The judge's API key comes from an environment variable and travels only in the request header:
it is never logged and never part of an error.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import re
import string
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import httpx
import msgspec

from asearcher.producers.actions import ACTION_TAGS
from asearcher.streams.log import get_logger

log = get_logger(__name__)

Metric = Literal["f1", "em", "cem", "judge"]
INVALID_ANSWER = re.compile(r"\b(invalid question|question is invalid|cannot be answered)\b", re.I)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TAG = re.compile(r"<(/?)(search|access|answer|think)>")
_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# Only these exact strings are mapped, as in ASearcher: "true" or "TRUE" stay as they are.
_BOOL_WORDS = {"True": "yes", "False": "no"}


# --- metrics ------------------------------------------------------------------------------------


def _f1_tokens(text: str) -> set[str]:
    """ASearcher's F1 normalisation: punctuation becomes a space (so "U.S.A." is "u s a")."""
    for mark in string.punctuation:
        text = text.replace(mark, " ")
    return set(text.lower().split())


def squad_normalize(text: str) -> str:
    """SQuAD normalisation: lowercase, delete punctuation and the articles a/an/the, one space."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _max_over(golds: list[str], score: Callable[[str], float]) -> float:
    # A bare string would otherwise be scored character by character.
    if isinstance(golds, str):
        golds = [golds]
    return max((score(gold) for gold in golds), default=0.0)


def _f1_one(prediction: set[str], gold: set[str]) -> float:
    common = len(prediction & gold)
    if common == 0:  # also covers an empty side
        return 0.0
    precision, recall = common / len(prediction), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: list[str]) -> float:
    """Token-set F1 of `prediction` against the best gold answer (0 if either side is empty)."""
    tokens = _f1_tokens(prediction)
    return _max_over(golds, lambda gold: _f1_one(tokens, _f1_tokens(gold)))


def exact_match(prediction: str, golds: list[str]) -> float:
    """1.0 when `prediction` equals some gold answer after SQuAD normalisation, else 0.0."""
    normalized = squad_normalize(prediction)
    return _max_over(golds, lambda gold: float(squad_normalize(gold) == normalized))


def _cem_tokens(text: str) -> list[str]:
    text = text.strip()
    return squad_normalize(_BOOL_WORDS.get(text, text)).split()


def _covers(prediction: list[str], gold: list[str]) -> float:
    # ASearcher's `all()` over an empty gold would be 1; an empty gold proves nothing, so 0.
    return float(bool(gold) and all(token in prediction for token in gold))


def cover_exact_match(prediction: str, golds: list[str]) -> float:
    """1.0 when every token of some gold answer is among the prediction's tokens, else 0.0.

    Both sides are stripped, then the exact strings "True" and "False" become "yes" and "no"
    (case-sensitive, as in ASearcher), then SQuAD-normalised and split on spaces. A gold answer
    with no tokens left scores 0.
    """
    tokens = _cem_tokens(prediction)
    return _max_over(golds, lambda gold: _covers(tokens, _cem_tokens(gold)))


# --- answer and format --------------------------------------------------------------------------


def extract_answer(text: str) -> str | None:
    """The stripped content of the last `<answer>…</answer>` in `text`; None if there is none."""
    matches = _ANSWER.findall(text)
    return matches[-1].strip() if matches else None


def _turn_error(text: str) -> str | None:
    """Why one assistant turn is malformed: tags that do not nest, or more than one action."""
    stack: list[str] = []
    actions = 0
    for match in _TAG.finditer(text):
        closing, tag = match.group(1) == "/", match.group(2)
        if not closing:
            stack.append(tag)
            actions += tag in ACTION_TAGS
        elif not stack or stack.pop() != tag:
            return f"unbalanced <{tag}>"
    if stack:
        return f"unbalanced <{stack[-1]}>"
    if actions > 1:
        return f"{actions} actions"
    return None


def format_ok(turn_texts: list[str]) -> tuple[bool, str]:
    """Whether a trajectory's assistant turns are well formed, and if not, why.

    Every turn must nest its `<search>`, `<access>`, `<answer>` and `<think>` tags properly and
    hold at most one action; the last turn must hold an answer. Turns count from 1, so a reason
    reads "turn 3: 2 actions", "turn 1: unbalanced <search>" or "no answer".
    """
    for number, text in enumerate(turn_texts, start=1):
        error = _turn_error(text)
        if error is not None:
            return False, f"turn {number}: {error}"
    if not turn_texts or extract_answer(turn_texts[-1]) is None:
        return False, "no answer"
    return True, ""


# --- configuration and trajectory rewards -------------------------------------------------------


class JudgeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """An LLM judge behind an OpenAI-compatible chat-completions endpoint."""

    base_url: str  # e.g. "http://host:8000/v1"; requests go to {base_url}/chat/completions
    model: str  # the model name the endpoint serves
    api_key_env: str = "OPENAI_API_KEY"  # variable holding the key; unset or empty means no key
    max_attempts: int = 3  # attempts per verdict, over network errors, 429/5xx and bad replies
    timeout_s: float = 30.0  # limit for one request
    backoff_s: float = 0.5  # delay before the second attempt, doubling after each failure
    temperature: float = 0.6  # ASearcher's judge setting
    max_tokens: int = 1024  # room for the rationale before the verdict

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")


class RewardConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How a trajectory's reward is computed. Every field has a default."""

    metric: Metric = "f1"  # the metric that becomes the reward: f1 | em | cem | judge
    invalid_penalty: float | None = None  # reward for answers calling the question invalid
    judge: JudgeConfig | None = None  # needed for metric "judge"; when set, always consulted

    def __post_init__(self) -> None:
        if self.metric == "judge" and self.judge is None:
            raise ValueError("metric 'judge' needs a [judge] table (field `judge`)")


class RewardBreakdown(msgspec.Struct, kw_only=True):
    """A trajectory's reward and the scores behind it."""

    reward: float  # what the trainer uses
    answer: str | None  # the last answer written, None if there is none
    parts: dict[str, float]  # "format", "f1", "em", "cem"; "judge" and "invalid" when used
    format_error: str | None = None  # why the format gate failed


def _last_answer(turn_texts: list[str]) -> str | None:
    # Per turn, so an unclosed tag in one turn never pairs with a closing tag in the next.
    for text in reversed(turn_texts):
        answer = extract_answer(text)
        if answer is not None:
            return answer
    return None


def score_trajectory(
    turn_texts: list[str],
    golds: list[str],
    config: RewardConfig,
    judge_score: float | None = None,
) -> RewardBreakdown:
    """Score one trajectory: the format gate times the configured metric.

    A failed gate gives 0 whatever the metric. With the gate passed and `invalid_penalty` set,
    an answer calling the question invalid gets the penalty instead. Metric "judge" needs the
    verdict as `judge_score` (see `score_trajectory_with_judge`, which asks for it).
    """
    if config.metric == "judge" and judge_score is None:
        raise ValueError("metric 'judge' needs judge_score; use score_trajectory_with_judge")
    ok, reason = format_ok(turn_texts)
    answer = _last_answer(turn_texts)
    text = answer or ""
    parts = {
        "format": float(ok),
        "f1": f1_score(text, golds),
        "em": exact_match(text, golds),
        "cem": cover_exact_match(text, golds),
    }
    if judge_score is not None:
        parts["judge"] = judge_score
    reward = parts[config.metric] if ok else 0.0
    if config.invalid_penalty is not None:
        parts["invalid"] = float(ok and _is_invalid_answer(answer))
        if parts["invalid"]:
            reward = config.invalid_penalty
    return RewardBreakdown(
        reward=reward, answer=answer, parts=parts, format_error=None if ok else reason
    )


def _is_invalid_answer(answer: str | None) -> bool:
    return answer is not None and INVALID_ANSWER.search(answer) is not None


async def score_trajectory_with_judge(
    turn_texts: list[str],
    golds: list[str],
    config: RewardConfig,
    question: str,
    client: httpx.AsyncClient | None = None,
) -> RewardBreakdown:
    """`score_trajectory`, after asking `config.judge` about the answer when it can matter.

    The judge is not called (its part is 0) when the format gate fails, there is no answer, or
    the invalid penalty applies. Raises `JudgeError` when the judge gives no verdict.
    """
    score: float | None = None
    if config.judge is not None:
        answer = _last_answer(turn_texts)
        needed = format_ok(turn_texts)[0] and not (
            config.invalid_penalty is not None and _is_invalid_answer(answer)
        )
        score = await judge(question, answer or "", golds, config.judge, client) if needed else 0.0
    return score_trajectory(turn_texts, golds, config, judge_score=score)


# --- LLM as judge -------------------------------------------------------------------------------


class JudgeError(Exception):
    """The judge gave no verdict: it kept failing, refused the request, or replied nonsense."""


class _Retryable(Exception):
    """A failed attempt worth repeating."""


class _Message(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    message: _Message


class _Completion(msgspec.Struct):
    choices: list[_Choice]


_PROMPT = """You grade answers of a question-answering system. Decide whether the predicted \
answer means the same as at least one of the labelled answers; wording may differ.

Question: {question}

Labelled answers (any one of them is right): {golds}

Predicted answer: {prediction}

Reply with a JSON object and nothing else, for example:
{{"rationale": "one or two sentences", "judgement": "correct"}}
The "judgement" is "correct" if the predicted answer is equivalent to a labelled answer, \
otherwise "incorrect"."""
# ASearcher shows the judge at most 500 characters of the prediction.
_MAX_PREDICTION_CHARS = 500
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.I)
_OBJECT = re.compile(r"\{.*\}", re.DOTALL)
_KEYED = re.compile(r"""judge?ment["'*\s]*[:=]\s*["'*]*\s*(incorrect|correct)\b""", re.I)
_BARE = re.compile(r"""^[\s"'`*.!]*(incorrect|correct)[\s"'`*.!]*$""", re.I)


def judge_prompt(question: str, prediction: str, golds: list[str]) -> str:
    """The user message that asks the judge for a verdict."""
    return _PROMPT.format(
        question=question,
        golds=json.dumps(list(golds), ensure_ascii=False),
        prediction=prediction[:_MAX_PREDICTION_CHARS],
    )


def _verdict_of(value: Any) -> bool | None:
    if not isinstance(value, dict):
        return None
    word = value.get("judgement", value.get("judgment"))
    if not isinstance(word, str) or word.strip().lower() not in ("correct", "incorrect"):
        return None
    return word.strip().lower() == "correct"


def _load_object(text: str) -> Any:
    # Single-quoted dicts and trailing commas are not JSON but are Python literals.
    for load in (json.loads, ast.literal_eval):
        with contextlib.suppress(ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return load(text)
    return None


def parse_verdict(reply: str) -> bool | None:
    """True for "correct", False for "incorrect", None when the reply says neither clearly.

    Tries, in order: the last fenced code block, the outermost `{…}` (JSON or a Python dict), a
    `"judgement": correct` pair anywhere, and a reply that is the bare word. Whole-word matching
    keeps "incorrect" from reading as "correct".
    """
    candidates = _FENCE.findall(reply)[-1:] + _OBJECT.findall(reply)
    for candidate in candidates:
        verdict = _verdict_of(_load_object(candidate.strip()))
        if verdict is not None:
            return verdict
    match = _KEYED.search(reply) or _BARE.match(reply)
    return match.group(1).lower() == "correct" if match else None


@contextlib.asynccontextmanager
async def _http(client: httpx.AsyncClient | None) -> AsyncIterator[httpx.AsyncClient]:
    if client is not None:
        yield client
        return
    async with httpx.AsyncClient() as own:
        yield own


async def _ask_once(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str], timeout: float
) -> bool:
    """One request to the judge; `_Retryable` for failures worth repeating."""
    try:
        response = await http.post(url, json=body, headers=headers, timeout=timeout)
    except httpx.TransportError as exc:  # connection failures and timeouts
        raise _Retryable(f"network error: {type(exc).__name__}: {exc}") from exc
    if response.status_code == 429 or response.status_code >= 500:
        raise _Retryable(f"HTTP {response.status_code}")
    if response.status_code >= 400:
        # Bodies are left out: some servers echo part of the key in an auth error.
        raise JudgeError(f"judge refused the request: HTTP {response.status_code}")
    try:
        content = msgspec.json.decode(response.content, type=_Completion).choices[0].message.content
    except (msgspec.DecodeError, msgspec.ValidationError, IndexError) as exc:
        raise _Retryable("reply is not a chat completion") from exc
    verdict = parse_verdict(content or "")
    if verdict is None:
        raise _Retryable(f"no verdict in reply {(content or '')[:80]!r}")
    return verdict


async def judge(
    question: str,
    prediction: str,
    golds: list[str],
    config: JudgeConfig,
    client: httpx.AsyncClient | None = None,
) -> float:
    """1.0 if the LLM judge finds `prediction` equivalent to a gold answer, else 0.0.

    Retries network errors, 429/5xx responses and replies without a verdict, up to
    `config.max_attempts` requests in all with doubling backoff; then raises `JudgeError`.
    Other 4xx responses raise `JudgeError` at once.
    """
    url = config.base_url.rstrip("/") + "/chat/completions"
    key = os.environ.get(config.api_key_env, "").strip()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {
        "model": config.model,
        "messages": [{"role": "user", "content": judge_prompt(question, prediction, golds)}],
        "temperature": config.temperature,
        "max_tokens": config.max_tokens,
    }
    last = "no attempt made"
    async with _http(client) as http:
        for attempt in range(1, config.max_attempts + 1):
            try:
                return float(await _ask_once(http, url, body, headers, config.timeout_s))
            except _Retryable as exc:
                last = str(exc)
            log.warning("judge attempt %d of %d failed: %s", attempt, config.max_attempts, last)
            if attempt < config.max_attempts:
                await asyncio.sleep(config.backoff_s * 2 ** (attempt - 1))
    raise JudgeError(
        f"judge {config.model!r} gave no verdict in {config.max_attempts} attempts: {last}"
    )
