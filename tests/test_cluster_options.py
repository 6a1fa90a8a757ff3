"""The shared cluster options: declared once (`with_cluster`), reaching each command whole."""

from __future__ import annotations

import re
from pathlib import Path

import typer
from typer.testing import CliRunner

from asearcher.cli.wiring import ClusterOptions, with_cluster
from asearcher.streams.cluster.settings import ENV_BOOTSTRAP, ENV_CLAIMS_URL, ENV_HOME

CLI = Path(__file__).resolve().parents[1] / "cli"
# stream up/status/audit take the cluster but no claims store option of their own.
DECLARING_THEIR_OWN = {"options.py", "wiring.py", "stream.py"}


def test_a_command_gets_the_options_given_as_one_value_and_keeps_its_own() -> None:
    seen: list[tuple[int, ClusterOptions]] = []
    app = typer.Typer()

    @app.command()
    @with_cluster
    def probe(count: int = 1, *, cluster: ClusterOptions) -> None:
        seen.append((count, cluster))

    args = ["--count", "3", "-b", "h:1", "-X", "a=b", "-X", "c=d", "--home", "/tmp/h",
            "--claims-url", "s3://c"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert seen == [(3, ClusterOptions("h:1", ["a=b", "c=d"], "/tmp/h", "s3://c"))]
    unset = dict.fromkeys((ENV_BOOTSTRAP, ENV_CLAIMS_URL, ENV_HOME))  # None: not in the env
    assert CliRunner().invoke(app, [], env=unset).exit_code == 0
    assert seen[-1] == (1, ClusterOptions(None, None, None, None))


def test_no_command_module_declares_the_cluster_options_itself() -> None:
    declaring = [
        path.name
        for path in CLI.rglob("*.py")
        if path.name not in DECLARING_THEIR_OWN
        and re.search(r"^\s+claims_url: ClaimsUrl", path.read_text(), re.MULTILINE)
    ]
    assert declaring == []


def test_a_flag_overriding_a_config_field_shows_the_field_s_own_description() -> None:
    from asearcher.cli.app import app
    from asearcher.consumers.tools.toolbox import ToolConfig
    from asearcher.producers.rollout.service import RolloutConfig
    from asearcher.streams.service.config_file import field_description

    for command, flag_help in (
        (["rollout", "serve"], field_description(RolloutConfig, "concurrency")),
        (["tools", "serve"], field_description(ToolConfig, "max_concurrency")),
    ):
        result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "300"})
        assert result.exit_code == 0
        assert flag_help[1:] in result.output  # its first letter capitalised


def test_a_config_field_without_a_description_is_refused_by_name() -> None:
    import msgspec
    import pytest

    from asearcher.streams.service.config_file import field_description

    class Bare(msgspec.Struct):
        size: int = 1

    with pytest.raises(ValueError, match="Bare.size has no description"):
        field_description(Bare, "size")
