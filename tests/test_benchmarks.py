"""Benchmark files: the reference layout, its errors, the world's test split, eval requests."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import fsspec
import pytest

from asearcher.consumers.evaluation.benchmarks import (
    WORLD_BENCHMARK,
    BenchmarkError,
    BenchmarkQuestion,
    benchmark_names,
    eval_requests,
    read_benchmark,
    read_world_benchmark,
)
from asearcher.consumers.world.world import generate_world, write_world
from asearcher.streams.wire.events import EVAL_KEYS, SamplingSettings


def write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_read_benchmark_reference_layout_with_gt_lists_and_numbers(tmp_path: Path) -> None:
    lines = [
        json.dumps({"question": "Capital of France?", "answer": "Paris"}),
        "",  # blank lines are skipped and do not count towards default ids
        json.dumps({"question": "Two rivers?", "gt": ["Rhine", "Danube"]}),
        json.dumps({"question": "Founded when?", "answer": [1990]}),
        json.dumps({"question": "Ratio?", "gt": 2.5, "id": "custom"}),
        json.dumps({"question": "Count?", "answer": 3.0, "extra": "ignored"}),
        json.dumps({"question": "Numbered?", "answer": ["x", 7], "id": 42}),
        json.dumps({"question": "Both fields?", "answer": "from answer", "gt": "from gt"}),
    ]
    write_lines(tmp_path / "nq" / "test.jsonl", lines)

    questions = read_benchmark(str(tmp_path), "nq")

    assert questions == [
        BenchmarkQuestion(id="nq-test-0", question="Capital of France?", answers=["Paris"]),
        BenchmarkQuestion(id="nq-test-1", question="Two rivers?", answers=["Rhine", "Danube"]),
        BenchmarkQuestion(id="nq-test-2", question="Founded when?", answers=["1990"]),
        BenchmarkQuestion(id="custom", question="Ratio?", answers=["2.5"]),
        BenchmarkQuestion(id="nq-test-4", question="Count?", answers=["3"]),
        BenchmarkQuestion(id="42", question="Numbered?", answers=["x", "7"]),
        BenchmarkQuestion(id="nq-test-6", question="Both fields?", answers=["from answer"]),
    ]


def test_read_benchmark_other_split_names_default_ids_after_it(tmp_path: Path) -> None:
    write_lines(tmp_path / "bamboogle" / "dev.jsonl", [json.dumps({"question": "Q", "gt": "A"})])

    questions = read_benchmark(str(tmp_path), "bamboogle", split="dev")

    assert [q.id for q in questions] == ["bamboogle-dev-0"]
    with pytest.raises(BenchmarkError, match="test.jsonl"):
        read_benchmark(str(tmp_path), "bamboogle")


def test_read_benchmark_from_memory_url() -> None:
    root = f"memory://bench-{uuid.uuid4().hex}"
    with fsspec.open(f"{root}/musique/test.jsonl", "w") as out:
        out.write(json.dumps({"question": "Who?", "answer": ["Ada", "Ada Lovelace"]}) + "\n")

    questions = read_benchmark(root, "musique")

    assert questions == [
        BenchmarkQuestion(id="musique-test-0", question="Who?", answers=["Ada", "Ada Lovelace"])
    ]


GOOD = json.dumps({"question": "Q", "answer": "A"})


@pytest.mark.parametrize(
    ("lines", "line", "why"),
    [
        ([GOOD, "{not json"], 2, "malformed|invalid|expected"),
        ([GOOD, "[1, 2]"], 2, "not a JSON object"),
        ([json.dumps({"answer": "A"})], 1, "question"),
        ([json.dumps({"question": "   ", "answer": "A"})], 1, "empty question"),
        ([GOOD, json.dumps({"question": "Q", "src": "x"})], 2, "no gold.*fields: question, src"),
        ([json.dumps({"question": "Q", "gt": []})], 1, "empty list"),
        ([json.dumps({"question": "Q", "answer": {"a": 1}})], 1, "strings or numbers"),
        ([json.dumps({"question": "Q", "answer": True})], 1, "strings or numbers"),
        ([json.dumps({"question": "Q", "answer": ["A", ""]})], 1, "empty gold answer"),
        ([json.dumps({"question": "Q", "answer": "A", "id": [1]})], 1, "id must be"),
        (
            [
                json.dumps({"question": "Q", "answer": "A", "id": "x"}),
                "",
                GOOD,
                GOOD.replace("{", '{"id": "x", ', 1),
            ],
            4,
            "duplicate id 'x'.*line 1",
        ),
        # An explicit id that collides with a later line's default id is a duplicate too.
        ([json.dumps({"question": "Q", "answer": "A", "id": "nq-test-1"}), GOOD], 2, "duplicate"),
    ],
)
def test_read_benchmark_bad_line_names_file_and_line(
    tmp_path: Path, lines: list[str], line: int, why: str
) -> None:
    path = write_lines(tmp_path / "nq" / "test.jsonl", lines)

    with pytest.raises(BenchmarkError) as caught:
        read_benchmark(str(tmp_path), "nq")

    message = str(caught.value)
    assert "\n" not in message
    assert f"{path}:{line}:" in message
    assert caught.match(why)


def test_read_benchmark_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(BenchmarkError, match="does not exist") as caught:
        read_benchmark(str(tmp_path), "absent")
    assert str(tmp_path / "absent" / "test.jsonl") in str(caught.value)


def test_read_benchmark_file_without_questions_names_it(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "empty" / "test.jsonl", ["", "   "])

    with pytest.raises(BenchmarkError, match="no questions") as caught:
        read_benchmark(str(tmp_path), "empty")
    assert str(path) in str(caught.value)


def test_benchmark_names_lists_directories_with_the_split(tmp_path: Path) -> None:
    write_lines(tmp_path / "nq" / "test.jsonl", [GOOD])
    write_lines(tmp_path / "2wiki" / "test.jsonl", [GOOD])
    write_lines(tmp_path / "frames" / "dev.jsonl", [GOOD])
    (tmp_path / "empty_dir").mkdir()
    write_lines(tmp_path / "stray.jsonl", [GOOD])

    assert benchmark_names(str(tmp_path)) == ["2wiki", "nq"]
    assert benchmark_names(str(tmp_path), split="dev") == ["frames"]


def test_benchmark_names_on_memory_url_and_missing_directory(tmp_path: Path) -> None:
    root = f"memory://names-{uuid.uuid4().hex}"
    for name in ("zeta", "alpha"):
        with fsspec.open(f"{root}/{name}/test.jsonl", "w") as out:
            out.write(GOOD + "\n")

    assert benchmark_names(root) == ["alpha", "zeta"]
    with pytest.raises(BenchmarkError, match="does not exist"):
        benchmark_names(str(tmp_path / "nowhere"))


def test_read_world_benchmark_is_the_held_out_split(tmp_path: Path) -> None:
    world = generate_world(seed=3, entities=40, questions=30)
    write_world(world, tmp_path / "world")
    held_out = [q for q in world.questions if q.split == "test"]
    assert held_out, "the small world must have test questions for this test to mean anything"

    questions = read_world_benchmark(tmp_path / "world")

    assert [(q.id, q.question, q.answers) for q in questions] == [
        (q.id, q.question, q.answers) for q in held_out
    ]
    assert WORLD_BENCHMARK == "world"
    # Another split when asked: `eval run --split train` on the world plays its train questions.
    train = read_world_benchmark(tmp_path / "world", "train")
    assert [q.id for q in train] == [q.id for q in world.questions if q.split == "train"]


def test_read_world_benchmark_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(BenchmarkError, match="qa_test.jsonl does not exist"):
        read_world_benchmark(tmp_path)
    path = write_lines(tmp_path / "qa_test.jsonl", [json.dumps({"question": "no id"})])
    with pytest.raises(BenchmarkError, match=f"{path}:1: no gold answer"):
        read_world_benchmark(tmp_path)


def test_eval_requests_one_pinned_group_per_question() -> None:
    questions = [
        BenchmarkQuestion(id="q0", question="First?", answers=["a"]),
        BenchmarkQuestion(id="q1", question="Second?", answers=["b", "c"]),
    ]
    sampling = SamplingSettings(temperature=0.6, top_p=0.95, seed=11)

    requests = eval_requests(
        questions,
        eval_id="ev1",
        benchmark="nq",
        k=4,
        policy_version=7,
        sampling=sampling,
        evaluator="judge-a",
    )

    assert len(requests) == len(questions)
    for request, question in zip(requests, questions, strict=True):
        assert request.purpose == "eval"
        assert request.group_size == 4
        assert request.policy_version == 7
        assert request.question_id == question.id
        assert request.question == question.question
        assert request.gold_answers == question.answers
        assert request.group_id == f"ev1/nq/{question.id}"
        assert request.sampling == sampling and request.sampling is not sampling
        assert set(request.metadata) == {*EVAL_KEYS, "scoring"}
        assert request.metadata == {
            "eval_id": "ev1",
            "benchmark": "nq",
            "questions": "2",
            "evaluator": "judge-a",
            "scoring": "reference",
        }
    assert len({r.event_id for r in requests}) == len(requests)


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"k": 0}, "k"),
        ({"eval_id": ""}, "eval_id"),
        ({"policy_version": -1}, "policy_version"),
    ],
)
def test_eval_requests_rejects_bad_arguments(changes: dict[str, object], why: str) -> None:
    arguments: dict[str, object] = {
        "eval_id": "ev",
        "benchmark": "nq",
        "k": 2,
        "policy_version": 0,
        "sampling": SamplingSettings(),
    }
    arguments.update(changes)
    questions = [BenchmarkQuestion(id="q", question="Q?", answers=["a"])]

    with pytest.raises(ValueError, match=why):
        eval_requests(questions, **arguments)  # type: ignore[arg-type]


def test_eval_requests_rejects_duplicate_question_ids() -> None:
    twice = [BenchmarkQuestion(id="q", question="Q?", answers=["a"])] * 2

    with pytest.raises(ValueError, match="duplicate"):
        eval_requests(
            twice, eval_id="e", benchmark="b", k=1, policy_version=0, sampling=SamplingSettings()
        )
