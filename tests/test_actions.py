"""Parsing one call: its first complete action is taken, anything else is a slip, not an error."""

from __future__ import annotations

import pytest

from asearcher.producers.agents.actions import STOP_STRINGS, THINK_STOP, Action, parse_call


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Look.</think>\n<search> founder of Avalon </search>",
         Action("search", "founder of Avalon")),
        ("\n<access>https://synthpedia.local/wiki/X</access>",
         Action("access", "https://synthpedia.local/wiki/X")),
        ("So the answer is <answer>Rubim</answer>", Action("answer", "Rubim")),
        ("<answer>two\nlines</answer>", Action("answer", "two\nlines")),
        ("<answer>   </answer>", Action("answer", "")),
    ],
)  # fmt: skip
def test_a_well_formed_call_yields_its_action(text: str, expected: Action) -> None:
    parsed = parse_call(text)
    assert parsed.error is None and parsed.action == expected


@pytest.mark.parametrize(
    ("text", "action", "error"),
    [
        ("I think it is Rubim.", None, "no action"),
        ("<search>a</search><answer>b</answer>", Action("search", "a"), "2 actions in one call"),
        ("<answer>b</answer><search>a</search>", Action("answer", "b"), "2 actions in one call"),
        ("<search>unfinished", None, "unbalanced action tags"),
        ("<answer>x</search>", None, "unbalanced action tags"),
        ("<answer>a</answer></answer>", Action("answer", "a"), "unbalanced action tags"),
    ],
)
def test_a_slip_is_reported_and_the_first_complete_action_still_taken(
    text: str, action: Action | None, error: str
) -> None:
    parsed = parse_call(text)
    assert parsed.action == action and error in parsed.error


def test_a_think_call_needs_no_action_but_one_written_there_counts() -> None:
    assert parse_call("The page mentions Rubim.\n</think>", expect_action=False).error is None
    assert parse_call("hmm", expect_action=True).error.startswith("no action")
    inside = parse_call("I will <search>Rubim</search> next</think>", expect_action=False)
    assert inside.action == Action("search", "Rubim") and inside.error is None


def test_actions_map_to_the_two_tools_and_calls_stop_at_closing_tags() -> None:
    assert Action("search", "q").tool_call() == ("search", {"query": "q"})
    assert Action("access", "u").tool_call() == ("browse", {"url": "u"})
    assert Action("answer", "a").tool_call() is None
    assert STOP_STRINGS == ("</search>", "</access>", "</answer>")
    assert THINK_STOP == ("</think>",)
