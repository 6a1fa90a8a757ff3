"""Command help flows to the terminal's width instead of keeping the docstring's line breaks."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from asearcher.cli.app import app
from asearcher.cli.help_text import reflow


def test_paragraphs_become_one_line_and_list_items_keep_theirs() -> None:
    doc = """Summary line.

    A paragraph wrapped
    over three
    lines.

    1. first item
       continued;
    2. second item.
    - a dash item
    """
    assert reflow(doc).split("\n\n") == [
        "Summary line.",
        "A paragraph wrapped over three lines.",
        "1. first item continued;\n2. second item.\n- a dash item",
    ]


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_learn_help_wraps_to_the_terminal_and_not_to_the_docstring(columns: int) -> None:
    result = CliRunner().invoke(app, ["learn", "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    prose = [line.strip() for line in result.output.splitlines()]
    start = next(i for i, line in enumerate(prose) if line.startswith("Without -c"))
    paragraph = prose[start : prose.index("", start)]
    # Every line but the paragraph's last is filled to the width (Rich breaks at a space).
    assert all(len(line) > columns - 20 for line in paragraph[:-1]), paragraph
    assert " ".join(paragraph).startswith("Without -c it runs the embedded CPU learning run (")
