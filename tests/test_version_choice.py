"""Which version `learn` scores after RL: the best rated continuous evaluation, or the last."""

from __future__ import annotations

import pytest

from asearcher.cli.jobs.version_choice import choose_version, ratings
from asearcher.streams.wire.events import EvalResult


def result(version: int, f1: float, questions: int = 20) -> EvalResult:
    return EvalResult(eval_id=f"e{version}", model="run", benchmark="world",
                      policy_version=version, questions=questions, samples_per_question=2,
                      averages={"f1": f1})  # fmt: skip


def test_a_version_is_rated_with_its_neighbours() -> None:
    results = [result(5, 0.2), result(10, 0.4), result(15, 0.3), result(20, 0.5)]
    rated = ratings(results)
    assert [r.version for r in rated] == [5, 10, 15, 20]
    assert [r.value for r in rated] == pytest.approx([0.3, 0.3, 0.4, 0.4])
    # v10's window (0.2, 0.4, 0.3) over 20 questions each: sqrt(0.16 + 0.24 + 0.21) / 20 / 3.
    assert rated[1].error == pytest.approx((0.61 / 20) ** 0.5 / 3)


def test_one_lucky_evaluation_loses_to_a_good_stretch() -> None:
    # v10 alone scores best, between two poor ones; v25 sits among good ones.
    scores = [(5, 0.1), (10, 0.6), (15, 0.1), (20, 0.4), (25, 0.45), (30, 0.4), (35, 0.2)]
    choice = choose_version([result(v, f) for v, f in scores], 37, True, range(1, 38))
    assert (choice.version, choice.last, choice.evaluations) == (25, 37, 7)
    assert choice.rating == pytest.approx(0.4167, abs=1e-4)
    assert "the last is v37" in choice.reason and choice.best == 25


def test_ties_go_to_the_later_version_and_a_re_evaluation_replaces_the_first() -> None:
    results = [result(5, 0.3), result(10, 0.3), result(5, 0.0)]
    assert choose_version(results, 12, True, range(1, 13)).version == 10
    assert [r.value for r in ratings(results)] == pytest.approx([0.15, 0.15])


def test_a_version_the_store_no_longer_holds_is_not_chosen() -> None:
    results = [result(5, 0.9), result(10, 0.9), result(15, 0.1)]
    assert choose_version(results, 16, True, [10, 15, 16]).version == 10
    fallback = choose_version(results, 16, True, [16])
    assert fallback.version == 16 and "no continuous evaluation" in fallback.reason


def test_without_keep_best_the_last_version_is_scored() -> None:
    choice = choose_version([result(5, 0.9)], 9, False, range(1, 10))
    assert (choice.version, choice.rating) == (9, None) and choice.reason == "the last version"


def test_the_latest_version_within_one_standard_error_of_the_best_is_chosen() -> None:
    # Still improving, slowly: v45 is rated best by a lucky point, but v65 is within the noise
    # of 51 questions (a standard error of about 0.04) and has trained 20 versions longer.
    scores = [(40, 0.45), (45, 0.47), (50, 0.46), (55, 0.42), (60, 0.43), (65, 0.44)]
    choice = choose_version([result(v, f, 51) for v, f in scores], 65, True, range(1, 66))
    assert (choice.best, choice.version) == (45, 65)
    assert "within one standard error of the best (v45: F1 0.460 ± 0.040" in choice.reason
    # More questions, less noise: the same scores over 2,000 questions leave v45 alone.
    precise = choose_version([result(v, f, 2000) for v, f in scores], 65, True, range(1, 66))
    assert precise.version == 45


def test_a_late_fall_beyond_the_noise_is_not_chosen() -> None:
    scores = [(40, 0.45), (45, 0.47), (50, 0.46), (55, 0.20), (60, 0.10)]
    choice = choose_version([result(v, f, 51) for v, f in scores], 60, True, range(1, 61))
    assert (choice.best, choice.version) == (45, 45)
