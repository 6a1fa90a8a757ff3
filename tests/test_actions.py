"""Parsing the agent's actions: one well-formed action per turn, anything else a format error."""

from __future__ import annotations

import pytest

from asearcher.producers.actions import STOP_STRINGS, Action, information, parse_turn


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Look.<search> founder of Avalon </search>", Action("search", "founder of Avalon")),
        ("<think>hmm</think><access>https://synthpedia.local/wiki/X</access>",
         Action("access", "https://synthpedia.local/wiki/X")),
        ("So the answer is <answer>Rubim</answer>", Action("answer", "Rubim")),
        ("<answer>two\nlines</answer>", Action("answer", "two\nlines")),
    ],
)  # fmt: skip
def test_a_well_formed_turn_yields_its_action(text: str, expected: Action) -> None:
    parsed = parse_turn(text)
    assert parsed.error is None and parsed.action == expected


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("I think it is Rubim.", "no action"),
        ("<search>a</search><search>b</search>", "2 actions in one turn"),
        ("<search>unfinished", "unbalanced action tags"),
        ("<answer>x</search>", "unbalanced action tags"),
        ("<answer>   </answer>", "empty <answer>"),
        ("<answer>a</answer></answer>", "unbalanced action tags"),
    ],
)
def test_a_malformed_turn_is_a_format_error_not_an_exception(text: str, error: str) -> None:
    parsed = parse_turn(text)
    assert parsed.action is None and error in parsed.error


def test_actions_map_to_the_two_tools_and_generation_stops_at_closing_tags() -> None:
    assert Action("search", "q").tool_call() == ("search", {"query": "q"})
    assert Action("access", "u").tool_call() == ("browse", {"url": "u"})
    assert Action("answer", "a").tool_call() is None
    assert STOP_STRINGS == ("</search>", "</access>", "</answer>")


def test_tool_output_and_errors_come_back_inside_information() -> None:
    assert information("[1] X", None) == "\n\n<information>\n[1] X\n</information>\n\n"
    assert "<information>\nError: search timed out after 60s\n</information>" in information(
        "", "search timed out after 60s"
    )
