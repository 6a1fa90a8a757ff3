"""Evaluating a version as a job: questions of benchmarks as pinned requests, followed until every
benchmark has its `EvalResult` (`eval run` and `learn` use it)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from asearcher.cli.errors import CliError
from asearcher.cli.progress import LoggedProgress
from asearcher.cli.wiring import (
    as_cli_error,
)

if TYPE_CHECKING:
    from asearcher.consumers.evaluation.benchmarks import BenchmarkQuestion
    from asearcher.streams.io.watch import TopicWatch
    from asearcher.streams.wire.events import (
        EvalResult,
        RolloutRequested,
        SamplingSettings,
        Scoring,
        TrajectoryFinished,
    )
console = Console()


@dataclass(frozen=True)
class EvalWatch:
    """What an evaluation's watch saw: its trajectories by id and its results by benchmark."""

    eval_id: str
    trajectories: dict[str, TrajectoryFinished] = field(default_factory=dict)
    results: dict[str, EvalResult] = field(default_factory=dict)

    @classmethod
    def of(cls, eval_id: str, watch: TopicWatch) -> EvalWatch:
        """The evaluation `eval_id` as `watch` saw it (the last result of a benchmark wins)."""
        from asearcher.streams.wire.topics import EVAL_RESULTS, EVAL_TRAJECTORIES

        return cls(
            eval_id,
            {t.trajectory_id: t for t in watch.events(EVAL_TRAJECTORIES)},  # type: ignore[attr-defined]
            {r.benchmark: r for r in watch.events(EVAL_RESULTS)},  # type: ignore[attr-defined]
        )


def new_eval_id(run: str, version: int) -> str:
    """A fresh evaluation id of `version` in run `run`."""
    return f"{run}-v{version}-{uuid.uuid4().hex[:6]}"


def checked_sampling(
    temperature: float, top_p: float, max_turns: int, max_new_tokens: int, k: int,
    seed: int | None = None,
) -> SamplingSettings:  # fmt: skip
    """Evaluation sampling settings, refused with a line naming the bad one. With a `seed`,
    each sample of each question draws the same random numbers in every evaluation: a version
    evaluated twice plays the same trajectories, and two versions differ by their weights."""
    from asearcher.producers.agents.agent import BadRequest, check_sampling
    from asearcher.streams.wire.events import SamplingSettings

    sampling = SamplingSettings(temperature=temperature, top_p=top_p, max_turns=max_turns,
                                max_new_tokens_per_turn=max_new_tokens, seed=seed)  # fmt: skip
    try:
        check_sampling(sampling, k)
    except BadRequest as exc:
        raise CliError(f"{exc.field}: {exc}") from exc
    return sampling


def evaluate(
    connection, run: str, questions: dict[str, list[BenchmarkQuestion]], version: int, k: int,
    sampling: SamplingSettings, timeout: float, *, eval_id: str | None = None,
    evaluator: str = "", scoring: Scoring = "reference", weights_of: str = "",
) -> EvalWatch:  # fmt: skip
    """Evaluate `version` of run `run` on `questions` (by benchmark) with k samples each, and
    wait for every benchmark's `EvalResult`; what was seen. Needs the run's tool workers, its
    evaluation processor and an evaluator (the run's, or the one consumer group `evaluator`).
    With `weights_of`, the version is that run's and its results are filed under it."""
    from asearcher.streams.wire.events import WEIGHTS_OF_KEY

    eval_id = eval_id or new_eval_id(run, version)
    requests = _requests(questions, eval_id, k, version, sampling, evaluator, run, scoring)
    if weights_of:
        for request in requests:
            request.metadata[WEIGHTS_OF_KEY] = weights_of
    return _follow(connection, eval_id, requests, k, timeout)


def benchmark_questions(
    name: str, data: str | None, split: str, world_dir: Path, limit: int | None
) -> list[BenchmarkQuestion]:
    """The questions of benchmark `name` and `split` (`world`: the run's world, whose held-out
    split is `test`), at most `limit`."""
    from asearcher.consumers.evaluation.benchmarks import (
        WORLD_BENCHMARK,
        BenchmarkError,
        read_benchmark,
        read_world_benchmark,
    )

    with as_cli_error(BenchmarkError):
        if name == WORLD_BENCHMARK and data is None:
            if not (world_dir / "qa_test.jsonl").exists():
                raise CliError(
                    f"benchmark 'world': no world at {world_dir} (start the run once, or --data)"
                )
            found = read_world_benchmark(world_dir, split)
        elif data is None:
            raise CliError(f"benchmark {name!r}: give --data DIR with {name}/{split}.jsonl")
        else:
            found = read_benchmark(data, name, split)
    return found[:limit] if limit else found


def _requests(
    questions: dict[str, list[BenchmarkQuestion]], eval_id: str, k: int, version: int,
    sampling: SamplingSettings, evaluator: str, model: str, scoring: Scoring = "reference",
) -> list[RolloutRequested]:  # fmt: skip
    from asearcher.consumers.evaluation.benchmarks import eval_requests

    requests = []
    for name, found in questions.items():
        for request in eval_requests(found, eval_id=eval_id, benchmark=name, k=k,
                                     policy_version=version, sampling=sampling,
                                     evaluator=evaluator, scoring=scoring):  # fmt: skip
            request.metadata["model"] = model
            requests.append(request)
    return requests


def _follow(connection, eval_id: str, requests: list, k: int, timeout: float) -> EvalWatch:
    """Send the requests, then follow trajectories and results until every benchmark has its
    result (or the timeout, which is reported with counts)."""
    from asearcher.streams.io.producer import EventProducer
    from asearcher.streams.io.watch import TopicWatch
    from asearcher.streams.wire.topics import EVAL_REQUESTS, EVAL_RESULTS, EVAL_TRAJECTORIES

    def ours(event) -> bool:
        return getattr(event, "metadata", {}).get("eval_id") == eval_id

    picks = {EVAL_TRAJECTORIES: ours, EVAL_RESULTS: lambda e: e.eval_id == eval_id}
    benchmarks = {r.metadata["benchmark"] for r in requests}
    with TopicWatch(connection.settings, connection.codec, picks) as watch:
        with EventProducer(connection.settings, connection.codec) as producer:
            for request in requests:
                producer.send(EVAL_REQUESTS, request)
        on = ", ".join(sorted(benchmarks))
        console.print(f"evaluation {eval_id}: {len(requests)} questions x {k} samples at "
                      f"v{requests[0].policy_version} on {on}")  # fmt: skip
        _wait(eval_id, watch, benchmarks, len(requests) * k, timeout)
    return EvalWatch.of(eval_id, watch)


def _wait(
    eval_id: str, watch: TopicWatch, benchmarks: set[str], expected: int, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())  # fmt: skip
    with LoggedProgress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("trajectories", total=expected)
        while (seen := EvalWatch.of(eval_id, watch)).results.keys() < benchmarks:
            count = len(seen.trajectories)
            progress.update(task, completed=min(count, expected),
                            description=f"trajectories ({len(seen.results)}/{len(benchmarks)} "
                            "benchmarks scored)")  # fmt: skip
            if time.monotonic() > deadline:
                missing = sorted(benchmarks - set(seen.results))
                raise CliError(
                    f"timed out: {count} of {expected} trajectories in, no result yet for "
                    f"{', '.join(missing)}; are the evaluator, the tool workers and the "
                    "evaluation processor running? (asearcher stream status)"
                )
            time.sleep(0.5)
