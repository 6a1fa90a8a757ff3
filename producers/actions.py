"""The agent's action format: what the model writes and what comes back to it.

The model thinks, then writes one of `<search>query</search>`, `<access>url</access>` or
`<answer>text</answer>`; generation stops at the closing tag. Tool output is appended inside
`<information>…</information>`. Anything else is a format failure the reward records, never an
exception.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

ActionKind = Literal["search", "access", "answer"]
ACTION_TAGS: tuple[ActionKind, ...] = ("search", "access", "answer")
# Generation stops at these, so a turn ends with at most one complete action.
STOP_STRINGS: tuple[str, ...] = tuple(f"</{tag}>" for tag in ACTION_TAGS)
TOOL_OF_ACTION = {"search": ("search", "query"), "access": ("browse", "url")}
_ACTION = re.compile(r"<(search|access|answer)>(.*?)</\1>", re.DOTALL)
_OPEN_OR_CLOSE = re.compile(r"</?(search|access|answer)>")


class Action(msgspec.Struct, frozen=True):
    """One action the model took."""

    kind: ActionKind
    content: str

    def tool_call(self) -> tuple[str, dict[str, str]] | None:
        """(tool, arguments) for a tool action; None for an answer."""
        if self.kind == "answer":
            return None
        tool, argument = TOOL_OF_ACTION[self.kind]
        return tool, {argument: self.content}


class ParsedTurn(msgspec.Struct, frozen=True):
    """The action of a turn, or why there is none."""

    action: Action | None
    error: str | None = None


def parse_turn(text: str) -> ParsedTurn:
    """The single action in one generated turn, or a format error saying what is wrong."""
    actions = [Action(m.group(1), m.group(2).strip()) for m in _ACTION.finditer(text)]
    tags = _OPEN_OR_CLOSE.findall(text)
    if len(tags) != 2 * len(actions):
        return ParsedTurn(None, "unbalanced action tags")
    if not actions:
        return ParsedTurn(None, "no action: write <search>, <access> or <answer>")
    if len(actions) > 1:
        return ParsedTurn(None, f"{len(actions)} actions in one turn; write one")
    action = actions[0]
    if not action.content:
        return ParsedTurn(None, f"empty <{action.kind}>")
    return ParsedTurn(action)


def information(text: str, error: str | None) -> str:
    """The tool output block appended to the context after an action."""
    body = f"Error: {error}" if error else text
    return f"\n\n<information>\n{body}\n</information>\n\n"
