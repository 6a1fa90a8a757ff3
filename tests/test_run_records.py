"""`replay --run NAME`: one run's records told apart from another's on the shared topics, even
when one run's name begins with the other's."""

from __future__ import annotations

from asearcher.consumers.observability.run_records import RunFilter
from asearcher.streams.wire.events import (
    DeadLetter,
    EvalResult,
    FeederProgress,
    GenerationStep,
    RolloutRequested,
    ServiceStatus,
    ToolCallRequested,
    ToolResultReady,
    TrainerStepFinished,
    TrajectoryFinished,
    WeightsPublished,
)
from asearcher.streams.wire.packed import Float32s, Int32s


def _events(run: str) -> list:
    """One event of each kind written for `run` (by the feeder, an evaluation, the services)."""
    traj = {"token_ids": [1], "logprobs": [0.0], "loss_mask": [1], "token_versions": [0]}
    step = {"trajectory_id": "t", "turn": 0, "token_ids": Int32s([1]),
            "logprobs": Float32s([0.0]), "policy_version": 0}  # fmt: skip
    return [
        RolloutRequested(question_id="q", group_id=f"{run}-e0-000001", question="?"),
        RolloutRequested(
            question_id="q",
            group_id=f"{run}-v4-1a2b3c/world/q",
            question="?",
            metadata={"model": run},
        ),  # fmt: skip
        GenerationStep(group_id=f"{run}-e1-000002", **step),
        # the warm start's demonstrations (cli/run/warm_start.py)
        RolloutRequested(
            question_id="q", group_id=f"{run}-expert-synth-7-3", question="?", metadata={"run": run}
        ),  # fmt: skip
        GenerationStep(group_id=f"{run}-expert-synth-7-3", **step),
        GenerationStep(group_id=f"{run}-v4/world/q", **step),  # continuous evaluation
        TrajectoryFinished(trajectory_id="t", group_id=f"{run}-e0-000001", question_id="q", **traj),
        ToolCallRequested(call_id=f"{run}-call", trajectory_id="t", tool="search", pool=run),
        ToolResultReady(call_id=f"{run}-call", trajectory_id="t", tool="search"),
        WeightsPublished(model=run, version=1, uri="u", sha256="s", step=1),
        TrainerStepFinished(model=run, version=1, step=1),
        EvalResult(
            eval_id=f"{run}-v2",
            model=run,
            benchmark="world",
            policy_version=2,
            questions=1,
            samples_per_question=1,
        ),  # fmt: skip
        FeederProgress(run=run, epoch=0, next_index=1, published=1, epochs=1, questions=9),
        ServiceStatus(service="rollout", instance=f"{run}-rollout-0"),
        ServiceStatus(service="eval", instance=f"asearcher-{run}-eval"),
    ]


def test_a_run_s_records_are_told_from_a_run_whose_name_extends_it() -> None:
    learn, copy = _events("learn"), _events("learn-copy")
    ours = RunFilter("learn", tool_calls=["learn-call"])
    assert [ours.accepts(e) for e in learn] == [True] * len(learn)
    assert [ours.accepts(e) for e in copy] == [False] * len(copy)
    theirs = RunFilter("learn-copy", tool_calls=["learn-copy-call"])
    assert [theirs.accepts(e) for e in copy] == [True] * len(copy)
    assert not any(theirs.accepts(e) for e in learn)
    letter = DeadLetter(origin_topic="trajectories", origin_partition=0, origin_offset=1,
                        reason="bad", error_type="X")  # fmt: skip
    assert not ours.accepts(letter)
