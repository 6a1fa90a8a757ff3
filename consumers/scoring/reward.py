"""Rewards for search-agent trajectories, scored as ASearcher scores them.

Inputs are the texts of one trajectory's LLM calls (think calls and action calls alike) and the
gold answers of its question; the output is a `RewardBreakdown`: the reward the trainer uses plus
every metric, for logging.
Components:
- metrics, each the max over the gold answers: `f1_score` (token sets, punctuation becomes a
  space), `exact_match` (SQuAD normalisation) and `cover_exact_match` (every gold token appears
  among the prediction's tokens). Their keyword defaults are ASearcher's evaluation
  (`evaluation/evaluate.py`); `RewardConfig`'s defaults are its training reward
  (`utils/rewards.py`: "True"/"False" read as "yes"/"no", CJK golds scored per character);
- `extract_answer` (the last `<answer>`) and `format_ok`, ASearcher's per-call format check: a
  trajectory failing it earns 0 whatever its answer;
- `page_reward` (off by default, not the reference's): a training reward can also pay for the
  share of the question's supporting pages the trajectory opened (`pages_read_share`);
- `score_trajectory` (synchronous) and `score_trajectory_with_judge`, which first asks an
  LLM judge (`judge`, any OpenAI-compatible endpoint) whether the answer is right. Both apply
  the invalid-question penalty when the prompt told the model to find the most likely answer.

The judge is asked through `consumers/scoring/chat_endpoint.py` (shared with the synthesis roles):
its API key comes from an environment variable and travels only in the request header, never logged
and never part of an error; its retries go through `streams.service.backoff`.
"""

from __future__ import annotations

import json
import math
import re
import string
from collections.abc import Callable, Collection
from typing import Annotated, Any, Literal

import httpx
import msgspec
from msgspec import Meta

from asearcher.consumers.formats.action_format import (
    ACTION_CLOSE_TAGS,
    ACTION_OPEN_TAGS,
    ACTION_TAGS,
    ROLE_WORDS,
    THINK_CLOSE,
    THINK_TAG,
)
from asearcher.consumers.formats.prompt_templates import TEMPLATE_FIELDS, check_template, render
from asearcher.consumers.scoring.chat_endpoint import (
    ChatEndpointConfig,
    EndpointError,
    complete,
    json_objects,
)
from asearcher.streams.service.log import get_logger

log = get_logger(__name__)

Metric = Literal["f1", "em", "cem", "judge"]
FormatCheck = Literal["reference", "nested"]
# ASearcher penalises an answer containing any of these (case-sensitive substrings, so "Valid"
# does not count but "invalid", "validity" and "questions" do).
INVALID_MARKERS: tuple[str, ...] = ("question", "invalid", "appropriate", "valid")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_WHITESPACE = re.compile(r"\s+")
# Only these exact strings are mapped, as in ASearcher: "true" or " True" stay as they are.
_BOOL_WORDS = {"True": "yes", "False": "no"}
# ASearcher's CJK ranges: unified ideographs, extension A, compatibility ideographs.
_CJK_RANGES = (("\u4e00", "\u9fff"), ("\u3400", "\u4dbf"), ("\uf900", "\ufaff"))
_CJK_DROPPED = "0123456789，。 ,.-"


# --- metrics ------------------------------------------------------------------------------------


def bool_map(text: str) -> str:
    """ASearcher's `bool_mapping`: exactly "True" is "yes", exactly "False" is "no"."""
    return _BOOL_WORDS.get(text, text)


def _unchanged(text: str) -> str:
    return text


def _mapper(bool_mapping: bool) -> Callable[[str], str]:
    return bool_map if bool_mapping else _unchanged


def squad_normalize(text: str) -> str:
    """SQuAD normalisation: lowercase, delete punctuation and the articles a/an/the, one space."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def f1_normalize(text: str) -> str:
    """ASearcher's F1 normalisation: punctuation becomes a space ("U.S.A." is "u s a")."""
    for mark in string.punctuation:
        text = text.replace(mark, " ")
    return _WHITESPACE.sub(" ", text).strip().lower()


def _has_cjk(text: str) -> bool:
    return any(low <= ch <= high for ch in text for low, high in _CJK_RANGES)


def _cjk_tokens(text: str) -> set[str]:
    """Characters, plus runs of digits, as ASearcher tokenises when the gold is Chinese."""
    numbers: list[str] = []
    for index, ch in enumerate(text):
        if ch.isdigit():
            if index > 0 and text[index - 1].isdigit():
                numbers[-1] += ch
            else:
                numbers.append(ch)
    return {ch for ch in text if ch not in _CJK_DROPPED} | set(numbers)


def _max_over(golds: list[str], score: Callable[[str], float]) -> float:
    # A bare string would otherwise be scored character by character.
    if isinstance(golds, str):
        golds = [golds]
    return max((score(gold) for gold in golds), default=0.0)


def _f1_sets(prediction: set[str], gold: set[str]) -> float:
    common = len(prediction & gold)
    if common == 0:  # also covers an empty side
        return 0.0
    precision, recall = common / len(prediction), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def f1_score(
    prediction: str, golds: list[str], *, bool_mapping: bool = False, cjk: bool = False
) -> float:
    """Token-set F1 of `prediction` against the best gold answer (0 if either side is empty).

    `bool_mapping` reads "True"/"False" as "yes"/"no" on both sides; `cjk` scores a gold with
    Chinese characters (and the prediction against it) by characters and digit runs. Both are
    on in ASearcher's training reward and off in its evaluation (the defaults).
    """
    mapping = _mapper(bool_mapping)
    predicted = f1_normalize(mapping(prediction))

    def one(gold: str) -> float:
        normalized = f1_normalize(mapping(gold))
        if cjk and _has_cjk(normalized):
            return _f1_sets(_cjk_tokens(predicted), _cjk_tokens(normalized))
        return _f1_sets(set(predicted.split()), set(normalized.split()))

    return _max_over(golds, one)


def exact_match(prediction: str, golds: list[str], *, bool_mapping: bool = False) -> float:
    """1.0 when `prediction` equals some gold answer after SQuAD normalisation, else 0.0.

    `bool_mapping` as in `f1_score`: on in ASearcher's training reward, off in its evaluation.
    """
    mapping = _mapper(bool_mapping)
    normalized = squad_normalize(mapping(prediction))
    return _max_over(golds, lambda gold: float(squad_normalize(mapping(gold)) == normalized))


def _cem_tokens(text: str) -> list[str]:
    # split(" ") rather than split(): an empty text gives [""], as in ASearcher.
    return squad_normalize(bool_map(text)).split(" ")


def cover_exact_match(prediction: str, golds: list[str]) -> float:
    """ASearcher's CEM: 1.0 when every token of some gold answer is a token of the prediction.

    Both sides go through `bool_map` (both ASearcher's training and evaluation CEM do so), SQuAD
    normalisation and a split on single spaces. Order and repetition do not matter. A gold that
    normalises to nothing (say "the") is the token list [""], so it matches only a prediction
    that also normalises to nothing.
    """
    tokens = _cem_tokens(prediction)
    return _max_over(golds, lambda gold: float(all(t in tokens for t in _cem_tokens(gold))))


# --- answer and format --------------------------------------------------------------------------


def extract_answer(text: str) -> str | None:
    """The stripped content of the last `<answer>…</answer>` in `text`; None if there is none."""
    matches = _ANSWER.findall(text)
    return matches[-1].strip() if matches else None


def call_format_error(text: str) -> str | None:
    """Which of ASearcher's per-call format rules one LLM call's text breaks, or None.

    The rules: each action's opening and closing tags occur equally often; at most one action
    opening tag; no "Assistant" or "assistant"; at most one `</think>`.
    """
    for opening, closing in zip(ACTION_OPEN_TAGS, ACTION_CLOSE_TAGS, strict=True):
        if text.count(opening) != text.count(closing):
            return f"unbalanced {opening}"
    actions = sum(text.count(opening) for opening in ACTION_OPEN_TAGS)
    if actions > 1:
        return f"{actions} action tags"
    for word in ROLE_WORDS:
        if word in text:
            return f"writes {word!r}"
    thinks = text.count(THINK_CLOSE)
    if thinks > 1:
        return f"{thinks} {THINK_CLOSE}"
    return None


_NESTED_TAG = re.compile(rf"<(/?)({'|'.join((*ACTION_TAGS, THINK_TAG))})>")


def _nested_error(text: str) -> str | None:
    """The stricter check of earlier versions: tags nest, think included; one action at most."""
    stack: list[str] = []
    actions = 0
    for match in _NESTED_TAG.finditer(text):
        closing, tag = match.group(1) == "/", match.group(2)
        if not closing:
            stack.append(tag)
            actions += tag in ACTION_TAGS
        elif not stack or stack.pop() != tag:
            return f"unbalanced <{tag}>"
    if stack:
        return f"unbalanced <{stack[-1]}>"
    return f"{actions} actions" if actions > 1 else None


def format_ok(turn_texts: list[str], check: FormatCheck = "reference") -> tuple[bool, str]:
    """Whether every LLM call of a trajectory is well formed, and if not, which and why.

    "reference" is ASearcher's check (`call_format_error` on every call); a trajectory without
    an answer passes it (and scores 0 for having no answer). "nested" is the stricter check of
    earlier versions: tags nest properly (think included, so a prompt that opens `<think>` for
    the model fails it), at most one action per call, and the last call holds an answer. Calls
    count from 1: "call 3: 2 action tags", "call 1: writes 'Assistant'", "no answer".
    """
    error_of = call_format_error if check == "reference" else _nested_error
    for number, text in enumerate(turn_texts, start=1):
        error = error_of(text)
        if error is not None:
            return False, f"call {number}: {error}"
    if check == "nested" and (not turn_texts or extract_answer(turn_texts[-1]) is None):
        return False, "no answer"
    return True, ""


def last_answer(turn_texts: list[str]) -> str | None:
    """The trajectory's answer: the last `<answer>…</answer>` over its calls, stripped."""
    # Per call, so an unclosed tag in one call never pairs with a closing tag in the next.
    for text in reversed(turn_texts):
        answer = extract_answer(text)
        if answer is not None:
            return answer
    return None


def is_invalid_answer(answer: str | None) -> bool:
    """Whether `answer` calls the question invalid, by ASearcher's substring test."""
    return answer is not None and any(marker in answer for marker in INVALID_MARKERS)


# --- configuration and trajectory rewards -------------------------------------------------------


class JudgeConfig(ChatEndpointConfig, kw_only=True, forbid_unknown_fields=True):
    """An LLM judge behind an OpenAI-compatible chat-completions endpoint (see `ChatEndpointConfig`
    for the fields)."""

    temperature: Annotated[float, Meta(description="ASearcher's judge setting")] = 0.6
    max_tokens: Annotated[int, Meta(description="room for the rationale before the verdict")] = 1024
    prompt_file: Annotated[
        str,
        Meta(
            description=(
                "A file with the judge's prompt in the user's wording: {prediction}, "
                '{question}, {golds} (a JSON list); "" keeps the project\'s. Its reply is '
                "parsed as the project's (a verdict)."
            )
        ),
    ] = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.prompt_file:
            check_template(self.prompt_file, TEMPLATE_FIELDS["judge"], "judge.prompt_file")


class RewardConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How a trajectory's reward is computed. Every field has a default: ASearcher's training."""

    metric: Annotated[
        Metric, Meta(description="the metric that becomes the reward: f1 | em | cem | judge")
    ] = "f1"
    bool_mapping: Annotated[
        bool,
        Meta(
            description=(
                '"True"/"False" read as "yes"/"no" in F1 and EM (CEM always maps, as in ASearcher)'
            )
        ),
    ] = True
    cjk_f1: Annotated[
        bool, Meta(description="F1 against a Chinese gold by characters and digit runs")
    ] = True
    format_check: Annotated[
        FormatCheck, Meta(description="reference (ASearcher's) | nested (stricter)")
    ] = "reference"
    invalid_penalty: Annotated[
        float | None,
        Meta(
            description=(
                "The reward of an answer calling the question invalid when the prompt asked "
                "for the most likely answer (see `score_trajectory`); None: no penalty."
            )
        ),
    ] = -0.5
    format_penalty: Annotated[
        float | None,
        Meta(
            description=(
                "The reward of a trajectory failing the format check; None: 0, as the "
                "reference (a broken call then earns what a wrong answer earns)."
            )
        ),
    ] = None
    judge: Annotated[
        JudgeConfig | None,
        Meta(description='needed for metric "judge"; when set, always consulted'),
    ] = None
    page_reward: Annotated[
        float,
        Meta(
            description=(
                "Added to a training reward for opening the pages the answer is read from "
                "(the request's supporting URLs), times the share of them opened: 0.2 with 1 "
                "of 2 opened adds 0.1. Not for a format failure or a penalised answer; "
                "evaluation never adds it. 0: the reward pays for the answer alone, as the "
                "reference's does."
            )
        ),
    ] = 0.0
    judge_every_answer: Annotated[
        bool,
        Meta(
            description=(
                "Ask the judge about every answer, a missing one or a format failure "
                "included, as the reference's evaluation does (training asks only where the "
                "answer can earn a reward)."
            )
        ),
    ] = False

    def __post_init__(self) -> None:
        if self.metric == "judge" and self.judge is None:
            raise ValueError("metric 'judge' needs a [judge] table (field `judge`)")
        for name in ("invalid_penalty", "format_penalty"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value}")
        if not (math.isfinite(self.page_reward) and self.page_reward >= 0):
            raise ValueError(f"page_reward must be a finite number >= 0, got {self.page_reward}")


def evaluation_scoring(config: RewardConfig) -> RewardConfig:
    """`config` as the reference's evaluation scores (`evaluation/evaluate.py`): F1 and EM with
    no True/False mapping and no per-character Chinese F1, the judge asked about every answer,
    no invalid-answer or format penalty. (CEM maps True/False in both, as the reference does.)"""
    return msgspec.structs.replace(
        config,
        bool_mapping=False,
        cjk_f1=False,
        judge_every_answer=True,
        invalid_penalty=None,
        format_penalty=None,
        page_reward=0.0,
    )


def answer_reward(reward: float, parts: dict[str, float]) -> float:
    """A trajectory's reward less what `page_reward` added: what its answer earned."""
    return reward - parts.get("page_bonus", 0.0)


def pages_read_share(opened: Collection[str], supporting_urls: list[str]) -> float | None:
    """The share of `supporting_urls` among the pages a trajectory `opened`; None where the
    question names no supporting pages."""
    if not supporting_urls:
        return None
    wanted = {url.strip() for url in supporting_urls}
    return len(wanted & {url.strip() for url in opened}) / len(wanted)


class RewardBreakdown(msgspec.Struct, kw_only=True):
    """A trajectory's reward and the scores behind it."""

    reward: float  # what the trainer uses
    answer: str | None  # the last answer written, None if there is none
    # "format", "f1", "em", "cem"; "judge", "invalid", "pages_read" and "page_bonus" when used
    parts: dict[str, float]
    format_error: str | None = None  # which call broke which format rule


def _metrics(answer: str | None, golds: list[str], config: RewardConfig) -> dict[str, float]:
    if answer is None:  # ASearcher scores a trajectory without an answer 0 on every metric
        return {"f1": 0.0, "em": 0.0, "cem": 0.0}
    mapping = config.bool_mapping
    return {
        "f1": f1_score(answer, golds, bool_mapping=mapping, cjk=config.cjk_f1),
        "em": exact_match(answer, golds, bool_mapping=mapping),
        "cem": cover_exact_match(answer, golds),
    }


# The reference's blend of augmented answers (`utils/search_tool.py`): 0.7 x the score on the gold
# answers + 0.3 x the better of that and the score on the augmented ones.
AUGMENTED_WEIGHT = 0.3


def blend_augmented(score: float, augmented_score: float) -> float:
    """A training score raised by an augmented answer's score, as the reference blends them."""
    return (1 - AUGMENTED_WEIGHT) * score + AUGMENTED_WEIGHT * max(score, augmented_score)


def _augmented_part(answer: str | None, aug_golds: list[str], config: RewardConfig) -> float | None:
    """The reward metric on the augmented answers, when there are any and the metric is lexical."""
    if not aug_golds or config.metric == "judge":
        return None
    return _metrics(answer, aug_golds, config)[config.metric]


def _penalised(answer: str | None, config: RewardConfig, valid_instruction: bool) -> bool:
    return config.invalid_penalty is not None and valid_instruction and is_invalid_answer(answer)


def score_trajectory(
    turn_texts: list[str],
    golds: list[str],
    config: RewardConfig,
    judge_score: float | None = None,
    *,
    valid_instruction: bool = True,
    aug_golds: list[str] | None = None,
    pages_read: float | None = None,
) -> RewardBreakdown:
    """Score one trajectory as ASearcher does: the configured metric times the format reward.

    `turn_texts` are the texts of every LLM call, think calls included; the answer is the last
    `<answer>` among them. A call failing the format check makes the format reward 0, and so the
    reward. Then, if `valid_instruction` (the prompt asked for the most likely answer rather than
    allowing "the question is invalid") and the answer calls the question invalid, the reward is
    `invalid_penalty` instead, format failure or not; otherwise a format failure earns
    `format_penalty` when one is set. Metric "judge" needs the verdict as
    `judge_score` (see `score_trajectory_with_judge`, which asks for it). With `aug_golds` (a
    question's augmented answers) a lexical metric is blended as the reference does
    (`blend_augmented`; the part "aug" is the metric on them). With `pages_read` (the share of
    the question's supporting pages opened, `pages_read_share`) a well-formed, unpenalised
    trajectory earns `page_reward` times it on top (the parts "pages_read", the share, and
    "page_bonus", what it added; a format failure or penalised answer gets none, a trajectory
    that opens the pages and never answers gets it).
    """
    if config.metric == "judge" and judge_score is None:
        raise ValueError("metric 'judge' needs judge_score; use score_trajectory_with_judge")
    ok, reason = format_ok(turn_texts, config.format_check)
    answer = last_answer(turn_texts)
    parts = {"format": float(ok), **_metrics(answer, golds, config)}
    if judge_score is not None:
        parts["judge"] = judge_score
    score = parts[config.metric]
    augmented = _augmented_part(answer, aug_golds or [], config)
    if augmented is not None:
        parts["aug"] = augmented
        score = blend_augmented(score, augmented)
    reward = score * parts["format"]
    if pages_read is not None:
        parts["pages_read"] = pages_read
        # Its own part, so consumers that want the answer's score alone (cloning) take it out.
        parts["page_bonus"] = config.page_reward * pages_read if ok else 0.0
        reward += parts["page_bonus"]
    if not ok and config.format_penalty is not None:
        reward = config.format_penalty
    if config.invalid_penalty is not None:
        penalised = _penalised(answer, config, valid_instruction)
        parts["invalid"] = float(penalised)
        if penalised:
            reward = config.invalid_penalty
    return RewardBreakdown(
        reward=reward, answer=answer, parts=parts, format_error=None if ok else reason
    )


async def score_trajectory_with_judge(
    turn_texts: list[str],
    golds: list[str],
    config: RewardConfig,
    question: str,
    client: httpx.AsyncClient | None = None,
    *,
    valid_instruction: bool = True,
    aug_golds: list[str] | None = None,
    pages_read: float | None = None,
) -> RewardBreakdown:
    """`score_trajectory`, after asking `config.judge` about the answer when it can matter.

    The judge is not called (its part is 0) when the format check fails, there is no answer, or
    the invalid penalty applies. Raises `JudgeError` when the judge gives no verdict.
    """
    score: float | None = None
    if config.judge is not None:
        answer = last_answer(turn_texts)
        needed = config.judge_every_answer or (
            answer is not None
            and format_ok(turn_texts, config.format_check)[0]
            and not _penalised(answer, config, valid_instruction)
        )
        # The reference's evaluation shows the judge the answer up to its first "</".
        shown = (answer or "").split("</", 1)[0] if config.judge_every_answer else answer or ""
        score = await judge(question, shown, golds, config.judge, client) if needed else 0.0
    return score_trajectory(
        turn_texts, golds, config, judge_score=score, valid_instruction=valid_instruction,
        aug_golds=aug_golds, pages_read=pages_read,
    )  # fmt: skip


# --- LLM as judge -------------------------------------------------------------------------------


class JudgeError(EndpointError):
    """The judge gave no verdict: it kept failing, refused the request, or replied nonsense."""


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
_KEYED = re.compile(r"""judge?ment["'*\s]*[:=]\s*["'*]*\s*(incorrect|correct)\b""", re.I)
_BARE = re.compile(r"""^[\s"'`*.!]*(incorrect|correct)[\s"'`*.!]*$""", re.I)


def judge_prompt(question: str, prediction: str, golds: list[str], template: str = "") -> str:
    """The user message that asks the judge for a verdict (from file `template` if given)."""
    values = {
        "question": question,
        "golds": json.dumps(list(golds), ensure_ascii=False),
        "prediction": prediction[:_MAX_PREDICTION_CHARS],
    }
    if template:
        return render(template, "judge", "judge.prompt_file", **values)
    return _PROMPT.format(**values)


def _verdict_of(value: Any) -> bool | None:
    if not isinstance(value, dict):
        return None
    word = value.get("judgement", value.get("judgment"))
    if not isinstance(word, str) or word.strip().lower() not in ("correct", "incorrect"):
        return None
    return word.strip().lower() == "correct"


def parse_verdict(reply: str) -> bool | None:
    """True for "correct", False for "incorrect", None when the reply says neither clearly.

    Tries, in order: each JSON object of the reply (`chat_endpoint.json_objects`: the last
    fenced code block, the outermost `{…}` as JSON or a Python dict, then balanced objects), a
    `"judgement": correct` pair anywhere, and a reply that is the bare word. Whole-word matching
    keeps "incorrect" from reading as "correct".
    """
    for value in json_objects(reply):
        verdict = _verdict_of(value)
        if verdict is not None:
            return verdict
    match = _KEYED.search(reply) or _BARE.match(reply)
    return match.group(1).lower() == "correct" if match else None


async def judge(
    question: str,
    prediction: str,
    golds: list[str],
    config: JudgeConfig,
    client: httpx.AsyncClient | None = None,
) -> float:
    """1.0 if the LLM judge finds `prediction` equivalent to a gold answer, else 0.0.

    One request through `chat_endpoint.complete`: network errors, 429/5xx responses and replies
    without a verdict are retried (`config.backoff()`: jittered exponential waits, a server's
    Retry-After honoured, at most `max_attempts` requests and `max_total_backoff_s` of waiting);
    then `JudgeError` is raised. Other 4xx responses raise `JudgeError` at once.
    """
    prompt = judge_prompt(question, prediction, golds, config.prompt_file)
    try:
        verdict = await complete(
            prompt, config, parse_verdict, client, what=f"judge {config.model!r}"
        )
    except EndpointError as exc:
        raise JudgeError(str(exc)) from exc
    return float(verdict)
