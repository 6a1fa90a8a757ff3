"""`asearcher synth run|process`: the data-synthesis agent as a stream processor.

`synth run` is a job: it sends one seed per QA pair of a file (or per page of the run's world)
to `synth.requests`, starts the synthesis processors for the job (`synth process`)
and a tool worker, follows `synth.accepted` / `synth.rejected` until every seed has its outcome,
writes the accepted questions as a QA file the request feeder reads as is, and prints the
statistics (table and PNG). Seeds are named by the job and their content, so running the same
job again resumes it: finished seeds keep their outcome and only the rest are synthesized.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import msgspec
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from asearcher.cli.errors import CliError
from asearcher.cli.options import Instance, RunFile
from asearcher.cli.progress import LoggedProgress
from asearcher.cli.wiring import ClusterOptions, as_cli_error, service_command, with_cluster
from asearcher.streams.wire.events import (
    QuestionSynthesized,
    SynthesisCandidate,
    SynthesisRequested,
)

if TYPE_CHECKING:
    from asearcher.cli.run.config import Paths
    from asearcher.consumers.synthesis.stats import SynthStats
    from asearcher.producers.synthesis.processor import SynthProcessorConfig
    from asearcher.streams.io.watch import TopicWatch
    from asearcher.streams.service.children import JobChildren

app = typer.Typer(
    help="Data synthesis: harder training questions from seed QA pairs or pages.",
    no_args_is_help=True,
)
console = Console()


class SeedLine(msgspec.Struct):
    """One line of a seed file; other fields are ignored."""

    question: str
    answer: str | None = None
    answers: list[str] = []
    id: str | int | None = None


def seed_id(job: str, *parts: str) -> str:
    """A seed's id: its job and a digest of its content, so a job run again finds its seeds."""
    return f"{job}-{hashlib.sha256(chr(0).join(parts).encode()).hexdigest()[:16]}"


def seeds_from_file(path: Path, job: str) -> list[SynthesisRequested]:
    """A seed per line of `path` (`{"question", "answer"}`, or `answers`); ValueError naming
    the line that is not one."""
    seeds = []
    decoder = msgspec.json.Decoder(SeedLine)
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = decoder.decode(line)
        except msgspec.DecodeError as exc:
            raise ValueError(f"{path}:{number}: not a seed ({exc})") from exc
        answer = item.answer if item.answer is not None else next(iter(item.answers), "")
        if not answer:
            raise ValueError(f"{path}:{number}: the seed has no answer")
        seeds.append(
            SynthesisRequested(
                seed_id=seed_id(job, item.question, answer),
                question=item.question,
                answer=answer,
                metadata={"job": job, "source": str(item.id or number)},
            )
        )
    if not seeds:
        raise ValueError(f"{path} holds no seeds")
    return seeds


def seeds_from_pages(corpus: Path, count: int, job: str) -> list[SynthesisRequested]:
    """A seed per page for `count` pages of the world's corpus, spread evenly over it."""
    urls = [msgspec.json.decode(line)["url"] for line in corpus.read_bytes().splitlines() if line]
    step = max(1, len(urls) // count)
    return [
        SynthesisRequested(
            seed_id=seed_id(job, url), page_url=url, metadata={"job": job, "source": url}
        )
        for url in urls[::step][:count]
    ]


@dataclass(frozen=True)
class JobWatch:
    """What a job's watch saw of its seeds: the first outcome of each, and every candidate."""

    outcomes: dict[str, QuestionSynthesized]
    candidates: list[SynthesisCandidate]

    @classmethod
    def of(cls, watch: TopicWatch) -> JobWatch:
        """The job's seeds as `watch` saw them."""
        from asearcher.streams.wire.topics import SYNTH_ACCEPTED, SYNTH_CANDIDATES, SYNTH_REJECTED

        outcomes: dict[str, QuestionSynthesized] = {}
        for event in watch.events(SYNTH_ACCEPTED) + watch.events(SYNTH_REJECTED):
            outcomes.setdefault(event.seed_id, event)  # type: ignore[attr-defined, arg-type]
        return cls(outcomes, watch.events(SYNTH_CANDIDATES))  # type: ignore[arg-type]


@app.command("run")
@with_cluster
def run(
    out: Annotated[str, typer.Option(help="The accepted questions as a QA file (path or URL).")],
    seed: Annotated[
        Path | None, typer.Option(help='Seed QA pairs: JSON lines {"question", "answer"}.')
    ] = None,
    pages: Annotated[
        int | None, typer.Option(help="Seed from this many pages of the run's world instead.")
    ] = None,
    job: Annotated[str, typer.Option(help="The job's name; the same name resumes it.")] = "synth",
    replicas: Annotated[int, typer.Option(help="Synthesis processors to start.")] = 1,
    writer: Annotated[
        str, typer.Option(help="The writer: 'world' or an OpenAI-compatible base URL.")
    ] = "world",
    writer_model: Annotated[str, typer.Option(help="The writer endpoint's model.")] = "",
    checker: Annotated[
        str, typer.Option(help="The checker: 'world' or an OpenAI-compatible base URL.")
    ] = "world",
    checker_model: Annotated[str, typer.Option(help="The checker endpoint's model.")] = "",
    max_edits: Annotated[int, typer.Option(help="FUZZ/INJECT turns per seed at most.")] = 6,
    no_tool_attempts: Annotated[
        int, typer.Option(help="Answers without tools in the difficulty check (k).")
    ] = 4,
    role_latency: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Seconds each role call waits first: a model's latency laid on the world "
            "roles (benchmarks of replicas).",
        ),
    ] = 0.0,
    figures: Annotated[
        Path | None,
        typer.Option(help="Directory for the statistics PNG.", show_default="<run dir>/synth"),
    ] = None,
    external: Annotated[
        bool,
        typer.Option(help="Use the run's synthesis processors and tool workers (synth.replicas)."),
    ] = False,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 3600.0,
    config_file: RunFile = None,
    *,
    cluster: ClusterOptions,
) -> None:
    """Synthesize harder questions from seeds and write the accepted ones to --out.

    Seeds come from --seed FILE or from --pages N of the run's world. The job starts
    --replicas synthesis processors and a tool worker of its own (unless --external), waits
    for every seed's outcome (accepted or rejected, with reasons), and prints the statistics.
    """
    from asearcher.cli.run.config import load_run_config, paths
    from asearcher.cli.run.prepare import world_and_index
    from asearcher.streams.cluster.settings import state_dir

    if (seed is None) == (pages is None):
        raise CliError("give exactly one of --seed FILE and --pages N")
    if replicas < 1 and not external:
        raise CliError(f"--replicas must be at least 1, got {replicas}")
    with as_cli_error(ValueError):
        run_config = load_run_config(config_file)
        job = run_config.name if external else job  # the run's processors take its own job
        config = _processor_config(
            run_config,
            job,
            writer,
            writer_model,
            checker,
            checker_model,
            max_edits,
            no_tool_attempts,
            role_latency,
        )
    where = paths(run_config, state_dir(cluster.home))
    files, _ = world_and_index(where.world_dir, run_config.data, dense=run_config.data.dense)
    with as_cli_error(ValueError, OSError):
        seeds = (
            seeds_from_file(seed, job)
            if seed
            else seeds_from_pages(files["corpus"], pages or 0, job)
        )
    connection = cluster.connect(check_local=True)
    watch = _play(
        connection, cluster, run_config, where, config, seeds, replicas, external, timeout
    )
    outcomes = [watch.outcomes[s.seed_id] for s in seeds]
    _write_accepted(out, [o for o in outcomes if o.accepted])
    _report(outcomes, watch.candidates, figures or where.run_dir / "synth" / job)


@app.command("process")
@with_cluster
def process(
    config_file: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Synthesis processor config (TOML or JSON)."),
    ] = None,
    instance: Instance = None,
    *,
    cluster: ClusterOptions,
) -> None:
    """Run a synthesis processor until Ctrl-C/SIGTERM: it synthesizes each seed of its job on
    synth.requests once, and sends its candidates and its outcome in one transaction with the
    seed's offset. Run more copies (each its own --instance) to add throughput."""
    from asearcher.producers.synthesis.processor import SynthProcessor, SynthProcessorConfig
    from asearcher.streams.service.config_file import load_config

    with as_cli_error(ValueError):
        config = load_config(SynthProcessorConfig, "synthesis processor config", config_file,
                             instance=instance)  # fmt: skip
    with service_command("synthesis processor", cluster) as command:
        processor = command.start(lambda settings, codec: SynthProcessor(settings, codec, config))
        console.print(f"synthesis processor {config.app_id} (job {config.job or 'any'}, "
                      f"instance {config.instance or 'none'})")  # fmt: skip
        synthesized = processor.run()
    console.print(f"synthesized {synthesized} seed(s)")


def _processor_config(
    run_config,
    job: str,
    writer: str,
    writer_model: str,
    checker: str,
    checker_model: str,
    max_edits: int,
    attempts: int,
    latency_s: float,
) -> SynthProcessorConfig:
    from asearcher.consumers.scoring.chat_endpoint import ChatEndpointConfig
    from asearcher.producers.synthesis.agent import SynthConfig
    from asearcher.producers.synthesis.processor import SynthProcessorConfig, SynthRole

    def role(value: str, model: str) -> SynthRole:
        if value == "world":
            return SynthRole(latency_s=latency_s)
        if not model:
            raise ValueError(f"an endpoint role ({value}) needs its model: --writer-model or "
                             "--checker-model")  # fmt: skip
        endpoint = ChatEndpointConfig(base_url=value, model=model)
        return SynthRole(kind="endpoint", endpoint=endpoint, latency_s=latency_s)

    return SynthProcessorConfig(
        app_id=f"asearcher-synth-{job}",
        job=job,
        tool_pool=run_config.name,
        world_seed=run_config.data.world_seed,
        world_entities=run_config.data.world_entities,
        writer=role(writer, writer_model),
        checker=role(checker, checker_model),
        synthesis=SynthConfig(
            max_edits=max_edits, min_edits=min(1, max_edits), no_tool_attempts=attempts
        ),
    )


def _play(
    connection, options: ClusterOptions, run_config, where: Paths,
    config: SynthProcessorConfig, seeds: list[SynthesisRequested], replicas: int,
    external: bool, timeout: float,
) -> JobWatch:  # fmt: skip
    """Start the job's services, send the seeds not done yet, follow until every seed has its
    outcome."""
    from contextlib import ExitStack

    from asearcher.streams.io.producer import EventProducer
    from asearcher.streams.io.watch import TopicWatch
    from asearcher.streams.wire.topics import (
        SYNTH_ACCEPTED,
        SYNTH_CANDIDATES,
        SYNTH_REJECTED,
        SYNTH_REQUESTS,
    )

    ids = {s.seed_id for s in seeds}

    def outcome(event) -> bool:
        return isinstance(event, QuestionSynthesized) and event.seed_id in ids

    def candidate(event) -> bool:
        return isinstance(event, SynthesisCandidate) and event.seed_id in ids

    picks = {SYNTH_ACCEPTED: outcome, SYNTH_REJECTED: outcome, SYNTH_CANDIDATES: candidate}
    settings = connection.settings
    with ExitStack() as stack:
        producer = stack.enter_context(EventProducer(settings, connection.codec))
        watch = stack.enter_context(TopicWatch(settings, connection.codec, picks, "beginning"))
        watch.caught_up(60)  # what earlier runs of the job finished
        done = JobWatch.of(watch).outcomes
        waiting = [s for s in seeds if s.seed_id not in done]
        console.print(f"synthesis job {config.job}: {len(seeds)} seeds, "
                      f"{len(seeds) - len(waiting)} done already; writer {config.writer.kind}, "
                      f"checker {config.checker.kind}")  # fmt: skip
        if waiting and not external:
            _skip_other_jobs(settings, config.app_id)
            children = _start_services(
                stack, options, run_config, where, config, replicas, connection
            )
            # Seeds sent while processors still join would be moved between them mid-seed.
            _wait_for_processors(settings, config.app_id, children, timeout)
        for request in waiting:
            producer.send(SYNTH_REQUESTS, request)
        producer.flush()
        _wait(watch, len(seeds), timeout)
    return JobWatch.of(watch)


def _skip_other_jobs(settings, group_id: str) -> None:
    """The job's processors start after the seeds already on synth.requests: other jobs' (each
    would be read and passed over, a transaction apiece) and this job's from an earlier try,
    whose seeds without an outcome are sent again."""
    from asearcher.streams.cluster.admin import skip_backlog
    from asearcher.streams.wire.topics import SYNTH_REQUESTS

    skipped = skip_backlog(settings, group_id, SYNTH_REQUESTS)
    if skipped:
        console.print(f"{group_id}: starting after the {skipped:,} seeds already on "
                      f"{SYNTH_REQUESTS}")  # fmt: skip


def _start_services(
    stack,
    cluster: ClusterOptions,
    run_config,
    where: Paths,
    config: SynthProcessorConfig,
    replicas: int,
    connection,
) -> JobChildren:
    """A tool worker in this process and `replicas` synthesis processors for this job."""
    from asearcher.cli.run.config import groups, resolve
    from asearcher.cli.run.service_kinds import serve_command
    from asearcher.consumers.tools.tool_thread import ToolWorkerThread
    from asearcher.streams.service.children import JobChildren

    tools = resolve(run_config, where).tools
    results = (where.run_dir / "tool-results").as_uri()
    stack.enter_context(
        ToolWorkerThread(
            connection.settings,
            connection.codec,
            tools,
            results,
            f"{groups(run_config.name)['tools']}-synth",
        )
    )
    file = where.run_dir / "config" / f"{config.app_id}.json"
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(msgspec.json.encode(config))
    children = stack.enter_context(JobChildren(where.run_dir / "logs"))
    for replica in range(replicas):
        command = serve_command("synth", "-c", str(file), "--instance", str(replica),
                                *cluster.args())  # fmt: skip
        log = children.start(f"{config.app_id}-{replica}", command)
    console.print(f"started {replicas} synthesis processor(s); logs: {log.parent}/"
                  f"{config.app_id}-*.log")  # fmt: skip
    return children


def _wait_for_processors(settings, group_id: str, children: JobChildren, timeout: float) -> None:
    from asearcher.streams.cluster.admin import stable_members

    replicas, deadline = len(children.children), time.monotonic() + timeout
    with console.status(f"waiting for {replicas} synthesis processor(s) to join {group_id}"):
        while (joined := stable_members(settings, group_id)) < replicas:
            if exited := children.exited():
                name, status = next(iter(exited.items()))
                raise CliError(
                    f"synthesis processor {name} exited with status {status} before joining; "
                    f"see {children.log_dir}/{name}.log"
                )
            if time.monotonic() > deadline:
                raise CliError(
                    f"timed out: {joined} of {replicas} synthesis processors joined {group_id}; "
                    "see their logs under the run's logs/"
                )
            time.sleep(0.5)


def _wait(watch: TopicWatch, total: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with LoggedProgress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("seeds", total=total)
        while True:
            seen = JobWatch.of(watch)
            done, candidates = len(seen.outcomes), len(seen.candidates)
            accepted = sum(o.accepted for o in seen.outcomes.values())
            progress.update(
                task,
                completed=done,
                description=f"seeds ({accepted} accepted, {candidates} candidates)",
            )
            if done >= total:
                return
            if time.monotonic() > deadline:
                raise CliError(
                    f"timed out: {done} of {total} seeds have an outcome ({candidates} "
                    "candidates seen); are the synthesis processors and the tool "
                    "workers running? (their logs are under the run's logs/)"
                )
            time.sleep(0.5)


def accepted_record(outcome: QuestionSynthesized) -> dict[str, object]:
    """A QA-file line for an accepted question: what the feeder reads (id, question, answers),
    the world question's fields (hops, supporting_urls, split: the scripted expert can play it)
    and its synthesis history."""
    return {
        "id": outcome.seed_id,
        "question": outcome.question,
        "answers": [outcome.answer],
        "hops": len(outcome.supporting_urls),
        "supporting_urls": outcome.supporting_urls,
        "split": "train",
        "seed_question": outcome.seed_question,
        "facts": [msgspec.to_builtins(f) for f in outcome.facts],
        "edits": [msgspec.to_builtins(e) for e in outcome.edits],
        "verdicts": [msgspec.to_builtins(v) for v in outcome.verdicts],
    }


def _write_accepted(out: str, accepted: list[QuestionSynthesized]) -> None:
    import fsspec

    encoder = msgspec.json.Encoder()
    with as_cli_error(OSError, os_error=f"cannot write {out}"), fsspec.open(out, "wb") as file:
        file.write(encoder.encode_lines([accepted_record(o) for o in accepted]))
    console.print(f"{len(accepted)} accepted questions written to {out}")


def _report(
    outcomes: list[QuestionSynthesized], candidates: list[SynthesisCandidate], figures: Path
) -> None:
    from asearcher.cli.jobs.synth_plot import plot_stats
    from asearcher.consumers.synthesis.stats import synth_stats

    stats = synth_stats(outcomes, candidates)
    console.print(_stats_table(stats))
    console.print(_gates_table(stats))
    if stats.role_failures:
        failures = ", ".join(f"{k} {v}" for k, v in stats.role_failures.items())
        console.print(f"role calls that failed (malformed, refused, errors): {failures}")
    with as_cli_error(OSError, os_error=f"cannot write the figure into {figures}"):
        figures.mkdir(parents=True, exist_ok=True)
        console.print(f"statistics figure: {plot_stats(stats, figures / 'synthesis.png')}")


def _stats_table(stats: SynthStats) -> Table:
    table = Table(
        title=f"{stats.accepted} of {stats.seeds} seeds accepted "
        f"({100 * stats.acceptance:.0f}%): questions by count"
    )
    for column in ("count", "injections", "fuzzes", "supporting facts"):
        table.add_column(column, justify="right")
    values = sorted({*stats.injections, *stats.fuzzes, *stats.facts})
    for value in values:
        table.add_row(
            str(value),
            *(str(h.get(value, 0)) for h in (stats.injections, stats.fuzzes, stats.facts)),
        )
    return table


def _gates_table(stats: SynthStats) -> Table:
    table = Table(title="gates over edited candidates; no-tool accuracy by edits")
    for column in ("gate", "checked", "passed", "rate"):
        table.add_column(column, justify="right")
    for gate in stats.gates:
        table.add_row(gate.gate, str(gate.checked), str(gate.passed), f"{100 * gate.rate:.0f}%")
    for edits, (count, accuracy) in stats.no_tool_accuracy.items():
        table.add_row(f"no-tool, {edits} edits", str(count), "", f"{100 * accuracy:.0f}% right")
    return table
