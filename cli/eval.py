"""`asearcher eval run|serve|process`: score weight versions on benchmarks.

`eval run` is the job: it asks for k samples of every question of each benchmark at one weight
version (on `eval.requests`), follows the evaluation's trajectories with a progress bar, waits
for the evaluation processor's `EvalResult` per benchmark, prints the reference's table and
writes per-question records. The evaluator (`eval serve`, a rollout service that loads exactly
the requested version and trains nothing) and the processor (`eval process`, a faust app) are
services: `stream up` starts both with a run, or `eval run --engine` starts an evaluator of its
own for the job.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from asearcher.cli.errors import CliError
from asearcher.cli.options import (
    Instance,
    RunFile,
    SavedRun,
    StoreUrl,
    overriding,
)
from asearcher.cli.wiring import (
    ClusterOptions,
    as_cli_error,
    chosen_run_config,
    run_processor,
    serve_producer,
    state_home,
    weights_version,
    with_cluster,
)
from asearcher.producers.rollout.service import RolloutConfig

if TYPE_CHECKING:
    from asearcher.cli.run.config import Paths, RunConfig
    from asearcher.consumers.evaluation.benchmarks import BenchmarkQuestion
    from asearcher.streams.service.children import JobChildren
from asearcher.cli.jobs.evaluation import (
    EvalWatch,
    benchmark_questions,
    checked_sampling,
    evaluate,
    new_eval_id,
)

console = Console()
app = typer.Typer(help="Evaluation: score weight versions on benchmarks.", no_args_is_help=True)


@app.command("serve")
@with_cluster
def serve(
    config_file: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Rollout config (TOML), see docs/rollout.md."),
    ] = None,
    engine: Annotated[
        str, typer.Option(help="transformers, vllm, expert or endpoint.")
    ] = "transformers",
    model: Annotated[
        Path | None, typer.Option(help="The initial policy (version 0).", show_default=False)
    ] = None,
    qa: Annotated[Path | None, typer.Option(help="Expert engine: the QA it knows.")] = None,
    group: Annotated[str | None, typer.Option(help=overriding(RolloutConfig, "group_id"))] = None,
    instance: Instance = None,
    max_groups: Annotated[int | None, typer.Option(help="Stop after this many groups.")] = None,
    store: StoreUrl = None,
    *,
    cluster: ClusterOptions,
) -> None:
    """Play evaluation requests, each with exactly the weight version it names, until stopped.

    Evaluators read eval.requests and write eval.trajectories, which no trainer reads, and are
    not held by the staleness bound. A version is loaded from the weight store once nothing of
    the previous one is in flight, so no trajectory mixes versions.
    """
    with as_cli_error(ValueError):
        config = evaluator_config(config_file, group_id=group, instance=instance, store=store)
    serve_producer("evaluator", config, engine, model, qa, 0.0, cluster, max_groups)


def evaluator_config(path: Path | None, **overrides: str | None) -> RolloutConfig:
    """The rollout config of an evaluator: eval mode, eval topics, no staleness bound, and the
    evaluators' consumer group unless one is named."""
    import msgspec

    from asearcher.producers.rollout.service import (
        EVAL_GROUP,
        GROUP,
        RolloutTopics,
        load_rollout_config,
    )

    config = load_rollout_config(path, **overrides)
    staleness = msgspec.structs.replace(config.staleness, enabled=False)
    group_id = EVAL_GROUP if config.group_id == GROUP else config.group_id
    return msgspec.structs.replace(
        config, mode="eval", topics=RolloutTopics.for_eval(), staleness=staleness,
        group_id=group_id,
    )  # fmt: skip


@app.command("process")
@with_cluster
def process(
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config", "-c", help="Evaluation processor config (TOML), see docs/evaluation.md."
        ),
    ] = None,
    *,
    cluster: ClusterOptions,
    log_level: Annotated[str, typer.Option(help="Log level of the faust worker.")] = "INFO",
) -> None:
    """Run the evaluation processor (a faust app) until stopped: it gathers evaluation
    trajectories per benchmark and version, sends one EvalResult per finished evaluation, and
    (when configured) requests an evaluation of every Nth weight version of a run."""
    from asearcher.consumers.evaluation.eval_processor import (
        EvalProcessorConfig,
        serve_eval_processor,
    )

    run_processor("evaluation processor", EvalProcessorConfig, config_file, cluster, cluster.home,
                  log_level, serve_eval_processor)  # fmt: skip


@app.command("run")
@with_cluster
def run(
    benchmarks: Annotated[
        str, typer.Option(help="Comma-separated benchmark names ('world': the run's world).")
    ] = "world",
    data: Annotated[
        str | None, typer.Option(help="Benchmarks as DIR/<name>/<split>.jsonl (path or URL).")
    ] = None,
    split: Annotated[str, typer.Option(help="The split file of each benchmark.")] = "test",
    profile: Annotated[
        str,
        typer.Option(
            help="reference: the paper's protocol (k 4, temperature 0.6, top-p 0.95, 64 calls "
            "of 4,096 tokens, the reference's scoring); training: 16 calls of 128 tokens, "
            "scored as the training reward. The options below override it."
        ),
    ] = "reference",
    k: Annotated[
        int | None, typer.Option("--k", help="Samples per question (Avg@k, Pass@k).")
    ] = None,
    weights: Annotated[str, typer.Option(help="The weight version: vN, N or latest.")] = "latest",
    limit: Annotated[int | None, typer.Option(help="Questions per benchmark at most.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
    top_p: Annotated[float | None, typer.Option(help="Nucleus sampling.")] = None,
    max_turns: Annotated[int | None, typer.Option(help="LLM calls per trajectory at most.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Tokens per call at most.")] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            help="Seed of the sampling: the same version with the same seed plays the same "
            "trajectories (on an engine that honours seeds).",
            show_default="unseeded",
        ),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(help="Start an evaluator of this engine for the job (else the run's)."),
    ] = None,
    model: Annotated[
        Path | None, typer.Option(help="With --engine: the initial policy.", show_default=False)
    ] = None,
    judge: Annotated[
        str | None, typer.Option(help="With --engine: an OpenAI-compatible judge base URL.")
    ] = None,
    judge_model: Annotated[str, typer.Option(help="The judge's model name.")] = "judge",
    out: Annotated[
        str | None, typer.Option(help="Per-question JSONL records here (path or URL).")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 3600.0,
    config_file: RunFile = None,
    run_name: SavedRun = None,
    weights_of: Annotated[
        str | None,
        typer.Option(
            "--weights-of",
            help="Play this run's versions (its store; e.g. one `retrain` made) with the run's "
            "services. Needs --engine.",
            show_default=False,
        ),
    ] = None,
    *,
    cluster: ClusterOptions,
) -> None:
    """Evaluate one weight version on benchmarks and print Avg@k and Pass@k per benchmark.

    By default with the reference's evaluation protocol (--profile reference), so the numbers
    compare with the paper's. Needs the run's tool workers and evaluation processor (`stream up`
    starts them), and its evaluator unless --engine starts one for this job.
    """
    from asearcher.cli.run.config import paths
    from asearcher.consumers.evaluation.eval_profiles import eval_profile
    from asearcher.streams.service.children import JobChildren

    with as_cli_error(ValueError):
        chosen = eval_profile(profile)
    k = chosen.k if k is None else k
    temperature = chosen.temperature if temperature is None else temperature
    top_p = chosen.top_p if top_p is None else top_p
    max_turns = chosen.max_turns if max_turns is None else max_turns
    max_new_tokens = chosen.max_new_tokens if max_new_tokens is None else max_new_tokens

    home = Path(cluster.home) if cluster.home else state_home()
    run_config = chosen_run_config(config_file, run_name, home)
    where = paths(run_config, home)
    if weights_of:
        where = _store_of(weights_of, engine, where)
    names = [name.strip() for name in benchmarks.split(",") if name.strip()]
    if not names:
        raise CliError("--benchmarks names no benchmark")
    if k < 1:
        raise CliError(f"--k must be at least 1, got {k}")
    questions = {
        name: benchmark_questions(name, data, split, where.world_dir, limit) for name in names
    }
    version = weights_version(weights, where.store)
    connection = cluster.connect(check_local=True)
    sampling = checked_sampling(temperature, top_p, max_turns, max_new_tokens, k, seed)
    eval_id = new_eval_id(weights_of or run_config.name, version)
    evaluator = f"asearcher-eval-{eval_id}" if engine else ""
    with JobChildren(where.run_dir / "logs") as children:
        if engine:
            _start_evaluator(children, engine, model or where.model_dir, evaluator,
                             run_config, where, judge, judge_model, cluster)  # fmt: skip
        watch = evaluate(connection, run_config.name, questions, version, k, sampling,
                         timeout, eval_id=eval_id, evaluator=evaluator,
                         scoring=chosen.scoring, weights_of=weights_of or "")  # fmt: skip
    _report(watch, names, questions, out)


def _store_of(other: str, engine: str | None, where: Paths) -> Paths:
    """`where` with run `other`'s weight store: its versions, played by this run's services."""
    import msgspec

    from asearcher.cli.run.config import paths

    if not engine:
        raise CliError("--weights-of needs --engine: the run's own evaluators play its own store")
    other_config = chosen_run_config(None, other, where.home)
    return msgspec.structs.replace(where, store=paths(other_config, where.home).store)


def _start_evaluator(
    children: JobChildren, engine: str, model: Path, group: str, run_config: RunConfig, where,
    judge: str | None, judge_model: str, cluster: ClusterOptions,
) -> None:  # fmt: skip
    """An evaluator for this job only, in its own consumer group (the requests name it), set up
    as the run's own evaluators are (its agent: prompts, turns, threads), its tool calls
    answered by the run's tool workers."""
    import msgspec

    from asearcher.cli.run.config import resolve
    from asearcher.cli.run.service_kinds import serve_command
    from asearcher.consumers.scoring.reward import JudgeConfig

    with as_cli_error(ValueError):
        config = msgspec.structs.replace(resolve(run_config, where).evaluator, group_id=group)
    if judge:
        reward = msgspec.structs.replace(
            config.agent.reward, judge=JudgeConfig(base_url=judge, model=judge_model)
        )
        config = msgspec.structs.replace(
            config, agent=msgspec.structs.replace(config.agent, reward=reward)
        )
    file = where.run_dir / "config" / f"{group}.json"
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(msgspec.json.encode(config))
    args = ["-c", str(file), "--engine", engine, "--model", str(model), "--group", group]
    if engine == "expert":
        args += ["--qa", str(where.world_dir / "qa_test.jsonl")]
    log = children.start(group, serve_command("evaluator", *args, *cluster.args()))
    console.print(f"starting an evaluator ({engine}) for this job; its log: {log}")


def _report(
    watch: EvalWatch, names: list[str], questions: dict[str, list[BenchmarkQuestion]],
    out: str | None,
) -> None:  # fmt: skip
    from asearcher.consumers.evaluation.eval_scores import (
        question_records,
        render_table,
        write_jsonl,
    )

    results = [watch.results[name] for name in names]
    # The reference's table is wide: never squeeze its numbers into ellipses.
    Console(width=max(console.width, 160)).print(render_table(results))
    if out is None:
        return
    with as_cli_error(OSError, ValueError):
        for name in names:
            mine = [t for t in watch.trajectories.values() if t.metadata.get("benchmark") == name]
            url = f"{out.rstrip('/')}/{watch.eval_id}/{name}.jsonl"
            write_jsonl(url, question_records(questions[name], mine))
            console.print(f"per-question records: {url}")
