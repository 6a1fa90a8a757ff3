"""Question files as users have them: the reference's layouts, JSON lines or one JSON array.

One reader for every question file the system takes in: training QA files (the feeder,
`rollout request`), evaluation benchmarks and the synthetic world's own splits. A question is an
object with
- `question`, a non-empty string;
- its gold answers under `answer`, `answers` or `gt` (first present wins): a string, a number or
  a non-empty list of those;
- optionally `aug_answer` (or `aug_answers`): more accepted phrasings, which the training reward
  blends in as the reference does (see `consumers.reward.blend_augmented`);
- an id under `id`, `idx`, `qid` or `query_id` (string or integer), else one made from its
  position;
- optionally, as the synthetic world writes them, `kind` (its template), `hops` (the reads it
  takes) and `supporting_urls` (the pages its answer is read from, in order), for the feeder's
  curricula and the training reward's `page_reward`.

`.json` files hold a JSON array of such objects; any other name is read as JSON lines. A question
without a readable gold answer is refused with one line naming the file, the line (or item) and
the fields the object has: trained on, it would earn every trajectory 0 and never move the policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import fsspec
import msgspec

from asearcher.streams.wire.events import Purpose, RolloutRequested, SamplingSettings

GOLD_FIELDS: tuple[str, ...] = ("answer", "answers", "gt")
AUGMENTED_FIELDS: tuple[str, ...] = ("aug_answer", "aug_answers")
ID_FIELDS: tuple[str, ...] = ("id", "idx", "qid", "query_id")


class QaQuestion(msgspec.Struct, frozen=True, kw_only=True):
    """One question with every gold answer it accepts."""

    id: str
    question: str
    answers: list[str]
    # More phrasings of the answer (the reference's `aug_answer`); they raise a training reward
    # by at most 30 % of the gap (see `blend_augmented`) and are not used in evaluation.
    aug_answers: list[str] = []
    # What sort of question it is (a synthetic world's template, e.g. "person:occupation"),
    # for a curriculum that tracks kinds (`flat_kinds.py`); "" where the file says nothing.
    kind: str = ""
    # The reads it takes (a synthetic world's question says; 0 where the file does not), for a
    # feed that plays longer questions more often (the feeder's `plays_by_hops`).
    hops: int = 0
    # The pages the answer is read from, in order (a synthetic world's question names them;
    # empty where the file does not), for a training reward that pays for opening them.
    supporting_urls: list[str] = []

    def request(
        self, *, group_id: str, sampling: SamplingSettings, group_size: int, purpose: Purpose,
        metadata: dict[str, str] | None = None,
    ) -> RolloutRequested:  # fmt: skip
        """The request to play this question: its gold answers and pages go with it."""
        return RolloutRequested(
            question_id=self.id, group_id=group_id, question=self.question,
            gold_answers=list(self.answers), aug_answers=list(self.aug_answers),
            supporting_urls=list(self.supporting_urls), sampling=sampling,
            group_size=group_size, purpose=purpose, metadata=metadata or {},
        )  # fmt: skip


class QaFileError(ValueError):
    """A question file that cannot be used; the message is one line naming the file (and line)."""


# (position among questions, 0-based) -> the id of a question that names none
DefaultId = Callable[[int], str]


def read_qa_file(url: str, default_id: DefaultId | None = None) -> list[QaQuestion]:
    """Every question of the file at `url` (a path or fsspec URL), checked.

    Raises QaFileError for a missing or unreadable file, an object that is not a question (no
    gold answer, no question text), duplicate ids or a file without questions.
    """
    make_id = default_id or (lambda index: str(index))
    questions: list[QaQuestion] = []
    seen: dict[str, str] = {}
    for (where, label), value in _items(url):
        try:
            question = parse_question(value, make_id(len(questions)))
        except ValueError as exc:
            raise QaFileError(f"{url}:{where}: {one_line(exc)}") from exc
        if question.id in seen:
            raise QaFileError(
                f"{url}:{where}: duplicate id {question.id!r} (first on {seen[question.id]})"
            )
        seen[question.id] = label
        questions.append(question)
    if not questions:
        raise QaFileError(f"QA file {url} holds no questions")
    return questions


def parse_question(value: Any, default_id: str) -> QaQuestion:
    """A question from one decoded object of a question file; ValueError says what is wrong."""
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object but {type(value).__name__}")
    gold_field = next((name for name in GOLD_FIELDS if name in value), None)
    if gold_field is None:
        fields = ", ".join(sorted(map(str, value))) or "none"
        raise ValueError(
            f"no gold answer: expected one of {', '.join(GOLD_FIELDS)}; its fields: {fields}"
        )
    answers = answer_texts(value[gold_field], gold_field)
    aug_field = next((name for name in AUGMENTED_FIELDS if name in value), None)
    aug = [] if aug_field is None else answer_texts(value[aug_field], aug_field, empty_ok=True)
    question = value.get("question")
    if not isinstance(question, str):
        raise ValueError("no 'question' string")
    kind = value.get("kind", "")
    if not isinstance(kind, str):
        raise ValueError(f"'kind' must be a string, got {kind!r}")
    hops = value.get("hops", 0)
    if isinstance(hops, bool) or not isinstance(hops, int) or hops < 0:
        raise ValueError(f"'hops' must be a whole number >= 0, got {hops!r}")
    urls = value.get("supporting_urls") or []
    if not isinstance(urls, list) or not all(isinstance(url, str) and url.strip() for url in urls):
        raise ValueError(f"'supporting_urls' must be a list of URLs, got {urls!r}")
    checked = checked_question(_id_of(value, default_id), question, answers, aug, kind, hops)
    return msgspec.structs.replace(checked, supporting_urls=[url.strip() for url in urls])


def answer_texts(value: Any, field: str, *, empty_ok: bool = False) -> list[str]:
    """The answers of a gold field: a scalar or a list of scalars, numbers written as text."""
    if value is None and empty_ok:
        return []
    items = value if isinstance(value, list) else [value]
    if not items and not empty_ok:
        raise ValueError(f"'{field}' is an empty list")
    texts = []
    for item in items:
        # bool is an int in Python but no answer: true/false in a file is more likely a mistake.
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise ValueError(f"'{field}' must hold strings or numbers, got {item!r}")
        texts.append(item if isinstance(item, str) else _number_text(item))
    return texts


def checked_question(
    qid: str,
    question: str,
    answers: list[str],
    aug_answers: list[str] | None = None,
    kind: str = "",
    hops: int = 0,
) -> QaQuestion:
    """A question after the checks every source shares."""
    if not qid:
        raise ValueError("empty id")
    if not question.strip():
        raise ValueError("empty question")
    if not answers:
        raise ValueError("no gold answers")
    for name, texts in (("gold", answers), ("augmented", aug_answers or [])):
        if any(not text.strip() for text in texts):
            # An empty answer would count an empty prediction as correct.
            raise ValueError(f"an empty {name} answer in {texts!r}")
    return QaQuestion(
        id=qid,
        question=question,
        answers=answers,
        aug_answers=aug_answers or [],
        kind=kind,
        hops=hops,
    )


def one_line(exc: BaseException) -> str:
    """An exception's message on one line."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _id_of(value: dict[str, Any], default: str) -> str:
    field = next((name for name in ID_FIELDS if value.get(name) is not None), None)
    if field is None:
        return default
    raw = value[field]
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise ValueError(f"{field} must be a string or an integer, got {raw!r}")
    return str(raw)


def _number_text(number: int | float) -> str:
    """A JSON number as answer text; 3.0 is "3", as a person would write it."""
    if isinstance(number, float) and math.isfinite(number) and number.is_integer():
        return str(int(number))
    return str(number)


def _items(url: str) -> list[tuple[tuple[str, str], Any]]:
    """((where, label), decoded object) for every question: ("3", "line 3") or ("item 3", …)."""
    data = _read_bytes(url)
    if url.endswith(".json"):
        try:
            values = msgspec.json.decode(data)
        except msgspec.DecodeError as exc:
            raise QaFileError(f"{url}: not a JSON document ({one_line(exc)})") from exc
        if not isinstance(values, list):
            raise QaFileError(f"{url}: a .json question file holds a JSON array of questions")
        return [((f"item {number}",) * 2, value) for number, value in enumerate(values, start=1)]
    items = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            items.append(((str(number), f"line {number}"), msgspec.json.decode(line)))
        except msgspec.DecodeError as exc:
            raise QaFileError(f"{url}:{number}: {one_line(exc)}") from exc
    return items


def _read_bytes(url: str) -> bytes:
    """The bytes at `url`; QaFileError when there is no such file."""
    try:
        fs, path = fsspec.core.url_to_fs(url)
        if not fs.isfile(path):
            raise QaFileError(f"QA file {url} does not exist")
        return fs.cat_file(path)
    except OSError as exc:
        raise QaFileError(f"QA file {url} cannot be read: {one_line(exc)}") from exc
