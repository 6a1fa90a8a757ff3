"""Command help that flows to the terminal's width.

Typer 0.29 keeps the docstring's line breaks in every paragraph after the first, so a
docstring wrapped at 96 columns comes out ragged in an 80-column terminal. The help is
reflowed once, when the app is assembled: each paragraph becomes one line (a list keeps one
line per item) and Rich wraps it to the terminal.
"""

from __future__ import annotations

import inspect
import re

import typer

_LIST_ITEM = re.compile(r"^(\d+\.|[-*])\s")


def reflow(doc: str) -> str:
    """`doc` with the line breaks inside each paragraph and list item removed."""
    return "\n\n".join(_reflow_paragraph(p) for p in inspect.cleandoc(doc).split("\n\n"))


def _reflow_paragraph(paragraph: str) -> str:
    lines: list[str] = []
    for line in paragraph.splitlines():
        if lines and not _LIST_ITEM.match(line):
            lines[-1] += " " + line.strip()
        else:
            lines.append(line.strip())
    return "\n".join(lines)


def reflow_help(app: typer.Typer) -> None:
    """Reflow the help of every command of `app` and of the apps added to it."""
    for command in app.registered_commands:
        doc = command.help or (command.callback.__doc__ if command.callback else None)
        if doc:
            command.help = reflow(doc)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            reflow_help(group.typer_instance)
