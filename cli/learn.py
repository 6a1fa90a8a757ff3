"""`asearcher learn`: the main job, an end-to-end training run that shows the agent learning.

1. `stream up` with the learning run (`infra/recipes/cpu-learn.toml` unless -c names another):
   the broker, the world, the policy, the warm start (the expert demonstrates on the train
   split, the policy clones it into v1) and every service: tools, rollout producer, trainer,
   feeder, evaluator, evaluation processor, metrics;
2. evaluates the version RL starts from on the held-out split;
3. lets async RL run for `--minutes`, printing a line per new version (continuous evaluation
   scores every Nth version meanwhile, on validation questions in the embedded run);
4. stops the feeder, the producers and the trainer, evaluates the same way the last version or,
   with `eval.keep_best`, the latest the continuous evaluations rate within one standard error
   of the best;
5. prints both evaluations side by side, draws the curves (PNG; TensorBoard files come from
   the metrics service), names a trajectory to replay, and stops the run's services. The broker
   keeps the event log for replay (`asearcher stream down` stops it).

Running it again reuses the world, the policy and the warm start, and continues the run's RL
from its last version.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from asearcher.cli.errors import CliError
from asearcher.cli.jobs.learning import (
    HELD_OUT_SAMPLES,
    LEARNING_RUN,
    RL_SERVICES,
    LearningJob,
    LearnSummary,
    RlPhase,
    flat_share,
    learning_phases,
    learning_run_file,
)
from asearcher.cli.wiring import ClusterOptions, as_cli_error, with_cluster

console = Console()
# On the embedded run's 120-entity world 5 RL minutes (13-20 steps) gained beyond the noise in
# none of five seeds, 15 minutes in three, 30 in four (docs/learning.md): 15 is the shortest
# run that shows RL's gain more often than not.
DEFAULT_MINUTES = 15.0


@with_cluster
def learn(
    config_file: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Run config (TOML).", show_default=LEARNING_RUN),
    ] = None,
    minutes: Annotated[float, typer.Option(help="How long async RL runs.")] = DEFAULT_MINUTES,
    eval_questions: Annotated[
        int | None,
        typer.Option(
            help="Held-out questions in the before/after evaluations.", show_default="every one"
        ),
    ] = None,
    samples: Annotated[
        int, typer.Option(help="Samples per held-out question (Avg@k, Pass@k).")
    ] = HELD_OUT_SAMPLES,
    score_last: Annotated[
        bool,
        typer.Option(
            help="Where eval.keep_best scored another version, score the last one too on the "
            "same held-out questions (one more evaluation): what keep_best changed."
        ),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(help="Directory for the curves (PNG).", show_default="<run dir>/figures"),
    ] = None,
    port: Annotated[int, typer.Option(help="Port of the local broker.")] = 9092,
    *,
    cluster: ClusterOptions,
) -> None:
    """Train the agent end to end: warm start (SFT on the expert), async RL with continuous
    evaluation, then the evaluation before and after RL (with `eval.keep_best`, of the latest
    version rated within one standard error of the best, else the last), the curves and where
    to replay.

    Without -c it runs the embedded CPU learning run (about 36 minutes on 2 cores the first
    time on a machine: 6 of them pretrain the policy and 8-10 clone the expert into v1, both kept
    for later runs on the machine, which take about 20 minutes); again in the same home, it
    reuses what was built and continues RL from the run's last version. The change after RL is
    printed with its noise, paired question by question.
    """
    from asearcher.cli.run import topology
    from asearcher.cli.run.config import load_run_config, paths
    from asearcher.cli.wiring import broker_up
    from asearcher.streams.cluster.settings import state_dir

    if minutes <= 0 or (eval_questions is not None and eval_questions < 1) or samples < 1:
        raise CliError("--minutes must be positive, --eval-questions and --samples at least 1")
    with as_cli_error(ValueError):
        config = load_run_config(config_file or learning_run_file())
    if not config.eval.replicas:
        raise CliError("eval.replicas is 0: the job evaluates with the run's evaluators")
    settings = broker_up(
        port, cluster.bootstrap, cluster.kafka_config, cluster.home, brokers=config.brokers
    )
    where = paths(config, state_dir(cluster.home))
    with as_cli_error(ValueError):
        # RL waits for the evaluation before it: otherwise its first steps pass unwatched.
        supervisor = topology.up(config, settings, where.home, held=RL_SERVICES)
    try:
        options = replace(cluster, claims_url=cluster.claims_url or where.claims)
        job = LearningJob(config, where, options, eval_questions, samples)
        summary, phase = learning_phases(
            job, supervisor, minutes, config_file or learning_run_file(), score_last
        )
        _report(summary, phase)
        _report_splits(summary, where.world_dir)
        _figures(job, out or where.run_dir / "figures")
        _replay_hint(phase)
        _ask_hint(job, cluster.home, summary.after.policy_version)
    finally:
        topology.down(supervisor)
    console.print(
        f"run {config.name!r} stopped; the broker keeps its event log (`asearcher stream down` "
        "stops it). Run `asearcher learn` again to continue from the last version."
    )


def _report(summary: LearnSummary, watch: RlPhase) -> None:
    from asearcher.consumers.evaluation.eval_scores import change_noise, render_table

    before, after = summary.before, summary.after
    console.rule("the agent before and after async RL (held-out questions)")
    Console(width=max(console.width, 160)).print(render_table([before, after]))
    table = Table(title="change", caption=(
        f"noise: two standard errors of the change over {min(before.questions, after.questions)} "
        "questions, paired (each question against itself) and bounded (as if unpaired, scores "
        "of the widest spread); a change within the noise may be chance"))  # fmt: skip
    columns = ("metric", f"v{before.policy_version}", f"v{after.policy_version}", "change",
               "noise (paired)", "bound")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for metric in ("f1", "em", "cem"):
        old, new = before.averages.get(metric, 0.0), after.averages.get(metric, 0.0)
        paired = summary.paired_noise(metric)
        table.add_row(metric, f"{old:.3f}", f"{new:.3f}", f"{100 * (new - old):+.1f} points",
                      "-" if paired is None else f"±{100 * paired:.1f} points",
                      f"±{100 * change_noise(before, after, metric):.1f} points")  # fmt: skip
    console.print(table)
    if summary.last_after is not None:
        _report_last(summary)
    if summary.without_reading:
        guess = summary.without_reading
        console.print(
            f"without reading (each question answered with its template's commonest train "
            f"answer): F1 {guess['f1']:.3f}, EM {guess['em']:.3f}"
        )
    trained = sum(step.stats.samples for step in watch.steps)
    console.print(f"{len(watch.steps)} RL steps trained {trained:,} trajectories")
    trained_groups, flat = flat_share(watch.steps, watch.drops)
    if trained_groups + flat:
        console.print(
            f"groups played: {trained_groups + flat:,}, {flat:,} of them flat and dropped "
            f"({flat / (trained_groups + flat):.0%}: every trajectory rewarded alike)"
        )
    if watch.passed_over:
        console.print(
            f"questions passed over: {watch.passed_over:,} (the feeder's curriculum: their own "
            "or their kind's groups were mostly flat)"
        )


def _report_last(summary: LearnSummary) -> None:
    """The last version against the one scored, on the same held-out questions."""
    last, scored = summary.last_after, summary.after
    assert last is not None
    old, new = last.averages.get("f1", 0.0), scored.averages.get("f1", 0.0)
    noise = summary.paired_noise("f1", after_last=True)
    console.print(
        f"the last version, v{last.policy_version}, on the same questions: F1 {old:.3f}; the "
        f"scored v{scored.policy_version} {100 * (new - old):+.1f} points against it"
        + ("" if noise is None else f" (paired noise ±{100 * noise:.1f})")
    )


def _report_splits(summary: LearnSummary, world_dir: Path) -> None:
    """The comparison by hops, then by kind of question: where the policy answers, and
    where RL moved it."""
    from asearcher.cli.jobs.learning import by_hops, by_kind

    for title, column, rows in (
        ("by the hops a question takes (held-out, mean per sample)", "hops",
         [(str(r.hops), r) for r in by_hops(summary, world_dir)]),
        ("by kind of question (held-out, mean per sample)", "kind",
         [(r.kind, r) for r in by_kind(summary, world_dir)]),
    ):  # fmt: skip
        if not rows:
            continue
        table = Table(title=title)
        for name in (column, "questions", "F1 before -> after", "pages before -> after"):
            table.add_column(name, justify="right")
        for label, row in rows:
            table.add_row(label, str(row.questions), f"{row.f1[0]:.3f} -> {row.f1[1]:.3f}",
                          f"{row.pages[0]:.2f} -> {row.pages[1]:.2f}")  # fmt: skip
        console.print(table)


def _figures(job: LearningJob, out: Path) -> None:
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


def _ask_hint(job: LearningJob, home: Path | None, version: int) -> None:
    """How to watch the trained agent (the version scored after RL) play a held-out question."""
    import shlex

    question = job.questions["world"][0]
    where = f" --home {shlex.quote(str(home))}" if home else ""
    console.print(
        "watch the trained agent answer a held-out question, turn by turn:\n"
        f"  asearcher ask --run {job.config.name}{where} --weights v{version} "
        f"{shlex.quote(question.question)} --answer {shlex.quote(question.answers[0])}",
        soft_wrap=True,  # a command to copy must stay on one line, however narrow the terminal
    )


def _replay_hint(watch: RlPhase) -> None:
    trained = [i for step in watch.steps for i in step.trained_ids]
    if not trained:
        return
    console.print(
        "replay a trained trajectory turn by turn:\n  asearcher replay rollout.steps tool.calls "
        f"tool.results trajectories -t {trained[-1]}",
        soft_wrap=True,
    )
