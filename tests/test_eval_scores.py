"""Evaluation scores: per-sample reading, Avg@k and Pass@k, the table, per-question records."""

from __future__ import annotations

import gzip
import json
import math
import random
import uuid
from pathlib import Path

import fsspec
import pytest
from rich.console import Console

from asearcher.consumers.evaluation.benchmarks import BenchmarkQuestion
from asearcher.consumers.evaluation.eval_scores import (
    COUNTS,
    SCORES,
    SampleScores,
    aggregate,
    change_noise,
    paired_change_noise,
    question_means,
    question_records,
    render_table,
    sample_of,
    write_jsonl,
)
from asearcher.streams.wire.events import EvalResult, TrajectoryFinished


def trajectory(
    question_id: str,
    index: int | None,
    parts: dict[str, float],
    *,
    loss_mask: list[int] | None = None,
    tool_calls: dict[str, int] | None = None,
    num_turns: int = 1,
    answer: str | None = "an answer",
    transcript: list[str] | None = None,
) -> TrajectoryFinished:
    """An eval trajectory; `index` None gives a random id that carries no sample index."""
    group_id = f"ev/bench/{question_id}"
    mask = [0, 1] if loss_mask is None else loss_mask
    return TrajectoryFinished(
        trajectory_id=uuid.uuid4().hex,
        sample_index=index or 0,
        group_id=group_id,
        question_id=question_id,
        purpose="eval",
        token_ids=list(range(len(mask))),
        logprobs=[0.0] * len(mask),
        loss_mask=mask,
        token_versions=[0] * len(mask),
        answer=answer,
        reward_parts=parts,
        num_turns=num_turns,
        finish_reason="answer",
        tool_calls=tool_calls or {},
        transcript=transcript or [],
    )


def sample(question_id: str, index: int, **scores: float) -> SampleScores:
    counts = {name: 0.0 for name in COUNTS}
    return SampleScores(
        trajectory_id=f"{question_id}-{index}",
        question_id=question_id,
        sample_index=index,
        scores=scores,
        counts=counts,
    )


# ---------------------------------------------------------------- sample_of


def test_sample_of_reads_scores_and_counts() -> None:
    t = trajectory(
        "q",
        2,
        {"f1": 0.5, "em": 0.0, "cem": 1.0, "format": 1.0, "valid_instruction": 1.0, "invalid": 0},
        loss_mask=[0, 0, 1, 1, 1, 0, 1],
        tool_calls={"search": 3, "browse": 1},
        num_turns=5,
    )

    s = sample_of(t)

    assert s.trajectory_id == t.trajectory_id and s.question_id == "q"
    assert s.sample_index == 2
    assert s.scores == {"f1": 0.5, "em": 0.0, "cem": 1.0, "format": 1.0}
    assert s.counts == {"gen_len": 4.0, "searches": 3.0, "accesses": 1.0, "turns": 5.0}


def test_sample_of_keeps_judge_and_counts_missing_tools_as_zero() -> None:
    s = sample_of(trajectory("q", 0, {"f1": 0.0, "judge": 1.0}, tool_calls={}))

    assert s.scores == {"f1": 0.0, "judge": 1.0}
    assert s.counts["searches"] == 0.0 and s.counts["accesses"] == 0.0


@pytest.mark.parametrize(
    ("parts", "field"),
    [
        ({"f1": math.nan}, "f1"),
        ({"f1": 0.5, "judge": math.inf}, "judge"),
        ({"em": 1.5}, "em"),
        ({"cem": -0.1}, "cem"),
    ],
)
def test_sample_of_rejects_bad_scores_naming_the_field(parts: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=f"reward_parts\\['{field}'\\]"):
        sample_of(trajectory("q", 0, parts))


def test_sample_of_rejects_negative_counts_naming_the_field() -> None:
    with pytest.raises(ValueError, match="num_turns"):
        sample_of(trajectory("q", 0, {"f1": 1.0}, num_turns=-1))
    with pytest.raises(ValueError, match="tool_calls\\['browse'\\]"):
        sample_of(trajectory("q", 0, {"f1": 1.0}, tool_calls={"browse": -2}))


def _fields(t: TrajectoryFinished) -> dict[str, object]:
    return {name: getattr(t, name) for name in t.__struct_fields__}


# ---------------------------------------------------------------- aggregate


def test_aggregate_avg_uses_all_samples_and_pass_at_k_the_first_k() -> None:
    f1 = {"q1": [0.2, 0.6, 1.0], "q2": [0.5, 0.0, 0.9]}
    em = {"q1": [0.0, 1.0, 1.0], "q2": [0.0, 0.0, 1.0]}
    turns = {"q1": [1, 2, 3], "q2": [4, 5, 9]}
    samples = [
        SampleScores(
            trajectory_id=f"{q}-{i}",
            question_id=q,
            sample_index=i,
            scores={"f1": f1[q][i], "em": em[q][i]},
            counts={
                "gen_len": 10.0 * (i + 1),
                "searches": 1.0,
                "accesses": 0.0,
                "turns": turns[q][i],
            },
        )
        for q in f1
        for i in range(3)
    ]
    random.Random(5).shuffle(samples)  # order comes from the sample index, not the input

    averages, best = aggregate(samples, k=2)

    assert averages["f1"] == pytest.approx((0.2 + 0.6 + 1.0 + 0.5 + 0.0 + 0.9) / 6)
    assert averages["em"] == pytest.approx(3 / 6)
    assert averages["turns"] == pytest.approx((1 + 2 + 3 + 4 + 5 + 9) / 6)
    assert averages["gen_len"] == pytest.approx(20.0)
    assert averages["searches"] == 1.0 and averages["accesses"] == 0.0
    # Pass@2 sees samples 0 and 1 only: the third sample's 1.0 and 0.9 are left out.
    assert best["f1"] == pytest.approx((0.6 + 0.5) / 2)
    assert best["em"] == pytest.approx((1.0 + 0.0) / 2)
    assert set(best) == {"f1", "em"}
    assert "judge" not in averages

    _, best3 = aggregate(samples, k=3)
    assert best3["f1"] == pytest.approx((1.0 + 0.9) / 2)
    assert best3["em"] == pytest.approx(1.0)


def test_aggregate_orders_indices_numerically() -> None:
    # Index 10 holds the only hit; a string sort would put it before 2 and inside the first 10.
    samples = [sample("q", i, f1=1.0 if i == 10 else 0.0) for i in range(11)]

    assert aggregate(samples, k=10)[1]["f1"] == 0.0
    assert aggregate(samples, k=11)[1]["f1"] == 1.0


def test_aggregate_judge_on_some_samples_only() -> None:
    samples = [
        sample("q1", 0, f1=0.0, judge=1.0),
        sample("q1", 1, f1=1.0, judge=0.0),
        sample("q1", 2, f1=1.0),
        sample("q2", 0, f1=0.5),
        sample("q2", 1, f1=0.0),
    ]

    averages, best = aggregate(samples, k=2)

    assert averages["judge"] == pytest.approx(0.5)  # over the two judged samples
    assert averages["f1"] == pytest.approx(2.5 / 5)  # over all five
    assert best["judge"] == pytest.approx(1.0)  # q2 has no judged sample: left out
    assert best["f1"] == pytest.approx((1.0 + 0.5) / 2)


def test_aggregate_rejects_empty_bad_k_and_duplicates() -> None:
    with pytest.raises(ValueError, match="no samples"):
        aggregate([], k=1)
    with pytest.raises(ValueError, match="k must"):
        aggregate([sample("q", 0, f1=1.0)], k=0)
    with pytest.raises(ValueError, match="twice"):
        aggregate([sample("q", 0, f1=1.0), sample("q", 0, f1=0.0)], k=1)


def test_aggregate_of_sample_of_trajectories() -> None:
    trajectories = [
        trajectory("q1", 1, {"f1": 0.3, "format": 1.0}, tool_calls={"search": 2}),
        trajectory("q1", 0, {"f1": 0.7, "format": 0.0}, tool_calls={"search": 4, "browse": 2}),
    ]

    averages, best = aggregate(map(sample_of, trajectories), k=1)

    assert averages["searches"] == 3.0 and averages["accesses"] == 1.0
    assert averages["format"] == 0.5
    assert best["f1"] == 0.7 and best["format"] == 0.0  # sample 0 alone
    assert set(averages) == {"f1", "format", *COUNTS}
    assert set(SCORES) >= set(best)


# ---------------------------------------------------------------- render_table


def result(
    benchmark: str, questions: int, k: int, f1: float, judge: float | None = None
) -> EvalResult:
    averages = {"f1": f1, "em": f1 / 2, "cem": f1, "format": 1.0}
    averages |= {"gen_len": 100.0 * questions, "searches": 2.0, "accesses": 1.0, "turns": 3.0}
    best = {"f1": min(1.0, 2 * f1), "em": f1, "cem": f1, "format": 1.0}
    if judge is not None:
        averages["judge"], best["judge"] = judge, min(1.0, 2 * judge)
    return EvalResult(
        eval_id="ev",
        benchmark=benchmark,
        policy_version=7,
        questions=questions,
        samples_per_question=k,
        averages=averages,
        best_of_k=best,
    )


def rendered_rows(results: list[EvalResult]) -> tuple[list[str], dict[str, list[str]]]:
    console = Console(record=True, width=200)
    console.print(render_table(results))
    lines = [line for line in console.export_text().splitlines() if "│" in line or "┃" in line]
    cells = [[c.strip() for c in line.replace("┃", "│").split("│")[1:-1]] for line in lines]
    return cells[0], {row[0]: row for row in cells[1:]}


def test_render_table_header_rows_and_average() -> None:
    results = [result("nq", 10, 4, 0.25, judge=0.5), result("hotpotqa", 21, 4, 0.5)]

    header, rows = rendered_rows(results)

    assert header[:7] == [
        "benchmark",
        "version",
        "num",
        "avg_gen_len",
        "searches",
        "accesses",
        "turns",
    ]
    assert header[7:] == [
        "F1",
        "EM",
        "CEM",
        "judge",
        "F1 Pass@4",
        "EM Pass@4",
        "CEM Pass@4",
        "judge Pass@4",
    ]
    column = {name: i for i, name in enumerate(header)}
    assert rows["nq"][column["F1"]] == "0.250"
    assert rows["hotpotqa"][column["judge"]] == "-"
    average = rows["average"]
    assert average[column["num"]] == f"{(10 + 21) / 2:.1f}"
    assert average[column["avg_gen_len"]] == f"{(1000 + 2100) / 2:.2f}"
    assert average[column["F1"]] == f"{(0.25 + 0.5) / 2:.3f}"
    assert average[column["EM"]] == f"{(0.125 + 0.25) / 2:.3f}"
    assert average[column["F1 Pass@4"]] == f"{(0.5 + 1.0) / 2:.3f}"
    # Only nq was judged: the average of the judge columns is nq's alone.
    assert average[column["judge"]] == "0.500"
    assert average[column["judge Pass@4"]] == "1.000"
    assert average[column["version"]] == "7"


def test_render_table_single_row_has_no_average_and_no_judge_unless_judged() -> None:
    header, rows = rendered_rows([result("nq", 5, 2, 0.4)])

    assert "judge" not in header and "judge Pass@2" not in header
    assert "F1 Pass@2" in header
    assert set(rows) == {"nq"}


def test_render_table_mixed_k_gets_a_k_column() -> None:
    header, rows = rendered_rows([result("nq", 5, 2, 0.4), result("tq", 5, 8, 0.2)])

    assert "F1 Pass@k" in header and "k" in header
    assert rows["tq"][header.index("k")] == "8"


# ---------------------------------------------------------------- records


def records_fixture() -> tuple[list[BenchmarkQuestion], list[TrajectoryFinished]]:
    questions = [
        BenchmarkQuestion(id="q1", question="Who?", answers=["Ada"]),
        BenchmarkQuestion(id="q2", question="When?", answers=["1815", "in 1815"]),
        BenchmarkQuestion(id="q3", question="Unplayed?", answers=["x"]),
    ]
    trajectories = [
        trajectory(
            "q1", 1, {"f1": 0.0}, answer=None, transcript=["think", "search A"], num_turns=2
        ),
        trajectory("q2", 0, {"f1": 1.0, "judge": 1.0}, answer="1815", transcript=["t"]),
        trajectory("q1", 0, {"f1": 1.0}, answer="Ada", transcript=["x", "obs", "y"], num_turns=3),
    ]
    return questions, trajectories


def test_question_records_per_question_with_ordered_samples() -> None:
    questions, trajectories = records_fixture()

    records = question_records(questions, trajectories)

    assert [r["id"] for r in records] == ["q1", "q2", "q3"]
    first = records[0]
    assert first["question"] == "Who?" and first["gt"] == ["Ada"]
    assert [s["sample_index"] for s in first["samples"]] == [0, 1]
    assert first["samples"][0]["history"] == ["x", "obs", "y"]
    assert first["samples"][0]["pred_answer"] == "Ada"
    assert first["samples"][0]["num_turns"] == 3
    assert first["samples"][1]["pred_answer"] == ""  # no answer given
    assert first["samples"][1]["scores"] == {"f1": 0.0}
    assert records[1]["samples"][0]["scores"] == {"f1": 1.0, "judge": 1.0}
    assert records[1]["gt"] == ["1815", "in 1815"]
    assert records[2]["samples"] == []


def test_question_records_rejects_trajectory_of_unknown_question() -> None:
    questions, trajectories = records_fixture()

    with pytest.raises(ValueError, match="unknown question 'q9'"):
        question_records(questions, [*trajectories, trajectory("q9", 0, {})])


def test_write_jsonl_round_trip_local_creates_parents(tmp_path: Path) -> None:
    records = question_records(*records_fixture())
    path = tmp_path / "deep" / "er" / "records.jsonl"

    write_jsonl(str(path), records)

    assert [json.loads(line) for line in path.read_text().splitlines()] == records


def test_write_jsonl_round_trip_memory_url_and_gzip(tmp_path: Path) -> None:
    records = question_records(*records_fixture())
    url = f"memory://records-{uuid.uuid4().hex}/nq.jsonl"

    write_jsonl(url, records)
    with fsspec.open(url, "rt") as src:
        assert [json.loads(line) for line in src] == records

    packed = tmp_path / "nq.jsonl.gz"
    write_jsonl(str(packed), records)
    lines = gzip.decompress(packed.read_bytes()).decode().splitlines()
    assert [json.loads(line) for line in lines] == records


# ---------------------------------------------------------------- noise of a change


def test_the_noise_of_a_change_is_two_standard_errors_of_scores_in_the_unit_interval() -> None:
    half, tenth = result("world", 100, 2, 0.5), result("world", 25, 2, 0.1)
    assert change_noise(half, half, "f1") == pytest.approx(2 * math.sqrt(2 * 0.25 / 100))
    # Each evaluation contributes by its own questions, not by its samples.
    expected = 2 * math.sqrt(0.25 / 100 + 0.09 / 25)
    assert change_noise(half, tenth, "f1") == pytest.approx(expected)
    assert change_noise(result("world", 40, 2, 0.0), result("world", 40, 2, 1.0), "f1") == 0.0


def test_the_noise_bound_covers_the_spread_of_right_or_wrong_answers() -> None:
    # Questions answered right with chance p (the spread a bound for [0, 1] scores is tightest
    # on): the measured spread of the change between two evaluations of an unchanged policy
    # lies within the bound, and close to it.
    rng, p, questions = random.Random(7), 0.06, 40
    changes = []
    for _ in range(4000):
        right = [sum(rng.random() < p for _ in range(questions)) for _ in range(2)]
        changes.append((right[1] - right[0]) / questions)
    spread = 2 * math.sqrt(sum(c * c for c in changes) / len(changes))
    bound = change_noise(result("world", questions, 1, p), result("world", questions, 1, p), "f1")
    assert 0.9 * bound < spread <= 1.05 * bound


def test_question_means_average_each_question_over_its_samples_per_score() -> None:
    trajectories = [trajectory("q1", 0, {"f1": 1.0, "em": 1.0}),
                    trajectory("q1", 1, {"f1": 0.5, "em": 0.0}),
                    trajectory("q2", 0, {"f1": 0.0, "em": 0.0, "judge": 1.0})]  # fmt: skip
    means = question_means(trajectories)
    assert means["f1"] == {"q1": 0.75, "q2": 0.0}
    assert means["em"] == {"q1": 0.5, "q2": 0.0}
    assert means["judge"] == {"q2": 1.0}  # only the questions a score was given for


def test_question_means_average_the_pages_and_searches_of_each_question_too() -> None:
    trajectories = [trajectory("q1", 0, {"f1": 1.0}, tool_calls={"search": 1, "browse": 2}),
                    trajectory("q1", 1, {"f1": 0.0}, tool_calls={"search": 1}),
                    trajectory("q2", 0, {"f1": 0.0}, tool_calls={"browse": 3})]  # fmt: skip
    means = question_means(trajectories)
    assert means["accesses"] == {"q1": 1.0, "q2": 3.0}
    assert means["searches"] == {"q1": 1.0, "q2": 0.0}


def test_the_paired_noise_is_two_standard_errors_of_the_per_question_changes() -> None:
    before = {"a": 0.0, "b": 1.0, "c": 0.5, "only-before": 1.0}
    after = {"a": 0.5, "b": 1.0, "c": 1.0, "only-after": 0.0}
    # Changes 0.5, 0, 0.5 over the shared questions: sample variance 1/12, SE sqrt(1/36).
    assert paired_change_noise(before, after) == pytest.approx(2 * (1 / 6))
    assert paired_change_noise({"a": 0.2, "b": 0.9}, {"a": 0.4, "b": 1.1}) == pytest.approx(0.0)
    assert paired_change_noise({"a": 0.0}, {"a": 1.0}) is None
    assert paired_change_noise(before, {"z": 1.0}) is None


def test_the_paired_noise_measures_the_spread_of_changes_where_questions_differ() -> None:
    # Questions a policy finds easy (p = 0.9) or hard (0.05), two samples each, asked twice of
    # an unchanged policy: the paired noise covers the measured spread of the change and is
    # close to it, while the unpaired bound overstates it.
    rng, questions, k = random.Random(11), 40, 2
    chances = [0.9 if q % 4 == 0 else 0.05 for q in range(questions)]

    def evaluation() -> dict[str, float]:
        return {f"q{q}": sum(rng.random() < p for _ in range(k)) / k for q, p in enumerate(chances)}

    changes, paired, bounds = [], [], []
    for _ in range(3000):
        before, after = evaluation(), evaluation()
        changes.append((sum(after.values()) - sum(before.values())) / questions)
        paired.append(paired_change_noise(before, after))
        mean = sum(before.values()) / questions
        bounds.append(change_noise(result("world", questions, k, mean),
                                   result("world", questions, k, mean), "f1"))  # fmt: skip
    spread = 2 * math.sqrt(sum(c * c for c in changes) / len(changes))
    typical = sum(paired) / len(paired)
    assert 0.85 * spread < typical < 1.1 * spread
    assert sum(bounds) / len(bounds) > 1.3 * spread
