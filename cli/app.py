"""The `asearcher` command. Each sub-command imports its heavy code only when it runs."""

from __future__ import annotations

import sys
from typing import NoReturn

import typer

from asearcher import __version__
from asearcher.cli import ask as ask_cmd
from asearcher.cli import demo as demo_cmd
from asearcher.cli import deploy as deploy_cmd
from asearcher.cli import eval as eval_cmd
from asearcher.cli import feed, model, rollout, schema, stream, tools, train, weights
from asearcher.cli import learn as learn_cmd
from asearcher.cli import metrics as metrics_cmd
from asearcher.cli import plot as plot_cmd
from asearcher.cli import replay as replay_cmd
from asearcher.cli import retrain as retrain_cmd
from asearcher.cli import sft as sft_cmd
from asearcher.cli import synth as synth_cmd
from asearcher.cli.errors import CliError
from asearcher.cli.help_text import reflow_help

app = typer.Typer(
    name="asearcher",
    help="Event-sourced, fully asynchronous RL for LLM search agents, on Apache Kafka.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(stream.app, name="stream")
app.add_typer(schema.app, name="schema")
app.add_typer(tools.index_app, name="index")
app.add_typer(tools.tools_app, name="tools")
app.add_typer(tools.world_app, name="world")
app.add_typer(model.app, name="model")
app.add_typer(rollout.app, name="rollout")
app.add_typer(train.app, name="train")
app.add_typer(feed.app, name="feed")
app.add_typer(weights.app, name="weights")
app.add_typer(eval_cmd.app, name="eval")
app.add_typer(synth_cmd.app, name="synth")
app.add_typer(metrics_cmd.metrics_cli, name="metrics")
app.add_typer(deploy_cmd.app, name="deploy")
app.command(name="plot")(plot_cmd.plot)
app.command(name="search")(tools.search)
app.command(name="browse")(tools.browse)
app.command(name="replay")(replay_cmd.replay)
app.command(name="demo")(demo_cmd.demo)
app.command(name="learn")(learn_cmd.learn)
app.command(name="sft")(sft_cmd.sft)
app.command(name="ask")(ask_cmd.ask)
app.command(name="retrain")(retrain_cmd.retrain_command)
reflow_help(app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"asearcher {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    log_level: str = typer.Option(
        "INFO", "--log-level", envvar="ASEARCHER_LOG_LEVEL", help="DEBUG, INFO, WARNING or ERROR."
    ),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """asearcher: every rollout step, tool call and trajectory is a Kafka event."""
    from asearcher.streams.service.log import configure_logging

    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise CliError(f"--log-level must be DEBUG, INFO, WARNING or ERROR, not {log_level!r}")
    configure_logging(log_level)


def main() -> None:
    """Entry point: run the app, turning expected failures into one-line errors."""
    from confluent_kafka import KafkaException

    from asearcher.streams.cluster.local_broker import BrokerError
    from asearcher.streams.cluster.settings import SettingsError

    try:
        # Outside standalone mode typer hands back the code of a `typer.Exit` instead of exiting.
        code = app(standalone_mode=False)
    except typer.TyperException as exc:  # click's usage errors: no such option, bad value...
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.exit(2)  # the help was printed when the error was made, as click does
        _fail(_usage_line(exc))
    except (CliError, SettingsError, BrokerError, KafkaException, TimeoutError) as exc:
        _fail(str(exc), type(exc).__name__)
    except (KeyboardInterrupt, typer.Abort):
        typer.echo("interrupted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def _usage_line(exc: typer.TyperException) -> str:
    """A usage error as one line: click's message and where the help is (no usage block)."""
    message = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    return f"{message} (see `{ctx.command_path} --help`)" if ctx is not None else message


def _fail(text: str, fallback: str = "error") -> NoReturn:
    message = text.strip().splitlines() or [fallback]
    typer.echo(f"asearcher: error: {message[0]}", err=True)
    for line in message[1:]:
        typer.echo(f"  {line}", err=True)
    sys.exit(2)


if __name__ == "__main__":
    main()
