"""The agent's action vocabulary: the tags the model writes and the text that comes back to it.

The model thinks inside `<think> </think>`, then writes one of `<search>query</search>`,
`<access>url</access>` or `<answer>text</answer>`; tool output comes back inside
`<information> </information>`. This module only names these tags, so that both the rollout side
(parsing, stop strings, tokenizer specials) and the reward side (format check) share one
vocabulary without the reward importing the rollout code.
"""

from __future__ import annotations

from typing import Literal

ActionKind = Literal["search", "access", "answer"]
ACTION_TAGS: tuple[ActionKind, ...] = ("search", "access", "answer")
THINK_TAG = "think"
INFORMATION_TAG = "information"


def open_tag(name: str) -> str:
    """`<name>`."""
    return f"<{name}>"


def close_tag(name: str) -> str:
    """`</name>`."""
    return f"</{name}>"


ACTION_OPEN_TAGS: tuple[str, ...] = tuple(open_tag(tag) for tag in ACTION_TAGS)
# Generation stops at these, so an action call ends with at most one complete action.
ACTION_CLOSE_TAGS: tuple[str, ...] = tuple(close_tag(tag) for tag in ACTION_TAGS)
THINK_CLOSE = close_tag(THINK_TAG)
# Role words a call must not write: the model would be playing the next speaker of the prompt.
# Case-sensitive and only these two, as in ASearcher ("User" is not checked there).
ROLE_WORDS: tuple[str, ...] = ("Assistant", "assistant")
