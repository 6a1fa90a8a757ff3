"""Memory and disk of a running run, sampled over time, and whether they stay flat.

A soak (`stream chaos` for an hour) must show more than "nothing lost": a service whose memory
grows by a few MB a minute, or a topic that never compacts, fails days later. Every sample
holds the resident memory of each supervised service (its process and children, so a
service's worker processes count) and of the local broker, and the size on disk of the
broker's data and of the run's directory. The trend of each series is the least-squares slope
over the samples after a warm-up (caches fill, JIT-compiled code loads, topics get their first
segments), in MB per hour. Under chaos a service is killed every few minutes, so its series
joins the lives of many processes; each sample also names the process, and the trend of a
memory series is given within each process's life as well (the pooled slope, one intercept per
process), which neither a restart's drop nor a young process caught at a peak can fake.

A service that allocates for a step and frees after it (the trainer, which hands its freed heap
back after every step) swings between a floor and a peak, and a least-squares slope over such
a saw says more about where the samples fell than about growth: it read +673 MB/h for a trainer
whose lowest sample of every 5 minutes stayed within 972-1,036 MB for half an hour. So each
memory series also has the slope of its floor: the lowest sample of each `FLOOR_WINDOW_S`
within a process's life, pooled over lives. A leak lifts the floor; a saw does not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

import msgspec
import psutil

MB = 1024 * 1024
FLOOR_WINDOW_S = 300.0


class ResourceSample(msgspec.Struct, kw_only=True):
    """One moment of the run: resident memory per process and bytes on disk per place, in MB."""

    at_s: float  # seconds since sampling began
    memory_mb: dict[str, float]  # service name (and "broker") -> RSS of its process tree
    disk_mb: dict[str, float]  # "broker data", "run dir" -> size
    pids: dict[str, int] = {}  # service name -> its process (another pid: it was restarted)


class Trend(msgspec.Struct, kw_only=True):
    """One series after the warm-up: where it started and ended, its peak and its slope."""

    series: str  # "memory rollout-0", "disk broker data", ...
    samples: int
    first_mb: float
    last_mb: float
    peak_mb: float
    slope_mb_per_h: float
    processes: int = 0  # processes whose lives the series joins (0: not a process's memory)
    within_process_mb_per_h: float = 0.0  # the slope within each process's life, pooled
    # The slope of its lowest sample per FLOOR_WINDOW_S within each life, pooled (None: no
    # life held two whole windows, as under chaos every few minutes).
    floor_mb_per_h: float | None = None


class ResourceReport(msgspec.Struct, kw_only=True):
    """Every sample, and the trend of each series after `warmup_s`."""

    every_s: float
    warmup_s: float
    samples: list[ResourceSample] = []
    trends: list[Trend] = []


def tree_rss_mb(pid: int) -> float | None:
    """Resident memory of `pid` and its descendants in MB; None if it is gone."""
    try:
        process = psutil.Process(pid)
        tree = [process, *process.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for member in tree:
        try:
            total += member.memory_info().rss
        except psutil.Error:
            continue  # a child that ended meanwhile
    return total / MB


def directory_mb(path: Path) -> float:
    """Bytes under `path` in MB (files that vanish while walking, as segments do, skipped)."""
    total = 0
    for item in path.rglob("*"):
        try:
            if item.is_file():
                total += item.stat().st_size
        except OSError:
            continue
    return total / MB


class ResourceSampler:
    """Takes a sample every `every_s` when `maybe_sample` is called often enough."""

    def __init__(
        self,
        pids: Callable[[], dict[str, int]],
        places: dict[str, Path],
        every_s: float = 30.0,
        warmup_s: float = 600.0,
    ) -> None:
        self._pids, self._places = pids, places
        self.report = ResourceReport(every_s=every_s, warmup_s=warmup_s)
        self._started = time.monotonic()
        self._next = 0.0

    def maybe_sample(self) -> None:
        """Sample now if one is due."""
        now = time.monotonic() - self._started
        if now < self._next:
            return
        self._next = now + self.report.every_s
        pids = dict(sorted(self._pids().items()))
        memory = {name: round(mb, 1) for name, pid in pids.items()
                  if (mb := tree_rss_mb(pid)) is not None}  # fmt: skip
        disk = {name: round(directory_mb(path), 1) for name, path in self._places.items()}
        self.report.samples.append(ResourceSample(
            at_s=round(now, 1), memory_mb=memory, disk_mb=disk,
            pids={name: pid for name, pid in pids.items() if name in memory},
        ))  # fmt: skip

    def finish(self) -> ResourceReport:
        """The report, with the trends after the warm-up (or of the second half, for runs
        shorter than twice the warm-up, so that a short run still gets a trend)."""
        samples = self.report.samples
        end = samples[-1].at_s if samples else 0.0
        since = min(self.report.warmup_s, end / 2)
        after = [s for s in samples if s.at_s >= since]
        self.report.trends = [
            *trends("memory", after, lambda s: s.memory_mb),
            *trends("disk", after, lambda s: s.disk_mb),
        ]
        return self.report


def trends(
    kind: str, samples: list[ResourceSample], values: Callable[[ResourceSample], dict[str, float]]
) -> list[Trend]:
    """The trend of every series of `kind` over `samples`."""
    names = sorted({name for sample in samples for name in values(sample)})
    result = []
    for name in names:
        points = [(s.at_s, values(s)[name]) for s in samples if name in values(s)]
        if not points:
            continue
        lives = process_lives(samples, name, values)
        floor_points = [floors(group) for group in (lives.values() if lives else [points])]
        floor_known = any(len(life_floors) >= 2 for life_floors in floor_points)
        result.append(
            Trend(
                series=f"{kind} {name}",
                samples=len(points),
                first_mb=points[0][1],
                last_mb=points[-1][1],
                peak_mb=max(v for _, v in points),
                slope_mb_per_h=round(3600 * slope(points), 1),
                processes=len(lives),
                within_process_mb_per_h=round(3600 * pooled_slope(lives.values()), 1),
                floor_mb_per_h=round(3600 * pooled_slope(floor_points), 1) if floor_known else None,
            )  # fmt: skip
        )
    return result


def process_lives(
    samples: list[ResourceSample], name: str, values: Callable[[ResourceSample], dict[str, float]]
) -> dict[int, list[tuple[float, float]]]:
    """The points of series `name` per process that held it (none for a series of no process)."""
    lives: dict[int, list[tuple[float, float]]] = {}
    for sample in samples:
        pid = sample.pids.get(name)
        if pid is not None and name in values(sample):
            lives.setdefault(pid, []).append((sample.at_s, values(sample)[name]))
    return lives


def floors(
    points: list[tuple[float, float]], window_s: float = FLOOR_WINDOW_S
) -> list[tuple[float, float]]:
    """The lowest value of each whole `window_s` of `points` (from the first), at the window's
    middle. A window the samples cover less than three quarters of (a life's last minutes) is
    left out: its lowest sample is no floor."""
    if not points:
        return []
    start = points[0][0]
    windows: dict[int, list[tuple[float, float]]] = {}
    for x, y in points:
        windows.setdefault(int((x - start) // window_s), []).append((x, y))
    return [
        (start + (index + 0.5) * window_s, min(y for _, y in window))
        for index, window in sorted(windows.items())
        if window[-1][0] - window[0][0] >= 0.75 * window_s
    ]


def slope(points: Iterable[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y) points (0 for fewer than two distinct x)."""
    return pooled_slope([list(points)])


def pooled_slope(groups: Iterable[list[tuple[float, float]]]) -> float:
    """Least-squares slope shared by groups of points, each with its own intercept (0 when no
    group has two distinct x): how fast y grows within a group, whatever the jumps between."""
    covariance = spread = 0.0
    for points in groups:
        if not points:
            continue
        mean_x = sum(x for x, _ in points) / len(points)
        mean_y = sum(y for _, y in points) / len(points)
        covariance += sum((x - mean_x) * (y - mean_y) for x, y in points)
        spread += sum((x - mean_x) ** 2 for x, _ in points)
    return covariance / spread if spread else 0.0
