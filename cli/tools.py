"""`asearcher index|tools|world|search|browse`: the agent's tools and their knowledge base."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from asearcher.cli.errors import CliError
from asearcher.cli.options import Instance, overriding
from asearcher.cli.wiring import ClusterOptions, as_cli_error, service_command, with_cluster
from asearcher.consumers.tools.toolbox import ToolConfig

console = Console()
index_app = typer.Typer(help="Build the local knowledge base the search tool uses.")
tools_app = typer.Typer(help="Run tool workers: search and browse calls from Kafka.")
world_app = typer.Typer(help="A synthetic multi-hop world: a fictional encyclopedia and its QA.")

ConfigFile = Annotated[
    Path | None, typer.Option("--config", "-c", help="Tool config (TOML), see docs/tools.md.")
]
IndexDir = Annotated[
    Path | None, typer.Option("--index", help="A built index (overrides the config's index_dir).")
]


@index_app.command("build")
def index_build(
    corpus: Annotated[Path, typer.Option(help="JSONL corpus of {url, title, contents}.")],
    out: Annotated[Path, typer.Option(help="Directory to write the index into.")],
    dense: Annotated[bool, typer.Option(help="Also build the dense (embedding) index.")] = True,
) -> None:
    """Index CORPUS with BM25 and dense retrieval; re-running resumes an interrupted build."""
    from asearcher.cli.jobs.indexing import build_index_with_progress

    if not corpus.is_file():
        raise CliError(f"--corpus {corpus} is not a file")
    build_index_with_progress(corpus, out, dense)


def _toolbox(config_file: Path | None, index: Path | None, **overrides):
    from asearcher.consumers.tools.toolbox import Toolbox, build_backends, load_tool_config

    with as_cli_error(ValueError):
        config = load_tool_config(config_file, index_dir=str(index) if index else None, **overrides)
        return Toolbox(*build_backends(config), config)


@tools_app.command("serve")
@with_cluster
def tools_serve(
    config_file: ConfigFile = None,
    index: IndexDir = None,
    concurrency: Annotated[
        int | None, typer.Option(help=overriding(ToolConfig, "max_concurrency"))
    ] = None,
    group: Annotated[
        str, typer.Option(help="Consumer group of the tool workers.")
    ] = "asearcher-tool-workers",
    pool: Annotated[
        str | None,
        typer.Option(help=overriding(ToolConfig, "pool")),
    ] = None,
    results_url: Annotated[
        str | None,
        typer.Option(help="fsspec URL of the result store shared by workers (idempotence)."),
    ] = None,
    instance: Instance = None,
    *,
    cluster: ClusterOptions,
) -> None:
    """Answer search and browse calls from tool.calls on tool.results until Ctrl-C/SIGTERM.

    Run more copies to add throughput: they share the calls through one consumer group.
    """
    from asearcher.consumers.tools.result_store import ResultStore
    from asearcher.consumers.tools.tool_worker import ToolWorker
    from asearcher.streams.cluster.settings import state_dir
    from asearcher.streams.io.intake import static_member

    with service_command("tool worker", cluster) as command:
        toolbox = _toolbox(config_file, index, max_concurrency=concurrency, pool=pool)
        store = ResultStore(results_url or (state_dir(cluster.home) / "tool-results").as_uri())
        worker = command.start(
            lambda settings, codec: ToolWorker(
                settings, codec, toolbox, store, group_id=group, name=instance,
                **static_member("tools", instance),
            )
        )  # fmt: skip
        config = toolbox.config
        console.print(
            f"tool worker in group {group}, pool {config.pool or '(none)'}: "
            f"search={config.search}, reader={config.reader}"
        )
        stats = worker.run()
    console.print(f"answered {stats.handled - worker.foreign_calls:,} calls "
                  f"({stats.dead_lettered} dead-lettered, {worker.foreign_calls:,} of other "
                  "pools passed over)")  # fmt: skip


def _run_tool(tool: str, arguments: dict[str, str], config_file, index, **overrides) -> None:
    toolbox = _toolbox(config_file, index, **overrides)
    text, error = asyncio.run(toolbox.call(tool, arguments))
    if error:
        raise CliError(error)
    console.print(text, markup=False, highlight=False)


def search(
    query: Annotated[str, typer.Argument(help="What to search for.")],
    k: Annotated[int | None, typer.Option("-k", help=overriding(ToolConfig, "top_k"))] = None,
    mode: Annotated[str | None, typer.Option(help="bm25, dense or hybrid (local backend).")] = None,
    config_file: ConfigFile = None,
    index: IndexDir = None,
) -> None:
    """Search with the same backend the agent uses and print what the agent would see."""
    _run_tool("search", {"query": query}, config_file, index, top_k=k, search_mode=mode)


def browse(
    url: Annotated[str, typer.Argument(help="The page to read.")],
    chunk: Annotated[int, typer.Option(help="Which part of a long page (1-based).")] = 1,
    config_file: ConfigFile = None,
    index: IndexDir = None,
) -> None:
    """Read a page with the same reader the agent uses (Markdown, in chunks)."""
    _run_tool("browse", {"url": url, "chunk": str(chunk)}, config_file, index)


@world_app.command("generate")
def world_generate(
    out: Annotated[Path, typer.Option(help="Directory for corpus.jsonl and qa_*.jsonl.")],
    seed: Annotated[int, typer.Option(help="Seed: the same seed gives the same world.")] = 0,
    entities: Annotated[int, typer.Option(help="How many entities (pages).")] = 300,
    questions: Annotated[int, typer.Option(help="How many questions.")] = 500,
    max_answer_share: Annotated[
        float | None,
        typer.Option(
            help="Leave out kinds of question whose commonest answer is that of more than this "
            "share of their chains, so that guessing does not pay (e.g. 0.34).",
            show_default="every kind",
        ),
    ] = None,
) -> None:
    """Write a fictional encyclopedia (corpus.jsonl) and multi-hop QA (qa_train/qa_test.jsonl),
    and say what answering its held-out questions without reading would score."""
    from asearcher.consumers.world.guessing import template_guess
    from asearcher.consumers.world.world import generate_world, write_world

    if max_answer_share is not None and not 0.0 < max_answer_share <= 1.0:
        raise CliError(f"--max-answer-share must be within (0, 1], got {max_answer_share}")
    with console.status(f"generating a world of {entities:,} entities"):
        with as_cli_error(ValueError, OSError, os_error=f"cannot write the world into {out}"):
            world = generate_world(seed=seed, entities=entities, questions=questions,
                                   max_answer_share=max_answer_share)  # fmt: skip
            written = write_world(world, out)
    console.print(f"{len(world.pages):,} pages and {len(world.questions):,} questions:")
    for name, path in written.items():
        console.print(f"  {name}: {path}")
    guess = template_guess(world.questions)
    console.print(
        f"answered without reading (each held-out question by its template's commonest train "
        f"answer): F1 {guess.f1:.3f}, EM {guess.em:.3f} on {guess.questions:,} questions"
    )
