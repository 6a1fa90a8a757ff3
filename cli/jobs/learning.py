"""The main job behind `asearcher learn`, without typer: the run's evaluations before and after
async RL, the RL phase followed a line per version, and the summary it leaves for scripts.

The run is brought up by the command (`cli/run/topology.py`) with the RL services held; this job
evaluates the start, lets RL go for a given time, stops the RL services, evaluates the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import msgspec
from rich.console import Console

from asearcher.cli.errors import CliError
from asearcher.cli.jobs.version_choice import VersionChoice, choose_version
from asearcher.cli.wiring import ClusterOptions, as_cli_error
from asearcher.streams.wire.events import (
    EvalResult,
    SamplingSettings,
    TrainerStepFinished,
    TrajectoriesDropped,
)

if TYPE_CHECKING:
    from asearcher.cli.jobs.evaluation import EvalWatch
    from asearcher.cli.run.config import Paths, RunConfig
    from asearcher.consumers.world.world import WorldQuestion
    from asearcher.streams.io.watch import TopicWatch

console = Console()
LEARNING_RUN = "cpu-learn.toml"  # in asearcher.infra/recipes
# The services RL needs, in the order they stop; the evaluation side stays for the last one.
RL_SERVICES = ("feeder", "rollout-", "trainer")
SUMMARY_FILE = "learn-summary.json"  # in the run's directory, rewritten by each `learn`
# Samples per held-out question before and after RL. 4 narrowed the paired noise of a
# 5-minute run's change by about a tenth (±6.4-7.4 against ±7.2-8.5 points): the questions
# differ more than the samples do, and each evaluation took twice as long (docs/learning.md).
HELD_OUT_SAMPLES = 2
Group = TypeVar("Group", int, str)  # what held-out questions are grouped by: hops, kind


class LearnSummary(msgspec.Struct, kw_only=True):
    """What one `asearcher learn` measured (`<run dir>/learn-summary.json`), for scripts and
    benchmarks: the evaluations before and after RL, every RL step, every set of trajectories
    the trainer set aside between steps, and every continuous evaluation seen meanwhile (without
    the ledger's ids), and how long the RL phase ran."""

    run: str
    config: str  # the run config file
    rl_seconds: float
    before: EvalResult
    after: EvalResult
    steps: list[TrainerStepFinished]
    evaluations: list[EvalResult]
    drops: list[TrajectoriesDropped] = []
    # Per score, each held-out question's mean before and after: the paired comparison.
    before_by_question: dict[str, dict[str, float]] = {}
    after_by_question: dict[str, dict[str, float]] = {}
    # F1 and EM of answering each held-out question without reading (its template's commonest
    # train answer, `consumers/world/guessing.py`); empty where the questions are not a world's.
    without_reading: dict[str, float] = {}
    # The version scored after RL and why (the last, or one rated among the best: `eval.keep_best`).
    choice: VersionChoice | None = None
    # With `learn --score-last` where another version was scored: the last version on the same
    # held-out questions, and per score each question's mean (what `eval.keep_best` changed).
    last_after: EvalResult | None = None
    last_after_by_question: dict[str, dict[str, float]] = {}

    def paired_noise(self, score: str, after_last: bool = False) -> float | None:
        """Two standard errors of the per-question change in `score` from before RL to after
        (`after_last`: from the last version to the one scored after RL); None without both
        evaluations' questions, as in summaries written before they were kept."""
        from asearcher.consumers.evaluation.eval_scores import paired_change_noise

        start = self.last_after_by_question if after_last else self.before_by_question
        return paired_change_noise(start.get(score, {}),
                                   self.after_by_question.get(score, {}))  # fmt: skip


class HopsRow(msgspec.Struct, frozen=True):
    """The held-out questions of one length: how many, and their mean F1 and pages read per
    sample before and after RL."""

    hops: int
    questions: int
    f1: tuple[float, float]
    pages: tuple[float, float]


class KindRow(msgspec.Struct, frozen=True):
    """The held-out questions of one kind (a world question's template, e.g.
    "person:birthplace.founded_year"): how many, and their mean F1 and pages read per sample
    before and after RL."""

    kind: str
    questions: int
    f1: tuple[float, float]
    pages: tuple[float, float]


def by_hops(summary: LearnSummary, world_dir: Path) -> list[HopsRow]:
    """The before/after comparison split by the hops each held-out question takes (empty
    where the questions are not a synthetic world's): what RL changed on short and on long
    questions, e.g. fewer pages where one suffices."""
    groups = _grouped(summary, world_dir, lambda q: q.hops)
    return [HopsRow(hops, len(ids), *_before_after(summary, ids))
            for hops, ids in sorted(groups.items())]  # fmt: skip


def by_kind(summary: LearnSummary, world_dir: Path) -> list[KindRow]:
    """The before/after comparison split by each held-out question's kind, the kinds with
    most questions first (empty where the questions have no kind): which kinds the policy
    answers, and which RL moved."""
    groups = _grouped(summary, world_dir, lambda q: q.kind)
    groups.pop("", None)
    return [KindRow(kind, len(ids), *_before_after(summary, ids))
            for kind, ids in sorted(groups.items(), key=lambda g: (-len(g[1]), g[0]))]  # fmt: skip


def _grouped(
    summary: LearnSummary, world_dir: Path, key: Callable[[WorldQuestion], Group]
) -> dict[Group, list[str]]:
    """The ids of the questions scored before and after RL, grouped by `key` of their world
    question."""
    from asearcher.consumers.world.world import read_world_questions

    questions = {q.id: q for q in read_world_questions(world_dir) or []}
    before, after = summary.before_by_question, summary.after_by_question
    shared = before.get("f1", {}).keys() & after.get("f1", {}).keys() & questions.keys()
    groups: dict[Group, list[str]] = {}
    for qid in sorted(shared):
        groups.setdefault(key(questions[qid]), []).append(qid)
    return groups


def _before_after(
    summary: LearnSummary, ids: list[str]
) -> tuple[tuple[float, float], tuple[float, float]]:
    """Mean F1 and pages per sample of the questions `ids`, before and after RL."""

    def mean(means: dict[str, dict[str, float]], name: str) -> float:
        values = means.get(name, {})
        return sum(values.get(q, 0.0) for q in ids) / len(ids)

    before, after = summary.before_by_question, summary.after_by_question
    return ((mean(before, "f1"), mean(after, "f1")),
            (mean(before, "accesses"), mean(after, "accesses")))  # fmt: skip


def read_summary(path: Path) -> LearnSummary:
    """The summary a `learn` wrote at `path`."""
    return msgspec.json.decode(path.read_bytes(), type=LearnSummary)


def learning_run_file() -> Path:
    """The embedded learning run config shipped with the package."""
    return Path(str(resources.files("asearcher.infra") / "recipes" / LEARNING_RUN))


def _names(supervisor, prefix: str) -> list[str]:
    return [p.name for p in supervisor.processes() if p.name.startswith(prefix)]


def wait_for_services(supervisor, held: tuple[str, ...] = ()) -> None:
    from asearcher.cli.run.topology import wait_until_running

    with console.status("waiting for the services to run"):
        behind = wait_until_running(supervisor, held=held)
    if behind:
        raise CliError(
            f"services not running: {', '.join(behind)} (asearcher stream logs {behind[0]})"
        )


@dataclass(frozen=True)
class RlPhase:
    """Trainer steps, trajectories set aside between them and evaluation results of the run
    that the RL phase saw."""

    steps: list[TrainerStepFinished]
    drops: list[TrajectoriesDropped]
    results: list[EvalResult]
    passed_over: int = 0  # questions the feeder passed over meanwhile (their groups were flat)


class LearningJob:
    """The run's evaluations and its RL phase, through the run's own services."""

    def __init__(
        self,
        config: RunConfig,
        where: Paths,
        options: ClusterOptions,
        questions: int | None,
        k: int,
    ) -> None:
        from asearcher.cli.jobs.evaluation import benchmark_questions, checked_sampling

        self.config, self.where, self.k = config, where, k
        self.connection = options.connect(check_local=True)
        held_out = benchmark_questions("world", None, "test", where.world_dir, questions)
        self.questions = {"world": held_out}
        sampling = config.eval.config.sampling
        self.sampling = checked_sampling(sampling.temperature, sampling.top_p,
                                         sampling.max_turns, sampling.max_new_tokens_per_turn,
                                         k, seed=sampling.seed)  # fmt: skip

    def version(self) -> int:
        """The run's newest announced version (0: the initial policy)."""
        from asearcher.streams.wire.topics import WEIGHTS
        from asearcher.trainer.runtime.service import last_announced
        from asearcher.trainer.runtime.weight_publisher import WeightStore

        announced = last_announced(self.connection.settings, self.connection.codec, WEIGHTS,
                                   self.config.name, WeightStore(self.where.store))  # fmt: skip
        return announced.version if announced is not None else 0

    def without_reading(self) -> dict[str, float]:
        """F1 and EM of guessing the evaluated held-out questions by their templates (empty
        where the run's questions are not a synthetic world's)."""
        from asearcher.consumers.world.guessing import world_template_guess

        evaluated = {question.id for question in self.questions["world"]}
        guess = world_template_guess(self.where.world_dir, evaluated)
        return {} if guess is None else {"f1": guess.f1, "em": guess.em}

    def evaluate(
        self, label: str, version: int | None = None
    ) -> tuple[EvalResult, dict[str, dict[str, float]]]:
        """Evaluate `version` (default the newest) on the held-out questions: its result, and
        per score each question's mean."""
        from asearcher.consumers.evaluation.eval_scores import question_means

        version = self.version() if version is None else version
        count = len(self.questions["world"])
        watch = self._play(f"evaluation {label}: v{version}, {count} held-out questions x {self.k}",
                           self.questions, version, self.k, self.sampling)  # fmt: skip
        return watch.results["world"], question_means(watch.trajectories.values())

    def _play(
        self, heading: str, questions: dict, version: int, k: int, sampling: SamplingSettings
    ) -> EvalWatch:
        """One evaluation of `version` through the run's services, under a `heading` rule."""
        from asearcher.cli.jobs.evaluation import evaluate

        console.rule(heading)
        return evaluate(self.connection, self.config.name, questions, version, k, sampling,
                        timeout=1800.0)  # fmt: skip

    def validate_last(self, results: list[EvalResult], last: int) -> list[EvalResult]:
        """With `eval.keep_best`: the `last` version evaluated the way continuous evaluation
        evaluates (its benchmark, split, questions, samples and sampling) when continuous
        evaluation did not reach it, so that the last version can be chosen too; else none."""
        from asearcher.cli.jobs.evaluation import benchmark_questions

        every = self.config.eval.config
        benchmark = every.benchmarks[0]
        if not self.config.eval.keep_best or any(
            r.policy_version == last and r.benchmark == benchmark for r in results
        ):
            return []
        questions = benchmark_questions(benchmark, every.data_dir, every.split,
                                        self.where.world_dir, every.limit)  # fmt: skip
        heading = (f"evaluation of the last version, v{last}, as continuous evaluation does: "
                   f"{len(questions)} {every.split} questions x {every.samples}")  # fmt: skip
        watch = self._play(heading, {benchmark: questions}, last, every.samples, every.sampling)
        return [watch.results[benchmark]]

    def train(self, seconds: float, start: Callable[[], None], stop: Callable[[], None]) -> RlPhase:
        """Call `start` to let RL go, follow it for `seconds`, a line per new version, then
        `stop` it and follow on until the step of the last version it announced is in (a
        trainer that is stopped mid-step finishes and announces that step); what was seen."""
        from asearcher.streams.io.watch import TopicWatch
        from asearcher.streams.wire.topics import EVAL_RESULTS, TRAINER_METRICS

        console.rule(f"async RL for {seconds / 60:.1f} minutes")
        run = self.config.name
        trainer_events = (TrainerStepFinished, TrajectoriesDropped)
        picks = {
            TRAINER_METRICS: lambda e: isinstance(e, trainer_events) and e.model == run,
            EVAL_RESULTS: lambda e: isinstance(e, EvalResult) and e.model == run,
        }
        with TopicWatch(self.connection.settings, self.connection.codec, picks) as watch:
            first, skipped = self.version(), self._skipped()
            start()
            shown = _follow(watch, seconds, self.config.eval.config.split)
            stop()
            _follow_stopped(watch, shown, first, self.version())
        steps, drops = _steps_and_drops(watch.events(TRAINER_METRICS))
        results = watch.events(EVAL_RESULTS)
        return RlPhase(steps, drops, results, self._skipped() - skipped)  # type: ignore[arg-type]

    def _skipped(self) -> int:
        """The positions the run's feeder has passed over so far (its committed progress)."""
        from asearcher.producers.rollout.feeder import last_progress

        topic = self.config.feeder.config.topics.progress
        settings, codec = self.connection.settings, self.connection.codec
        progress = last_progress(settings, codec, topic, self.config.name)
        return progress.skipped if progress is not None else 0

    def choose(self, results: list[EvalResult], last: int) -> VersionChoice:
        """The version to score after RL (`eval.keep_best`; else the `last`), among those the
        store holds."""
        from asearcher.streams.storage.weight_reader import WeightStoreReader

        keep_best, benchmark = self.config.eval.keep_best, self.config.eval.config.benchmarks[0]
        held = WeightStoreReader(self.where.store).versions() if keep_best else []
        rated = [r for r in results if r.benchmark == benchmark]
        choice = choose_version(rated, last, keep_best, held)
        console.print(f"scored after RL: v{choice.version}, {choice.reason}")
        return choice


def _steps_and_drops(events: list) -> tuple[list[TrainerStepFinished], list[TrajectoriesDropped]]:
    """The trainer's steps and its drops between steps, from its metrics events in order."""
    steps = [e for e in events if isinstance(e, TrainerStepFinished)]
    return steps, [e for e in events if isinstance(e, TrajectoriesDropped)]


def _start_rl(supervisor) -> None:
    started = supervisor.start_missing()
    if started:
        console.print(f"started {', '.join(started)}")
    wait_for_services(supervisor)


def _stop_rl(supervisor) -> None:
    supervisor.stop([n for p in RL_SERVICES for n in _names(supervisor, p)])


def _follow(watch: TopicWatch, seconds: float, split: str) -> int:
    """Print each new step and evaluation (of the questions of `split`) until `seconds` have
    passed; how many trainer events were shown."""
    from asearcher.streams.wire.topics import EVAL_RESULTS, TRAINER_METRICS

    deadline = time.monotonic() + seconds
    seen_trainer = shown_results = shown_steps = flat = 0
    with console.status("async RL: waiting for the first step") as status:
        while time.monotonic() < deadline:
            events = watch.events(TRAINER_METRICS, seen_trainer)
            results = watch.events(EVAL_RESULTS, shown_results)
            steps, drops = _steps_and_drops(events)
            flat += sum(d.dropped_flat_groups for d in drops)
            for step in steps:
                console.print(_step_line(step))
            for result in results:
                scores = result.averages
                console.print(
                    f"  [bold]eval v{result.policy_version}[/]: F1 {scores.get('f1', 0):.3f} "
                    f"EM {scores.get('em', 0):.3f} on {result.benchmark} ({split} split, "
                    f"{result.questions} questions)"
                )
            seen_trainer += len(events)
            shown_steps += len(steps)
            shown_results += len(results)
            left = deadline - time.monotonic()
            status.update(
                f"async RL: {shown_steps} steps, {flat} flat groups set aside since the last, "
                f"{left / 60:.1f} minutes left"
            )
            flat = 0 if steps else flat
            time.sleep(1.0)
    if not shown_steps:
        console.print(
            f"[yellow]no RL step in that time[/] ({flat} flat groups set aside): see `asearcher "
            "stream status` for why the trainer waits (flat groups, staleness, a missing service)"
        )
    return seen_trainer


def _follow_stopped(
    watch: TopicWatch, shown: int, first: int, announced: int, timeout: float = 60.0
) -> None:
    """After RL stopped (it began at version `first`; `announced` is the last version now):
    wait until the step that produced `announced` is in and print the steps not shown yet, so
    that the steps reported are those behind the version evaluated after RL. A version
    announced without its step event is reported after `timeout`, not waited for longer."""
    from asearcher.streams.wire.topics import TRAINER_METRICS

    def newest() -> int:
        steps, _ = _steps_and_drops(watch.events(TRAINER_METRICS))
        return max((s.version for s in steps), default=first)

    deadline = time.monotonic() + timeout
    while newest() < announced and time.monotonic() < deadline:
        time.sleep(0.5)
    late, _ = _steps_and_drops(watch.events(TRAINER_METRICS, shown))
    for step in late:
        console.print(f"{_step_line(step)} (after the RL deadline)")
    if (seen := newest()) < announced:
        console.print(
            f"[yellow]the trainer announced v{announced}, but the newest step seen produced "
            f"v{seen}[/] ({timeout:.0f} s after RL stopped): the steps reported end there"
        )


def _step_line(step: TrainerStepFinished) -> str:
    from asearcher.consumers.observability.metrics_processor import staleness_stats

    held = step.dropped_flat_groups + step.dropped_small_groups + step.dropped_stale
    staleness, _ = staleness_stats(step.staleness_counts) or (0.0, 0)
    return (
        f"v{step.version}: reward {step.stats.reward_mean:.3f} over {step.stats.samples} samples, "
        f"loss {step.stats.loss:+.4f}, staleness {staleness:.1f}, "
        f"{held} set aside since the last step, {step.stats.tokens_per_s:,.0f} tokens/s"
    )


def flat_share(
    steps: list[TrainerStepFinished], drops: list[TrajectoriesDropped]
) -> tuple[int, int]:
    """(groups trained, flat groups dropped): the flat ones carried no signal. The trainer
    reports flat groups with the step after them, or, when it commits them while waiting for
    a step (which may never come), with a `TrajectoriesDropped`: both count."""
    flat = sum(s.dropped_flat_groups for s in steps) + sum(d.dropped_flat_groups for d in drops)
    return sum(s.groups for s in steps), flat


def learning_phases(
    job: LearningJob, supervisor, minutes: float, config_file: Path, score_last: bool = False
) -> tuple[LearnSummary, RlPhase]:
    """Evaluate the start, run async RL for `minutes`, stop the RL services, evaluate the end
    (and, with `score_last`, the last version too where another was chosen); the summary
    (written next to the run) and what the RL phase saw."""
    wait_for_services(supervisor, held=RL_SERVICES)
    before, before_by_question = job.evaluate("before RL")
    started = time.monotonic()
    phase = job.train(minutes * 60.0, lambda: _start_rl(supervisor), lambda: _stop_rl(supervisor))
    rl_seconds = time.monotonic() - started
    last = job.version()
    evaluations = phase.results + job.validate_last(phase.results, last)
    choice = job.choose(evaluations, last)
    after, after_by_question = job.evaluate("after RL", choice.version)
    last, last_by_question = None, {}
    if score_last and choice.version != choice.last:
        last, last_by_question = job.evaluate("of the last version", choice.last)
    steps = [msgspec.structs.replace(s, trained_ids=[], dropped_ids=[]) for s in phase.steps]
    drops = [msgspec.structs.replace(d, dropped_ids=[]) for d in phase.drops]
    summary = LearnSummary(run=job.config.name, config=str(config_file), rl_seconds=rl_seconds,
                           before=before, after=after, steps=steps, evaluations=evaluations,
                           drops=drops, before_by_question=before_by_question,
                           after_by_question=after_by_question,
                           without_reading=job.without_reading(), choice=choice,
                           last_after=last, last_after_by_question=last_by_question)  # fmt: skip
    write_summary(summary, job.where.run_dir / SUMMARY_FILE)
    return summary, phase


def write_summary(summary: LearnSummary, path: Path) -> None:
    with as_cli_error(OSError, os_error=f"cannot write the summary {path}"):
        path.write_bytes(msgspec.json.format(msgspec.json.encode(summary)))
    console.print(f"summary: {path}")
