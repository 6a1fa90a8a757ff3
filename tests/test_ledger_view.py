"""The ledger's row of reasons names each reason's unit: groups for flat and small, trajectories
for stale and duplicate ones."""

import pytest

from asearcher.cli.ledger_view import dropped_reasons

pytestmark = pytest.mark.unit


def test_each_reason_names_its_unit() -> None:
    text = dropped_reasons({"flat_groups": 186, "stale": 3, "duplicates": 1, "small_groups": 2})
    assert text == (
        "1 duplicate trajectories, 186 flat groups, 2 small groups, 3 stale trajectories"
    )


def test_an_unknown_reason_keeps_its_name() -> None:
    assert dropped_reasons({"too_long": 1_200}) == "1,200 too long"
