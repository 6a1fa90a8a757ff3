"""Evaluation benchmarks: question files on disk or any fsspec URL, and the requests that play them.

Layout: `<data dir>/<benchmark>/<split>.jsonl` (or `.json`), questions in any layout
`consumers/formats/qa_files.py` reads: the reference's (`answer`, `answers` or `gt`; `id`, `idx` or
`qid`). The synthetic world's held-out questions (`qa_test.jsonl` of `write_world`) are one more
benchmark, `WORLD_BENCHMARK`.

`eval_requests` turns a benchmark into `RolloutRequested` events of purpose "eval": one group of
k samples per question, pinned to one weight version and tagged with `EVAL_KEYS` metadata so
every trajectory says which evaluation it belongs to.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import fsspec
import msgspec

from asearcher.consumers.formats.qa_files import QaFileError, QaQuestion, read_qa_file
from asearcher.streams.wire.events import (
    EVAL_KEYS,
    SCORING_KEY,
    SCORINGS,
    RolloutRequested,
    SamplingSettings,
    Scoring,
)

WORLD_BENCHMARK = "world"
WORLD_TEST_FILE = "qa_test.jsonl"


# A benchmark question is a question of any question file (see `consumers/formats/qa_files.py`).
BenchmarkQuestion = QaQuestion
BenchmarkError = QaFileError
BENCHMARK_SUFFIXES: tuple[str, ...] = (".jsonl", ".json")


def benchmark_url(data_dir: str, name: str, split: str = "test") -> str:
    """Where benchmark `name`'s `split` lives under `data_dir`: `.jsonl`, else `.json` if only
    that exists (the `.jsonl` name when neither does, for the error)."""
    stem = f"{str(data_dir).rstrip('/')}/{name}/{split}"
    for suffix in BENCHMARK_SUFFIXES:
        fs, path = fsspec.core.url_to_fs(stem + suffix)
        if fs.isfile(path):
            return stem + suffix
    return stem + BENCHMARK_SUFFIXES[0]


def read_benchmark(data_dir: str, name: str, split: str = "test") -> list[BenchmarkQuestion]:
    """The questions of `<data_dir>/<name>/<split>.jsonl` or `.json` (a path or fsspec URL).

    Raises BenchmarkError for a missing file, an object that is not a question, duplicate ids
    or a file without questions. Questions without an id are named `<name>-<split>-<n>`.
    """
    url = benchmark_url(data_dir, name, split)
    return read_qa_file(url, default_id=lambda index: f"{name}-{split}-{index}")


def read_world_benchmark(world_dir: Path | str, split: str = "test") -> list[BenchmarkQuestion]:
    """The synthetic world's questions of `split` (`qa_<split>.jsonl` written by `write_world`):
    by default the held-out ones."""
    name = WORLD_TEST_FILE if split == "test" else f"qa_{split}.jsonl"
    return read_qa_file(f"{str(world_dir).rstrip('/')}/{name}")


def benchmark_names(data_dir: str, split: str = "test") -> list[str]:
    """Sorted names of the subdirectories of `data_dir` that hold `<split>.jsonl` or `.json`."""
    fs, root = fsspec.core.url_to_fs(str(data_dir))
    if not fs.isdir(root):
        raise BenchmarkError(f"benchmark directory {data_dir} does not exist")
    names = []
    for entry in fs.ls(root, detail=True):
        if entry.get("type") != "directory":
            continue
        name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
        folder = entry["name"].rstrip("/")
        if any(fs.isfile(f"{folder}/{split}{suffix}") for suffix in BENCHMARK_SUFFIXES):
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
    scoring: Scoring = "reference",
) -> list[RolloutRequested]:
    """One evaluation request per question: k samples each, played with `policy_version`,
    scored by the reference evaluation's rules or, with `scoring` "training", the reward's."""
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
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {', '.join(SCORINGS)}, got {scoring!r}")
    values = (eval_id, benchmark, str(len(questions)), evaluator)
    metadata = {**dict(zip(EVAL_KEYS, values, strict=True)), SCORING_KEY: scoring}
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
