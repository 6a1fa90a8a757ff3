"""The evaluation processor's state: running sums that equal `aggregate`, bounded in size."""

from __future__ import annotations

import random

import msgspec
import pytest

from asearcher.consumers.evaluation.eval_gathering import EvalTally, count_sample, new_tally
from asearcher.consumers.evaluation.eval_scores import aggregate, sample_of
from asearcher.streams.wire.events import WEIGHTS_OF_KEY, EvalResult, TrajectoryFinished, new_id

VERSION = 3


def trajectory(
    question: int, index: int, group_size: int, parts: dict[str, float], questions: int
) -> TrajectoryFinished:
    """One evaluation sample of question `question` with the given scores."""
    generated = 1 + question % 4
    mask = [0, 0] + [1] * generated
    return TrajectoryFinished(
        trajectory_id=new_id(), sample_index=index, group_id=f"ev/b/q{question}",
        question_id=f"q{question}", purpose="eval", group_size=group_size,
        token_ids=list(range(len(mask))), logprobs=[0.0] * len(mask), loss_mask=mask,
        token_versions=[1, 1] + [VERSION] * generated, answer="a", reward_parts=parts,
        num_turns=1 + index, finish_reason="answer", tool_calls={"search": question % 3},
        metadata={"eval_id": "ev", "benchmark": "b", "questions": str(questions)},
    )  # fmt: skip


def random_evaluation(rng: random.Random, questions: int, k: int) -> list[TrajectoryFinished]:
    """k samples per question with random scores (some unjudged), in a shuffled order."""
    samples = []
    for q in range(questions):
        for i in range(k):
            parts = {"f1": rng.random(), "em": float(rng.random() < 0.3), "format": 1.0}
            if rng.random() < 0.5:
                parts["judge"] = float(rng.random() < 0.5)
            samples.append(trajectory(q, i, k, parts, questions))
    rng.shuffle(samples)
    return samples


class Tables:
    """The processor's two tables as dicts, with the results their updates gave."""

    def __init__(self) -> None:
        self.tallies: dict[str, str] = {}
        self.questions: dict[str, str] = {}
        self.results: list[EvalResult] = []

    def add(self, t: TrajectoryFinished) -> None:
        result = count_sample(self.tallies, self.questions, t, sample_of(t))
        if result is not None:
            self.results.append(result)

    def tally(self) -> EvalTally:
        return msgspec.json.decode(self.tallies["ev/b"], type=EvalTally)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_running_sums_give_the_same_result_as_aggregating_every_sample(seed: int) -> None:
    rng = random.Random(seed)
    samples = random_evaluation(rng, questions=13, k=3)
    tables = Tables()
    for t in samples:
        tables.add(t)
    [result] = tables.results
    averages, best = aggregate([sample_of(t) for t in samples], 3)
    assert result.averages == pytest.approx(averages)
    assert result.best_of_k == pytest.approx(best)
    assert set(result.best_of_k) == {"f1", "em", "format", "judge"}
    assert (result.questions, result.samples_per_question) == (13, 3)
    assert result.policy_version == VERSION


def test_a_sample_delivered_again_counts_once_before_and_after_its_question_completes() -> None:
    samples = random_evaluation(random.Random(5), questions=3, k=2)
    by_question = sorted(samples, key=lambda t: (t.question_id, t.sample_index))
    tables = Tables()
    tables.add(by_question[0])
    tables.add(by_question[0])  # its question is still open
    tables.add(by_question[1])
    tables.add(by_question[1])  # its question is complete
    tally = tables.tally()
    assert (tally.samples, tally.questions_done) == (2, 1)
    for t in by_question[2:] + by_question[:3]:  # the rest, and the first three again
        tables.add(t)
    [result] = tables.results
    averages, best = aggregate([sample_of(t) for t in samples], 2)
    assert result.averages == pytest.approx(averages)
    assert result.best_of_k == pytest.approx(best)


def test_a_complete_question_takes_no_further_samples_and_a_done_evaluation_none() -> None:
    tables = Tables()
    first = [trajectory(0, i, 2, {"f1": 0.0}, questions=2) for i in range(2)]
    for t in first:
        tables.add(t)
    # A third sample of a complete question (a replayed group with new ids) is not counted.
    tables.add(trajectory(0, 0, 2, {"f1": 1.0}, questions=2))
    for i in range(2):
        tables.add(trajectory(1, i, 2, {"f1": 0.5}, questions=2))
    tables.add(trajectory(2, 0, 1, {"f1": 1.0}, questions=2))  # after the result
    [result] = tables.results
    assert result.averages["f1"] == pytest.approx(0.25)
    assert result.best_of_k["f1"] == pytest.approx(0.25)
    assert tables.tally().samples == 4


def test_entries_stay_the_same_size_however_many_questions_an_evaluation_has() -> None:
    rng = random.Random(9)
    sizes = {}
    for questions in (10, 2_000):
        tables = Tables()
        for t in random_evaluation(rng, questions, k=4):
            tables.add(t)
        assert len(tables.results) == 1
        sizes[questions] = (
            len(tables.tallies["ev/b"]),
            max(len(value) for value in tables.questions.values()),
        )
    # 8,000 samples fit in the entries of 40, but for a few more digits in the sums.
    assert sizes[2_000][0] - sizes[10][0] < 100
    assert sizes[2_000][1] - sizes[10][1] < 100
    assert sizes[2_000][0] < 2_000 and sizes[2_000][1] < 1_000


def test_an_evaluation_of_another_runs_versions_is_filed_under_that_run() -> None:
    own = trajectory(0, 0, 1, {"f1": 1.0}, questions=1)
    own.metadata["model"] = "learn"
    other = msgspec.structs.replace(own, metadata={**own.metadata, WEIGHTS_OF_KEY: "learn-lr"})
    assert new_tally(own).model == "learn"
    assert new_tally(other).model == "learn-lr"  # `eval run --weights-of learn-lr`
