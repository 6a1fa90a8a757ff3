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


def test_the_resources_table_shows_each_floor_trend_or_a_dash_where_none_is_known() -> None:
    from rich.console import Console

    from asearcher.cli.jobs.resource_samples import ResourceReport, Trend
    from asearcher.cli.ledger_view import resources_view

    trends = [
        Trend(series="memory trainer", samples=120, first_mb=2346.7, last_mb=2213.5,
              peak_mb=2465.9, slope_mb_per_h=673.0, processes=1, within_process_mb_per_h=673.0,
              floor_mb_per_h=64.2),
        Trend(series="memory rollout-0", samples=120, first_mb=860.0, last_mb=861.0,
              peak_mb=870.0, slope_mb_per_h=3.0, processes=22, within_process_mb_per_h=9.0),
    ]  # fmt: skip
    console = Console(width=220, record=True)
    console.print(resources_view(ResourceReport(every_s=15, warmup_s=300, trends=trends)))
    rows = {line.split("│")[1].strip(): line for line in console.export_text().splitlines()
            if line.startswith("│ memory")}  # fmt: skip
    assert rows["memory trainer"].rstrip(" │").endswith("+64.2")
    assert rows["memory rollout-0"].rstrip(" │").endswith("-")
