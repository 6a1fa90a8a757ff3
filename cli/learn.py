"""`asearcher learn`: the main job, an end-to-end training run that shows the agent learning.

1. `stream up` with the learning run (`infra/recipes/cpu-learn.toml` unless -c names another):
   the broker, the world, the policy, the warm start (the expert demonstrates on the train
   split, the policy clones it into v1) and every service: tools, rollout producer, trainer,
   feeder, evaluator, evaluation processor, metrics;
2. evaluates the version RL starts from on the held-out split;
3. lets async RL run for `--minutes`, printing a line per new version (continuous evaluation
   scores every Nth version meanwhile);
4. stops the feeder, the producers and the trainer, evaluates the last version the same way;
5. prints both evaluations side by side, draws the curves (PNG; TensorBoard files come from
   the metrics service), names a trajectory to replay, and stops the run's services. The broker
   keeps the event log for replay (`asearcher stream down` stops it).

Running it again reuses the world, the policy and the warm start, and continues the run's RL
from its last version.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import msgspec
import typer
from rich.console import Console
from rich.table import Table

from asearcher.cli.errors import CliError
from asearcher.cli.wiring import ClusterOptions, as_cli_error, with_cluster
from asearcher.streams.wire.events import EvalResult, TrainerStepFinished

if TYPE_CHECKING:
    from asearcher.cli.run.config import Paths, RunConfig
    from asearcher.streams.io.watch import TopicWatch

console = Console()
LEARNING_RUN = "cpu-learn.toml"  # in asearcher.infra/recipes
# The services RL needs, in the order they stop; the evaluation side stays for the last one.
RL_SERVICES = ("feeder", "rollout-", "trainer")
SUMMARY_FILE = "learn-summary.json"  # in the run's directory, rewritten by each `learn`


class LearnSummary(msgspec.Struct, kw_only=True):
    """What one `asearcher learn` measured (`<run dir>/learn-summary.json`), for scripts and
    benchmarks: the evaluations before and after RL, every RL step and continuous evaluation
    seen meanwhile (without the ledger's ids), and how long the RL phase ran."""

    run: str
    config: str  # the run config file
    rl_seconds: float
    before: EvalResult
    after: EvalResult
    steps: list[TrainerStepFinished]
    evaluations: list[EvalResult]


def read_summary(path: Path) -> LearnSummary:
    """The summary a `learn` wrote at `path`."""
    return msgspec.json.decode(path.read_bytes(), type=LearnSummary)


def learning_run_file() -> Path:
    """The embedded learning run config shipped with the package."""
    return Path(str(resources.files("asearcher.infra") / "recipes" / LEARNING_RUN))


@with_cluster
def learn(
    config_file: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Run config (TOML).", show_default=LEARNING_RUN),
    ] = None,
    minutes: Annotated[float, typer.Option(help="How long async RL runs.")] = 5.0,
    eval_questions: Annotated[
        int, typer.Option(help="Held-out questions in the before/after evaluations.")
    ] = 40,
    samples: Annotated[int, typer.Option(help="Samples per question (Avg@k, Pass@k).")] = 2,
    out: Annotated[
        Path | None,
        typer.Option(help="Directory for the curves (PNG).", show_default="<run dir>/figures"),
    ] = None,
    port: Annotated[int, typer.Option(help="Port of the local broker.")] = 9092,
    *,
    cluster: ClusterOptions,
) -> None:
    """Train the agent end to end: warm start (SFT on the expert), async RL with continuous
    evaluation, then the evaluation before and after RL, the curves and where to replay.

    Without -c it runs the embedded CPU learning run (about 20 minutes on 2 cores the first
    time, 4 of them pretraining the policy and 5 the warm start); again, it reuses what was
    built and continues RL from the run's last version.
    """
    from asearcher.cli.run import topology
    from asearcher.cli.run.config import load_run_config, paths
    from asearcher.cli.wiring import broker_up
    from asearcher.streams.cluster.settings import state_dir

    if minutes <= 0 or eval_questions < 1 or samples < 1:
        raise CliError("--minutes must be positive, --eval-questions and --samples at least 1")
    with as_cli_error(ValueError):
        config = load_run_config(config_file or learning_run_file())
    if not config.eval.replicas:
        raise CliError("eval.replicas is 0: the job evaluates with the run's evaluators")
    settings = broker_up(port, cluster.bootstrap, cluster.kafka_config, cluster.home)
    where = paths(config, state_dir(cluster.home))
    with as_cli_error(ValueError):
        # RL waits for the evaluation before it: otherwise its first steps pass unwatched.
        supervisor = topology.up(config, settings, where.home, held=RL_SERVICES)
    try:
        _wait_for_services(supervisor, held=RL_SERVICES)
        options = replace(cluster, claims_url=cluster.claims_url or where.claims)
        job = _Job(config, where, options, eval_questions, samples)
        before = job.evaluate("before RL")
        started = time.monotonic()
        watch = job.train(minutes * 60.0, lambda: _start_rl(supervisor))
        supervisor.stop([n for p in RL_SERVICES for n in _names(supervisor, p)])
        rl_seconds = time.monotonic() - started
        after = job.evaluate("after RL")
        _report(before, after, watch)
        steps = [msgspec.structs.replace(s, trained_ids=[], dropped_ids=[]) for s in watch.steps]
        summary = LearnSummary(run=config.name, config=str(config_file or learning_run_file()),
                               rl_seconds=rl_seconds, before=before, after=after, steps=steps,
                               evaluations=watch.results)  # fmt: skip
        _write_summary(summary, where.run_dir / SUMMARY_FILE)
        _figures(job, out or where.run_dir / "figures")
        _replay_hint(watch)
        _ask_hint(job, cluster.home)
    finally:
        topology.down(supervisor)
    console.print(
        f"run {config.name!r} stopped; the broker keeps its event log (`asearcher stream down` "
        "stops it). Run `asearcher learn` again to continue from the last version."
    )


def _names(supervisor, prefix: str) -> list[str]:
    return [p.name for p in supervisor.processes() if p.name.startswith(prefix)]


def _wait_for_services(supervisor, held: tuple[str, ...] = ()) -> None:
    from asearcher.cli.run.topology import wait_until_running

    with console.status("waiting for the services to run"):
        behind = wait_until_running(supervisor, held=held)
    if behind:
        raise CliError(
            f"services not running: {', '.join(behind)} (asearcher stream logs {behind[0]})"
        )


@dataclass(frozen=True)
class _Watch:
    """Trainer steps and evaluation results of the run that the RL phase saw."""

    steps: list[TrainerStepFinished]
    results: list[EvalResult]


class _Job:
    """The run's evaluations and its RL phase, through the run's own services."""

    def __init__(
        self, config: RunConfig, where: Paths, options: ClusterOptions, questions: int, k: int
    ) -> None:
        from asearcher.cli.jobs.evaluation import benchmark_questions, checked_sampling

        self.config, self.where, self.k = config, where, k
        self.connection = options.connect(check_local=True)
        held_out = benchmark_questions("world", None, "test", where.world_dir, questions)
        self.questions = {"world": held_out}
        sampling = config.eval.config.sampling
        self.sampling = checked_sampling(sampling.temperature, sampling.top_p,
                                         sampling.max_turns, sampling.max_new_tokens_per_turn,
                                         k)  # fmt: skip

    def version(self) -> int:
        """The run's newest announced version (0: the initial policy)."""
        from asearcher.streams.wire.topics import WEIGHTS
        from asearcher.trainer.runtime.service import last_announced
        from asearcher.trainer.runtime.weight_publisher import WeightStore

        announced = last_announced(self.connection.settings, self.connection.codec, WEIGHTS,
                                   self.config.name, WeightStore(self.where.store))  # fmt: skip
        return announced.version if announced is not None else 0

    def evaluate(self, label: str) -> EvalResult:
        from asearcher.cli.jobs.evaluation import evaluate

        version = self.version()
        count = len(self.questions["world"])
        console.rule(f"evaluation {label}: v{version}, {count} held-out questions x {self.k}")
        watch = evaluate(self.connection, self.config.name, self.questions, version, self.k,
                         self.sampling, timeout=1800.0)  # fmt: skip
        return watch.results["world"]

    def train(self, seconds: float, start: Callable[[], None]) -> _Watch:
        """Call `start` to let RL go, then follow it for `seconds`, a line per new version;
        what was seen."""
        from asearcher.streams.io.watch import TopicWatch
        from asearcher.streams.wire.topics import EVAL_RESULTS, TRAINER_METRICS

        console.rule(f"async RL for {seconds / 60:.1f} minutes")
        run = self.config.name
        picks = {
            TRAINER_METRICS: lambda e: isinstance(e, TrainerStepFinished) and e.model == run,
            EVAL_RESULTS: lambda e: isinstance(e, EvalResult) and e.model == run,
        }
        with TopicWatch(self.connection.settings, self.connection.codec, picks) as watch:
            start()
            _follow(watch, seconds)
        return _Watch(watch.events(TRAINER_METRICS), watch.events(EVAL_RESULTS))  # type: ignore[arg-type]


def _start_rl(supervisor) -> None:
    started = supervisor.start_missing()
    if started:
        console.print(f"started {', '.join(started)}")
    _wait_for_services(supervisor)


def _follow(watch: TopicWatch, seconds: float) -> None:
    """Print each new step and evaluation until `seconds` have passed."""
    from asearcher.streams.wire.topics import EVAL_RESULTS, TRAINER_METRICS

    deadline = time.monotonic() + seconds
    shown_steps = shown_results = 0
    with console.status("async RL: waiting for the first step") as status:
        while time.monotonic() < deadline:
            steps = watch.events(TRAINER_METRICS, shown_steps)
            results = watch.events(EVAL_RESULTS, shown_results)
            for step in steps:
                console.print(_step_line(step))
            for result in results:
                scores = result.averages
                console.print(
                    f"  [bold]eval v{result.policy_version}[/]: F1 {scores.get('f1', 0):.3f} "
                    f"EM {scores.get('em', 0):.3f} on {result.benchmark}"
                )
            shown_steps += len(steps)
            shown_results += len(results)
            left = deadline - time.monotonic()
            status.update(f"async RL: {shown_steps} steps, {left / 60:.1f} minutes left")
            time.sleep(1.0)
    if not shown_steps:
        console.print(
            "[yellow]no RL step in that time[/]: see `asearcher stream status` for why the "
            "trainer waits (flat groups, staleness, a missing service)"
        )


def _step_line(step: TrainerStepFinished) -> str:
    from asearcher.consumers.observability.metrics_processor import staleness_stats

    held = step.dropped_flat_groups + step.dropped_small_groups + step.dropped_stale
    staleness, _ = staleness_stats(step.staleness_counts) or (0.0, 0)
    return (
        f"v{step.version}: reward {step.reward_mean:.3f} over {step.samples} samples, "
        f"loss {step.loss:+.4f}, staleness {staleness:.1f}, "
        f"{held} set aside since the last step, {step.tokens_per_s:,.0f} tokens/s"
    )


def _report(before: EvalResult, after: EvalResult, watch: _Watch) -> None:
    from asearcher.consumers.evaluation.eval_scores import change_noise, render_table

    console.rule("the agent before and after async RL (held-out questions)")
    Console(width=max(console.width, 160)).print(render_table([before, after]))
    table = Table(title="change", caption=(
        f"noise: two standard errors over {min(before.questions, after.questions)} questions "
        "(an upper bound); a change within it may be chance"))  # fmt: skip
    columns = ("metric", f"v{before.policy_version}", f"v{after.policy_version}", "change", "noise")
    for column in columns:
        table.add_column(column, justify="right")
    for metric in ("f1", "em", "cem"):
        old, new = before.averages.get(metric, 0.0), after.averages.get(metric, 0.0)
        noise = 100 * change_noise(before, after, metric)
        table.add_row(metric, f"{old:.3f}", f"{new:.3f}", f"{100 * (new - old):+.1f} points",
                      f"±{noise:.1f} points")  # fmt: skip
    console.print(table)
    trained = sum(step.samples for step in watch.steps)
    console.print(f"{len(watch.steps)} RL steps trained {trained:,} trajectories")
    trained_groups, flat = flat_share(watch.steps)
    if trained_groups + flat:
        console.print(
            f"groups played: {trained_groups + flat:,}, {flat:,} of them flat and dropped "
            f"({flat / (trained_groups + flat):.0%}: every answer equally right or wrong)"
        )


def flat_share(steps: list[TrainerStepFinished]) -> tuple[int, int]:
    """(groups trained, flat groups dropped) over the steps: the flat ones carried no signal."""
    return sum(s.groups for s in steps), sum(s.dropped_flat_groups for s in steps)


def _write_summary(summary: LearnSummary, path: Path) -> None:
    with as_cli_error(OSError, os_error=f"cannot write the summary {path}"):
        path.write_bytes(msgspec.json.format(msgspec.json.encode(summary)))
    console.print(f"summary: {path}")


def _figures(job: _Job, out: Path) -> None:
    from asearcher.cli.jobs.plots import plot_run, read_run
    from asearcher.streams.wire.topics import EVAL_RESULTS, TRAINER_METRICS

    steps, results, _ = read_run(job.connection.settings, job.connection.codec, job.config.name,
                                 [TRAINER_METRICS, EVAL_RESULTS])  # fmt: skip
    if not steps and not results:
        return
    with as_cli_error(OSError, os_error=f"cannot write the figures into {out}"):
        written = plot_run(steps, results, out)
    console.print(f"curves: {', '.join(str(p) for p in written)}")
    console.print(f"TensorBoard: tensorboard --logdir {job.where.run_dir / 'tensorboard'}")


def _ask_hint(job: _Job, home: Path | None) -> None:
    """How to watch the trained agent play a held-out question."""
    import shlex

    question = job.questions["world"][0]
    where = f" --home {shlex.quote(str(home))}" if home else ""
    console.print(
        "watch the trained agent answer a held-out question, turn by turn:\n"
        f"  asearcher ask --run {job.config.name}{where} {shlex.quote(question.question)} "
        f"--answer {shlex.quote(question.answers[0])}"
    )


def _replay_hint(watch: _Watch) -> None:
    trained = [i for step in watch.steps for i in step.trained_ids]
    if not trained:
        return
    console.print(
        "replay a trained trajectory turn by turn:\n  asearcher replay rollout.steps tool.calls "
        f"tool.results trajectories -t {trained[-1]}"
    )
