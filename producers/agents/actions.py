"""Reading the action out of one LLM call.

The model writes one of `<search>query</search>`, `<access>url</access>` or
`<answer>text</answer>`. As in ASearcher's action calls, generation stops at the first closing
action tag, so the action of a call is its first complete one; whatever else the call holds is
a formatting slip, reported but never an exception. Think calls (stopped at `</think>`) are
parsed the same way: an action written there is taken too. Whether a slip ends the trajectory
is the agent's decision; the per-call format check that zeroes the reward is the reward's.
"""

from __future__ import annotations

import re

import msgspec

from asearcher.consumers.formats.action_format import (
    ACTION_CLOSE_TAGS,
    ACTION_TAGS,
    THINK_CLOSE,
    ActionKind,
)

# Stop strings of an action call, and of a think call.
STOP_STRINGS: tuple[str, ...] = ACTION_CLOSE_TAGS
THINK_STOP: tuple[str, ...] = (THINK_CLOSE,)
TOOL_OF_ACTION = {"search": ("search", "query"), "access": ("browse", "url")}
_TAGS = "|".join(ACTION_TAGS)
_ACTION = re.compile(rf"<({_TAGS})>(.*?)</\1>", re.DOTALL)
_OPEN_OR_CLOSE = re.compile(rf"</?({_TAGS})>")


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


class ParsedCall(msgspec.Struct, frozen=True):
    """The action of a call (if any), and the formatting slip of the call (if any)."""

    action: Action | None
    error: str | None = None


def parse_call(text: str, *, expect_action: bool = True) -> ParsedCall:
    """The first complete action in the output of one call, and what is wrong with the call.

    A call without an action is a slip only when an action was expected (an action call);
    stray or unbalanced action tags and extra actions are slips either way.
    """
    found = _ACTION.search(text)
    action = None if found is None else Action(found.group(1), found.group(2).strip())  # type: ignore[arg-type]
    complete = len(_ACTION.findall(text))
    tags = len(_OPEN_OR_CLOSE.findall(text))
    if tags != 2 * complete:
        return ParsedCall(action, "unbalanced action tags")
    if complete > 1:
        return ParsedCall(action, f"{complete} actions in one call; the first was taken")
    if action is None and expect_action:
        return ParsedCall(None, "no action: write <search>, <access> or <answer>")
    return ParsedCall(action)
