"""Evaluation benchmarks: question files on disk or any fsspec URL, and the requests that play them.

Layout: `<data dir>/<benchmark>/<split>.jsonl`, one JSON object per line with `question` and the
gold answer under `answer` or `gt` (a string, a number or a list of those), optionally an `id`.
The synthetic world's held-out questions (`qa_test.jsonl` of `write_world`) are one more
benchmark, `WORLD_BENCHMARK`.

`eval_requests` turns a benchmark into `RolloutRequested` events of purpose "eval": one group of
k samples per question, pinned to one weight version and tagged with `EVAL_KEYS` metadata so
every trajectory says which evaluation it belongs to.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import fsspec
import msgspec

from asearcher.consumers.world import WorldQuestion
from asearcher.streams.events import EVAL_KEYS, RolloutRequested, SamplingSettings

WORLD_BENCHMARK = "world"
WORLD_TEST_FILE = "qa_test.jsonl"


class BenchmarkQuestion(msgspec.Struct, frozen=True, kw_only=True):
    """One benchmark question with every gold answer it accepts."""

    id: str
    question: str
    answers: list[str]


class BenchmarkError(ValueError):
    """A benchmark file that cannot be used; the message is one line naming the file (and line)."""


# A line parser: (decoded JSON value, 0-based index among non-blank lines) -> question.
LineParser = Callable[[Any, int], BenchmarkQuestion]


def benchmark_url(data_dir: str, name: str, split: str = "test") -> str:
    """Where benchmark `name`'s `split` lives under `data_dir`."""
    return f"{str(data_dir).rstrip('/')}/{name}/{split}.jsonl"


def read_benchmark(data_dir: str, name: str, split: str = "test") -> list[BenchmarkQuestion]:
    """The questions of `<data_dir>/<name>/<split>.jsonl` (`data_dir`: a path or fsspec URL).

    Raises BenchmarkError for a missing file, a line that is not a valid question, duplicate ids
    or a file without questions.
    """
    url = benchmark_url(data_dir, name, split)

    def parse(value: Any, index: int) -> BenchmarkQuestion:
        return _reference_question(value, default_id=f"{name}-{split}-{index}")

    return _read_questions(url, parse)


def read_world_benchmark(world_dir: Path | str) -> list[BenchmarkQuestion]:
    """The synthetic world's held-out questions (`qa_test.jsonl` written by `write_world`)."""

    def parse(value: Any, index: int) -> BenchmarkQuestion:
        try:
            item = msgspec.convert(value, WorldQuestion)
        except msgspec.ValidationError as exc:
            raise ValueError(f"not a world question ({exc})") from exc
        return _checked(item.id, item.question, list(item.answers))

    return _read_questions(f"{str(world_dir).rstrip('/')}/{WORLD_TEST_FILE}", parse)


def benchmark_names(data_dir: str, split: str = "test") -> list[str]:
    """Sorted names of the subdirectories of `data_dir` that hold `<split>.jsonl`."""
    fs, root = fsspec.core.url_to_fs(str(data_dir))
    if not fs.isdir(root):
        raise BenchmarkError(f"benchmark directory {data_dir} does not exist")
    names = []
    for entry in fs.ls(root, detail=True):
        if entry.get("type") != "directory":
            continue
        name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
        if fs.isfile(f"{entry['name'].rstrip('/')}/{split}.jsonl"):
            names.append(name)
    return sorted(names)


def eval_requests(
    questions: Sequence[BenchmarkQuestion],
    *,
    eval_id: str,
    benchmark: str,
    k: int,
    policy_version: int,
    sampling: SamplingSettings,
    evaluator: str = "",
) -> list[RolloutRequested]:
    """One evaluation request per question: k samples each, played with `policy_version`."""
    if k < 1:
        raise ValueError(f"k (samples per question) must be at least 1, got {k}")
    if not eval_id or not benchmark:
        raise ValueError("eval_id and benchmark must not be empty")
    if policy_version < 0:
        raise ValueError(f"policy_version must be >= 0, got {policy_version}")
    ids = [q.id for q in questions]
    if len(set(ids)) != len(ids):
        # Group ids are built from question ids: a duplicate would merge two groups.
        raise ValueError(f"benchmark {benchmark} has duplicate question ids")
    values = (eval_id, benchmark, str(len(questions)), evaluator)
    metadata = dict(zip(EVAL_KEYS, values, strict=True))
    return [
        RolloutRequested(
            question_id=q.id,
            group_id=f"{eval_id}/{benchmark}/{q.id}",
            question=q.question,
            gold_answers=list(q.answers),
            # A copy each: events must not share a mutable struct.
            sampling=msgspec.structs.replace(sampling),
            group_size=k,
            purpose="eval",
            policy_version=policy_version,
            metadata=dict(metadata),
        )
        for q in questions
    ]


# ---------------------------------------------------------------- parsing


def _read_questions(url: str, parse: LineParser) -> list[BenchmarkQuestion]:
    """Every question of the JSON-lines file at `url`, each line parsed by `parse`."""
    data = _read_bytes(url)
    questions: list[BenchmarkQuestion] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            question = parse(msgspec.json.decode(line), len(questions))
        except (msgspec.DecodeError, ValueError) as exc:
            raise BenchmarkError(f"{url}:{number}: {_one_line(exc)}") from exc
        if question.id in seen:
            raise BenchmarkError(
                f"{url}:{number}: duplicate id {question.id!r} (first on line {seen[question.id]})"
            )
        seen[question.id] = number
        questions.append(question)
    if not questions:
        raise BenchmarkError(f"benchmark file {url} holds no questions")
    return questions


def _read_bytes(url: str) -> bytes:
    """The bytes at `url`; BenchmarkError when there is no such file."""
    try:
        fs, path = fsspec.core.url_to_fs(url)
        if not fs.isfile(path):
            raise BenchmarkError(f"benchmark file {url} does not exist")
        return fs.cat_file(path)
    except OSError as exc:
        raise BenchmarkError(f"benchmark file {url} cannot be read: {_one_line(exc)}") from exc


def _reference_question(value: Any, default_id: str) -> BenchmarkQuestion:
    """A question from a reference-layout object: `question`, `answer` or `gt`, optional `id`."""
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object but {type(value).__name__}")
    if "answer" in value:
        answers = _answers(value["answer"], "answer")
    elif "gt" in value:
        answers = _answers(value["gt"], "gt")
    else:
        raise ValueError("no 'answer' or 'gt' field")
    raw_id = value.get("id", default_id)
    if isinstance(raw_id, bool) or not isinstance(raw_id, str | int):
        raise ValueError(f"id must be a string or an integer, got {raw_id!r}")
    question = value.get("question")
    if not isinstance(question, str):
        raise ValueError("no 'question' string")
    return _checked(str(raw_id), question, answers)


def _answers(value: Any, field: str) -> list[str]:
    """The gold answers of an `answer`/`gt` value: a scalar or a non-empty list of scalars."""
    items = value if isinstance(value, list) else [value]
    if not items:
        raise ValueError(f"'{field}' is an empty list")
    answers = []
    for item in items:
        # bool is an int in Python but no answer: true/false in a file is more likely a mistake.
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise ValueError(f"'{field}' must hold strings or numbers, got {item!r}")
        answers.append(_number_text(item) if not isinstance(item, str) else item)
    return answers


def _number_text(number: int | float) -> str:
    """A JSON number as answer text; 3.0 is "3", as a person would write it."""
    if isinstance(number, float) and math.isfinite(number) and number.is_integer():
        return str(int(number))
    return str(number)


def _checked(qid: str, question: str, answers: list[str]) -> BenchmarkQuestion:
    """A question after the checks every source shares."""
    if not qid:
        raise ValueError("empty id")
    if not question.strip():
        raise ValueError("empty question")
    if not answers:
        raise ValueError("no gold answers")
    if any(not a.strip() for a in answers):
        # An empty gold answer would count an empty prediction as correct.
        raise ValueError(f"an empty gold answer in {answers!r}")
    return BenchmarkQuestion(id=qid, question=question, answers=answers)


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line."""
    return " ".join(str(exc).split()) or type(exc).__name__
