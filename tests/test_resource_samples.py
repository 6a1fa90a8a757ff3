"""Memory and disk samples of a run and their trends (no broker needed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from asearcher.cli.jobs.resource_samples import (
    ResourceSample,
    ResourceSampler,
    directory_mb,
    floors,
    pooled_slope,
    slope,
    tree_rss_mb,
    trends,
)


def test_slope_of_a_line_and_of_too_few_points() -> None:
    assert slope([(0, 1.0), (1, 3.0), (2, 5.0)]) == 2.0
    assert slope([(5, 1.0)]) == 0.0 and slope([(5, 1.0), (5, 9.0)]) == 0.0


def test_the_pooled_slope_is_the_growth_within_each_group_whatever_the_jumps_between() -> None:
    # Two lives growing 2 per unit, the second restarting low: the overall slope is near 0.
    lives = [[(0, 10.0), (1, 12.0), (2, 14.0)], [(3, 1.0), (4, 3.0), (5, 5.0)]]
    assert slope([p for life in lives for p in life]) < 0.5
    assert pooled_slope(lives) == 2.0
    assert pooled_slope([[(0, 1.0)], [(7, 9.0)]]) == 0.0  # no life with two samples


def test_a_series_restarted_by_kills_keeps_its_growth_within_each_process() -> None:
    # A trainer killed every 3 minutes that grows 1 MB a minute in each life; the disk has no pid.
    samples = [
        ResourceSample(at_s=60.0 * m, memory_mb={"trainer": 100.0 + m % 3}, disk_mb={"log": 5.0},
                       pids={"trainer": 1000 + m // 3})
        for m in range(9)
    ]  # fmt: skip
    (memory,) = trends("memory", samples, lambda s: s.memory_mb)
    assert memory.processes == 3
    assert memory.within_process_mb_per_h == 60.0
    assert abs(memory.slope_mb_per_h) < 10  # the joined series hides it
    (disk,) = trends("disk", samples, lambda s: s.disk_mb)
    assert disk.processes == 0 and disk.within_process_mb_per_h == 0.0


def test_trends_give_the_slope_per_hour_first_last_and_peak_of_each_series() -> None:
    samples = [
        ResourceSample(at_s=60.0 * m, memory_mb={"trainer": 100 + m, "gone": 7.0} if m < 2
                       else {"trainer": 100 + m}, disk_mb={})
        for m in range(5)
    ]  # fmt: skip
    vanished, growing = trends("memory", samples, lambda s: s.memory_mb)
    assert growing.series == "memory trainer" and growing.samples == 5
    assert (growing.first_mb, growing.last_mb, growing.peak_mb) == (100, 104, 104)
    assert growing.slope_mb_per_h == 60.0  # one MB a minute
    assert vanished.series == "memory gone" and vanished.samples == 2
    assert vanished.slope_mb_per_h == 0.0


def saw(minutes: int, leak_mb_per_min: float = 0.0) -> list[ResourceSample]:
    """A trainer sampled every 15 s that holds 2,400 MB while it steps (20 s of every minute)
    and hands back to 1,000 MB after, plus any leak."""
    return [
        ResourceSample(at_s=15.0 * i, disk_mb={}, pids={"trainer": 7},
                       memory_mb={"trainer": (2400.0 if i % 4 == 1 else 1000.0)
                                  + leak_mb_per_min * i / 4})
        for i in range(4 * minutes)
    ]  # fmt: skip


def test_the_floor_of_a_saw_stays_flat_where_its_slope_reads_growth() -> None:
    # Sampled so that late windows catch more steps than early ones: the slope reads growth.
    samples = saw(30)
    samples = [s for s in samples if s.at_s > 900 or s.memory_mb["trainer"] < 2000]
    (memory,) = trends("memory", samples, lambda s: s.memory_mb)
    assert memory.slope_mb_per_h > 500
    assert memory.floor_mb_per_h == 0.0


def test_the_floor_rises_with_a_leak_under_the_saw() -> None:
    (memory,) = trends("memory", saw(30, leak_mb_per_min=2.0), lambda s: s.memory_mb)
    assert memory.floor_mb_per_h is not None and abs(memory.floor_mb_per_h - 120.0) < 1.0


def test_floors_leave_out_a_window_the_samples_barely_cover() -> None:
    points = [(15.0 * i, 100.0 - i) for i in range(24)]  # 5 min 45 s: one whole window
    assert floors(points) == [(150.0, 81.0)]
    # Lives too short for two windows each (kills every few minutes): no floor trend.
    samples = [
        ResourceSample(at_s=60.0 * m, memory_mb={"trainer": 100.0}, disk_mb={},
                       pids={"trainer": 1000 + m // 3})
        for m in range(9)
    ]  # fmt: skip
    (memory,) = trends("memory", samples, lambda s: s.memory_mb)
    assert memory.floor_mb_per_h is None


def test_a_process_tree_counts_its_children_and_a_dead_pid_is_none(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "x = bytearray(60 * 1024 * 1024); import time; time.sleep(30)"]
    )
    try:
        deadline = time.monotonic() + 20
        while (tree_rss_mb(os.getpid()) or 0) - (own := _own_rss()) < 50:
            assert time.monotonic() < deadline, "the child's memory never showed"
            time.sleep(0.2)
        assert own > 10
    finally:
        child.kill()
        child.wait()
    assert tree_rss_mb(child.pid) is None


def _own_rss() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 1024 / 1024


def test_the_sampler_samples_when_due_and_trends_a_short_run_by_its_second_half(
    tmp_path: Path,
) -> None:
    (tmp_path / "segment").write_bytes(b"x" * 2 * 1024 * 1024)
    assert directory_mb(tmp_path) == 2.0
    sampler = ResourceSampler(lambda: {"me": os.getpid(), "gone": 2**22 + 7},
                              {"data": tmp_path}, every_s=0.2, warmup_s=600)  # fmt: skip
    deadline = time.monotonic() + 1.1
    while time.monotonic() < deadline:
        sampler.maybe_sample()
        time.sleep(0.01)
    report = sampler.finish()
    assert 5 <= len(report.samples) <= 7  # due every 0.2 s, not at every call
    assert all(set(s.memory_mb) == {"me"} for s in report.samples)  # a dead pid is left out
    assert all(s.pids == {"me": os.getpid()} for s in report.samples)
    assert all(s.disk_mb == {"data": 2.0} for s in report.samples)
    # Shorter than the warm-up: the trend is of the second half of the samples.
    memory = next(t for t in report.trends if t.series == "memory me")
    assert memory.samples < len(report.samples)
    assert memory.processes == 1
