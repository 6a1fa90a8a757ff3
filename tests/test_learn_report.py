"""What `asearcher learn` reports about the RL phase counts every group the trainer set aside."""

from __future__ import annotations

from pathlib import Path

import pytest

from asearcher.cli.jobs.learning import LearnSummary, by_hops, by_kind, flat_share
from asearcher.consumers.world.world import World, WorldQuestion, write_world
from asearcher.streams.wire.events import EvalResult, TrainerStepFinished, TrajectoriesDropped


def test_flat_groups_count_whether_reported_with_a_step_or_committed_while_waiting() -> None:
    steps = [
        TrainerStepFinished(model="r", version=2, step=1, groups=2, dropped_flat_groups=3),
        TrainerStepFinished(model="r", version=3, step=2, groups=2, dropped_flat_groups=0),
    ]
    # After the last step no other came: the trainer committed what it dropped meanwhile.
    drops = [
        TrajectoriesDropped(model="r", version=3, dropped_ids=["a"] * 8, dropped_flat_groups=1),
        TrajectoriesDropped(model="r", version=3, dropped_ids=["b"] * 16, dropped_flat_groups=2),
    ]
    assert flat_share(steps, drops) == (4, 6)
    assert flat_share([], drops) == (0, 3)


def summary_scoring(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> LearnSummary:
    """A learn summary whose questions scored `before` and `after` RL (per metric, per id)."""
    result = EvalResult(eval_id="e", benchmark="world", policy_version=1,
                        questions=len(before["f1"]), samples_per_question=2)  # fmt: skip
    return LearnSummary(run="r", config="c", rl_seconds=1.0, before=result, after=result,
                        steps=[], evaluations=[], before_by_question=before,
                        after_by_question=after)  # fmt: skip


def test_the_comparison_is_split_by_the_hops_of_each_held_out_question(tmp_path: Path) -> None:
    questions = [
        WorldQuestion(f"q{i}", f"question {i}?", ["a"], hops, ["https://x.local/wiki/A"], split)
        for i, (hops, split) in enumerate([(1, "test"), (1, "test"), (2, "test"), (2, "train")])
    ]
    write_world(World([], questions), tmp_path)
    summary = summary_scoring(
        {"f1": {"q0": 0.5, "q1": 0.0, "q2": 0.0}, "accesses": {"q0": 2.0, "q1": 2.0, "q2": 1.0}},
        {"f1": {"q0": 1.0, "q1": 0.5, "q2": 0.5}, "accesses": {"q0": 1.0, "q1": 1.0, "q2": 2.0}},
    )
    one, two = by_hops(summary, tmp_path)
    assert (one.hops, one.questions, two.hops, two.questions) == (1, 2, 2, 1)
    assert one.f1 == pytest.approx((0.25, 0.75)) and one.pages == (2.0, 1.0)
    assert two.f1 == (0.0, 0.5) and two.pages == (1.0, 2.0)
    assert by_hops(summary, tmp_path / "no-world") == []


def test_the_comparison_is_split_by_kind_most_asked_first(tmp_path: Path) -> None:
    kinds = [("person:profession", "test"), ("city:river", "test"), ("person:profession", "test"),
             ("", "test"), ("city:river", "train")]  # fmt: skip
    questions = [
        WorldQuestion(f"q{i}", f"question {i}?", ["a"], 1, ["https://x.local/wiki/A"], split, kind)
        for i, (kind, split) in enumerate(kinds)
    ]
    write_world(World([], questions), tmp_path)
    summary = summary_scoring(
        {"f1": {"q0": 0.0, "q1": 1.0, "q2": 0.5, "q3": 1.0},
         "accesses": {"q0": 1.0, "q1": 2.0, "q2": 1.0, "q3": 0.0}},
        {"f1": {"q0": 1.0, "q1": 0.5, "q2": 0.5, "q3": 0.0},
         "accesses": {"q0": 2.0, "q1": 1.0, "q2": 2.0, "q3": 1.0}},
    )  # fmt: skip
    profession, river = by_kind(summary, tmp_path)  # a question without a kind is left out
    assert (profession.kind, profession.questions, river.kind, river.questions) == (
        "person:profession", 2, "city:river", 1)  # fmt: skip
    assert profession.f1 == (0.25, 0.75) and profession.pages == (1.0, 2.0)
    assert river.f1 == (1.0, 0.5) and river.pages == (2.0, 1.0)


def test_the_ask_hint_stays_one_copyable_line_on_a_narrow_terminal(monkeypatch) -> None:
    import io
    import shlex
    from types import SimpleNamespace

    from rich.console import Console

    from asearcher.cli import learn

    screen = io.StringIO()
    monkeypatch.setattr(learn, "console", Console(file=screen, width=40))
    question = WorldQuestion("q0", "On which river does the city of Bauzeneil lie?", ["Peshas"],
                             2, [], "test")  # fmt: skip
    job = SimpleNamespace(questions={"world": [question]}, config=SimpleNamespace(name="learn"))
    learn._ask_hint(job, Path("/a/long/home/directory/of/the/run"), 7)

    command = [line for line in screen.getvalue().splitlines() if "asearcher ask" in line]
    assert len(command) == 1
    words = shlex.split(command[0])
    assert words[words.index("--weights") + 1] == "v7"
    assert question.question in words and words[-1] == "Peshas"


def test_the_last_version_is_reported_against_the_scored_one_question_by_question(
    monkeypatch,
) -> None:
    import io

    from rich.console import Console

    from asearcher.cli import learn

    def result(version: int, f1: float) -> EvalResult:
        return EvalResult(eval_id=f"e{version}", benchmark="world", policy_version=version,
                          questions=3, samples_per_question=1, averages={"f1": f1})  # fmt: skip

    scored = {"q0": 0.5, "q1": 1.0, "q2": 0.0}
    last = {"q0": 0.0, "q1": 1.0, "q2": 0.0}
    summary = LearnSummary(
        run="r", config="c", rl_seconds=1.0, before=result(1, 0.1), after=result(5, 0.5),
        steps=[], evaluations=[], after_by_question={"f1": scored},
        last_after=result(9, 1 / 3), last_after_by_question={"f1": last},
    )  # fmt: skip
    # From the last to the scored, the changes are (0.5, 0, 0): variance 1/12, standard
    # error sqrt(1/36), the paired noise two of them.
    noise = summary.paired_noise("f1", after_last=True)
    assert noise == pytest.approx(1 / 3)
    assert summary.paired_noise("f1") is None  # nothing before RL kept here

    screen = io.StringIO()
    monkeypatch.setattr(learn, "console", Console(file=screen, width=200))
    learn._report_last(summary)
    said = " ".join(screen.getvalue().split())
    assert "the last version, v9, on the same questions: F1 0.333" in said
    assert f"the scored v5 +16.7 points against it (paired noise ±{100 * noise:.1f})" in said
