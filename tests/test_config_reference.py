"""The configuration reference is generated from the config structs and kept current."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from asearcher.cli.app import app
from asearcher.cli.jobs.config_reference import reference_markdown

REFERENCE = Path(__file__).parents[1] / "docs" / "configuration-reference.md"


def test_the_committed_reference_is_what_the_structs_generate() -> None:
    assert REFERENCE.read_text() == reference_markdown(), (
        "docs/configuration-reference.md is stale: run "
        "`asearcher schema config-reference --out docs/configuration-reference.md`"
    )


def test_every_field_of_every_section_has_a_description() -> None:
    undocumented, section = [], ""
    for line in reference_markdown().splitlines():
        if line.startswith("## "):
            section = line[3:]
        elif line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip("|").split(" | ")]
            if not cells[-1]:
                undocumented.append(f"{section} {cells[0]}")
    assert not undocumented, undocumented


def test_sections_show_the_embedded_runs_own_defaults() -> None:
    text = reference_markdown()
    feeder = text.split("## `[feeder.config.sampling]`")[1].split("## ")[0]
    evaluation = text.split("## `[eval.config.sampling]`")[1].split("## ")[0]
    # The struct's default is 1024 tokens a turn; the run's feeder and evaluation use 128.
    assert "| `max_new_tokens_per_turn` | `int` | `128` |" in feeder
    assert "| `temperature` | `float` | `0.6` |" in evaluation


def test_the_command_writes_the_reference(tmp_path: Path) -> None:
    out = tmp_path / "reference.md"
    result = CliRunner().invoke(app, ["schema", "config-reference", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text() == reference_markdown()


def test_tables_named_by_the_user_are_documented_once_with_their_fields() -> None:
    from asearcher.cli.run.hosts import HostSection

    text = reference_markdown()
    assert text.count("## `[hosts.NAME]`") == 1
    section = text.split("## `[hosts.NAME]`", 1)[1].split("\n## ", 1)[0]
    for field in HostSection.__struct_fields__:
        assert f"| `{field}` |" in section, field
