"""The test tiers and the xdist groups that tests/conftest.py gives each collected test."""

import pytest


def group_of(item: pytest.Item) -> str:
    [marker] = [m for m in item.iter_markers("xdist_group")]
    return marker.args[0]


def test_a_test_without_broker_or_subprocess_is_unit_and_runs_with_its_module(
    request: pytest.FixtureRequest,
) -> None:
    item = request.node
    assert item.get_closest_marker("unit") is not None
    assert item.get_closest_marker("kafka") is None
    assert group_of(item) == __name__
    if getattr(request.config.option, "loadgroup", False):  # an xdist worker under loadgroup
        # xdist schedules by the group it appended to the id: there only if marked in time.
        assert item.nodeid.endswith(f"@{__name__}"), item.nodeid


def test_whole_runs_share_one_group_and_nothing_else_joins_it(
    request: pytest.FixtureRequest,
) -> None:
    items = request.session.items
    for item in items:
        whole_run = item.get_closest_marker("whole_run") is not None
        assert (group_of(item) == "whole-runs") == whole_run, item.nodeid
