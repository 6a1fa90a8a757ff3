"""`asearcher ask`: play one question with a chosen weight version and watch the agent work.

The agent runs here, with the run's tools in this process (its knowledge base, or the web
backends its config names) and the policy loaded from the run's weight store: no broker is
needed. Every LLM call is printed as it ends (its thinking and its action), every tool result
as it comes back, then the answer and its scores.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.panel import Panel

from asearcher.cli.errors import CliError
from asearcher.cli.options import Home, RunFile, SavedRun
from asearcher.cli.wiring import as_cli_error, chosen_run_config, state_home, weights_version

if TYPE_CHECKING:
    from asearcher.streams.wire.events import GenerationStep, ToolCallRequested, ToolResultReady

console = Console()
SHOWN_CHARS = 600  # of each tool result: enough to see what the agent read


class LiveSteps:
    """Prints each LLM call of the trajectory as the agent emits it."""

    def emit(self, event: GenerationStep) -> None:
        title = f"turn {event.turn + 1} · v{event.policy_version} · {len(event.token_ids)} tokens"
        console.print(Panel(event.text.strip() or "(nothing)", title=title, title_align="left"))


class LiveTools:
    """The run's tools, printing what each call returned."""

    def __init__(self, inner) -> None:
        self.inner = inner

    async def call(self, request: ToolCallRequested) -> ToolResultReady:
        result = await self.inner.call(request)
        shown = result.error or result.text or "(empty)"
        if len(shown) > SHOWN_CHARS:
            shown = f"{shown[:SHOWN_CHARS]} … ({len(shown):,} characters)"
        arguments = ", ".join(str(v) for v in request.arguments.values())
        style = "red" if result.error else "cyan"
        console.print(
            Panel(shown, title=f"{request.tool}({arguments})", title_align="left", style=style)
        )
        return result


def ask(
    question: Annotated[str, typer.Argument(help="The question to answer.")],
    answer: Annotated[
        list[str] | None, typer.Option("--answer", help="A gold answer, to score the reply.")
    ] = None,
    weights: Annotated[str, typer.Option(help="The weight version: vN, N or latest.")] = "latest",
    engine: Annotated[
        str, typer.Option(help="transformers, vllm, expert or endpoint.")
    ] = "transformers",
    model: Annotated[
        Path | None, typer.Option(help="The initial policy (default: the run's).")
    ] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (0: greedy).")] = 0.0,
    max_turns: Annotated[int, typer.Option(help="LLM calls at most.")] = 16,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per call at most.")] = 128,
    config_file: RunFile = None,
    run: SavedRun = None,
    home: Home = None,
) -> None:
    """Play one question with a weight version of the run and show every turn as it happens:
    the thinking, each search and page read, and the answer (scored when --answer is given).

    After `asearcher learn`, `asearcher ask --run learn "QUESTION"` plays the trained agent."""
    from asearcher.cli.run.config import paths, resolve

    where_home = Path(home) if home else state_home()
    run_config = chosen_run_config(config_file, run, where_home)
    with as_cli_error(ValueError):
        where = paths(run_config, where_home)
        resolved = resolve(run_config, where)
    request = _request(question, answer or [], temperature, max_turns, max_new_tokens)
    version = weights_version(weights, where.store)
    model_dir = model or where.model_dir
    with as_cli_error(ValueError):
        policy = _engine(engine, model_dir, where.qa, where.store, version)
        tools = _tools(resolved.tools)
    finished = asyncio.run(_play(request, policy, tools, resolved.evaluator.agent))
    from asearcher.consumers.evaluation.eval_scores import SCORE_HEADERS

    parts = finished.reward_parts
    scores = ", ".join(f"{h} {parts[k]:.2f}" for k, h in SCORE_HEADERS.items() if k in parts)
    console.print(
        f"[bold]answer:[/] {finished.answer or '(none)'} · {finished.finish_reason} after "
        f"{finished.num_turns} calls" + (f" · {scores}" if answer else "")
    )


def _engine(kind: str, model_dir: Path, qa: Path, store: str, version: int):
    """The engine `kind` at `version` of the run's store (0: the initial policy)."""
    from asearcher.producers.engines.registry import make_engine
    from asearcher.streams.storage.weight_reader import WeightStoreError, WeightStoreReader

    policy = make_engine(kind, model_dir, qa_file=qa)
    if version and kind != "expert":
        try:
            published = WeightStoreReader(store).get(version)
        except WeightStoreError as exc:
            raise CliError(f"--weights v{version}: {exc}") from exc
        asyncio.run(policy.load_weights(published.uri, version, published.sha256))
    return policy


def _tools(config):
    """The run's tools, running in this process."""
    from asearcher.consumers.tools.toolbox import Toolbox, build_backends
    from asearcher.producers.rollout.tool_router import InProcessToolClient

    if config.search == "local" and not Path(config.index_dir or "").is_dir():
        raise CliError(f"no knowledge base at {config.index_dir}: start the run once")
    search, reader = build_backends(config)
    return LiveTools(InProcessToolClient(Toolbox(search, reader, config)))


def _request(question, answers, temperature, max_turns, max_new_tokens):
    """The request `ask` plays, refused as a producer would refuse it (before any model loads)."""
    from asearcher.producers.agents.agent import BadRequest, check_request
    from asearcher.streams.wire.events import RolloutRequested, SamplingSettings, new_id

    sampling = SamplingSettings(temperature=temperature, max_turns=max_turns,
                                max_new_tokens_per_turn=max_new_tokens)  # fmt: skip
    request = RolloutRequested(
        question_id=new_id(), group_id=new_id(), question=question, gold_answers=answers,
        group_size=1, sampling=sampling, purpose="eval",
    )  # fmt: skip
    try:
        check_request(request)
    except BadRequest as exc:
        raise CliError(str(exc)) from exc
    return request


async def _play(request, policy, tools, agent):
    from asearcher.producers.agents.agent import run_trajectory

    return await run_trajectory(request, 0, policy, tools, LiveSteps(), agent)
