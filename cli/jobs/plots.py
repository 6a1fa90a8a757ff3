"""A run's curves as PNG files, read from its topics (`asearcher plot` and `learn`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asearcher.cli.errors import CliError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from asearcher.streams.cluster.settings import KafkaSettings
    from asearcher.streams.wire.codec import EventCodec
    from asearcher.streams.wire.events import EvalResult, TrainerStepFinished


# The counts among an evaluation's averages drawn on their own axis (their scale is far larger).
TOKEN_COUNTS = ("gen_len",)


def read_run(
    settings: KafkaSettings, codec: EventCodec, run: str, topics: Sequence[str]
) -> tuple[list[TrainerStepFinished], list[EvalResult], set[str]]:
    """The trainer steps and evaluation results of `run` in `topics`, and the other runs seen.

    Undecodable records are skipped (nothing is dead-lettered: plotting writes nothing).
    """
    from rich.console import Console
    from rich.progress import SpinnerColumn, TextColumn

    from asearcher.cli.progress import LoggedProgress
    from asearcher.streams.io.replay import ReplayRange, read_range
    from asearcher.streams.wire.events import EvalResult, TrainerStepFinished

    steps: list[TrainerStepFinished] = []
    results: list[EvalResult] = []
    others: set[str] = set()
    wanted = ReplayRange(kinds=[TrainerStepFinished.kind(), EvalResult.kind()])
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TextColumn("{task.completed:,}"))
    with LoggedProgress(*columns, console=Console(), transient=True) as progress:
        task = progress.add_task(f"reading {', '.join(topics)}", total=None)
        for record in read_range(settings, codec, topics, wanted):
            event = record.event
            progress.advance(task)
            if not isinstance(event, TrainerStepFinished | EvalResult):
                continue
            if event.model != run:
                others.add(event.model or "<unnamed>")
            elif isinstance(event, TrainerStepFinished):
                steps.append(event)
            else:
                results.append(event)
    return steps, results, others


def plot_run(
    steps: Sequence[TrainerStepFinished], results: Sequence[EvalResult], out_dir: Path
) -> list[Path]:
    """Draw the figures of one run's steps and evaluation results into `out_dir`; return the
    files written. A version seen twice (a re-run, a re-evaluation) keeps its latest event.

    Raises CliError when there is nothing to draw.
    """
    if not steps and not results:
        raise CliError("nothing to plot: no trainer steps and no evaluation results")
    out_dir.mkdir(parents=True, exist_ok=True)
    latest_steps = _latest_steps(steps)
    written: list[Path] = []
    if latest_steps:
        written.append(_save(_reward_figure(latest_steps), out_dir / "reward.png"))
        written.append(_save(_staleness_figure(latest_steps), out_dir / "staleness.png"))
        written.append(_save(_throughput_figure(latest_steps), out_dir / "throughput.png"))
    names: set[str] = set()
    for benchmark, series in sorted(_results_by_benchmark(results).items()):
        name = _unique(f"eval-{_file_safe(benchmark)}", names)
        written.append(_save(_eval_figure(benchmark, series), out_dir / f"{name}.png"))
    return written


def _latest_steps(steps: Iterable[TrainerStepFinished]) -> list[TrainerStepFinished]:
    by_version = {step.version: step for step in steps}  # log order: the last one wins
    return [by_version[v] for v in sorted(by_version)]


def _results_by_benchmark(results: Iterable[EvalResult]) -> dict[str, list[EvalResult]]:
    latest: dict[tuple[str, int], EvalResult] = {}
    for result in results:
        latest[(result.benchmark, result.policy_version)] = result
    grouped: dict[str, list[EvalResult]] = {}
    for (benchmark, _), result in sorted(latest.items()):
        grouped.setdefault(benchmark, []).append(result)
    return grouped


def _file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "benchmark"


def _unique(name: str, taken: set[str]) -> str:
    # Two benchmarks whose names differ only in unsafe characters must not share a file.
    candidate, index = name, 2
    while candidate in taken:
        candidate, index = f"{name}-{index}", index + 1
    taken.add(candidate)
    return candidate


def _figure(rows: int, title: str) -> tuple[Figure, list[Axes]]:
    # A bare Figure on the Agg canvas: no pyplot state, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(8, 3.2 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    axes = list(figure.subplots(rows, 1, sharex=True, squeeze=False)[:, 0])
    figure.suptitle(title)
    axes[-1].set_xlabel("weight version")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))  # versions are whole numbers
    return figure, axes


def _save(figure: Figure, path: Path) -> Path:
    figure.savefig(path, format="png", dpi=100)
    return path


def _line(axes: Axes, xs: Sequence[float], ys: Sequence[float], label: str, **style: Any) -> None:
    axes.plot(xs, ys, marker="o", markersize=3, label=label, **style)


def _finish(axes: Axes, ylabel: str) -> None:
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="best", fontsize="small")


def _reward_figure(steps: Sequence[TrainerStepFinished]) -> Figure:
    figure, (reward, loss) = _figure(2, "Training reward")
    versions = [s.version for s in steps]
    _line(reward, versions, [s.stats.reward_mean for s in steps], "reward mean")
    _finish(reward, "reward")
    _line(loss, versions, [s.stats.loss for s in steps], "loss", color="tab:red")
    _finish(loss, "loss")
    return figure


def _staleness_figure(steps: Sequence[TrainerStepFinished]) -> Figure:
    from asearcher.consumers.observability.metrics_processor import staleness_stats

    figure, (staleness, drops) = _figure(2, "Staleness of trained samples")
    known = [(s.version, stats) for s in steps if (stats := staleness_stats(s.staleness_counts))]
    versions = [v for v, _ in known]
    _line(staleness, versions, [stats[0] for _, stats in known], "mean")
    _line(staleness, versions, [stats[1] for _, stats in known], "max", linestyle="--")
    _finish(staleness, "versions behind")
    every = [s.version for s in steps]
    _line(drops, every, [s.dropped_stale for s in steps], "stale samples")
    _line(drops, every, [s.dropped_flat_groups for s in steps], "flat groups")
    _line(drops, every, [s.dropped_small_groups for s in steps], "small groups")
    _finish(drops, "dropped before the step")
    return figure


def _throughput_figure(steps: Sequence[TrainerStepFinished]) -> Figure:
    from asearcher.consumers.observability.metrics_processor import trajectories_per_s

    figure, (tokens, trajectories) = _figure(2, "Throughput")
    throughput = [s.stats.tokens_per_s for s in steps]
    _line(tokens, [s.version for s in steps], throughput, "trainer tokens/s")
    _finish(tokens, "tokens / s")
    rates = [
        (step.version, rate)
        for previous, step in zip(steps, steps[1:], strict=False)
        if (rate := trajectories_per_s(previous.version, previous.created_at, step)) is not None
    ]
    _line(trajectories, [v for v, _ in rates], [r for _, r in rates], "trained per wall second")
    _finish(trajectories, "trajectories / s")
    return figure


def _eval_figure(benchmark: str, results: Sequence[EvalResult]) -> Figure:
    scores = sorted({name for r in results for name in r.best_of_k})
    counts = sorted({name for r in results for name in r.averages} - set(scores))
    ks = sorted({r.samples_per_question for r in results})
    k = "/".join(str(value) for value in ks)
    figure, axes = _figure(3 if counts else 2, f"Evaluation: {benchmark}")
    _series(axes[0], results, scores, lambda r: r.averages)
    _finish(axes[0], f"Avg@{k}")
    _series(axes[1], results, scores, lambda r: r.best_of_k)
    _finish(axes[1], f"Pass@{k}")
    for score_axes in axes[:2]:
        score_axes.set_ylim(-0.05, 1.05)  # scores live in [0, 1]: a flat 1.0 must look like one
    if counts:
        _counts(axes[2], results, counts, k)
    return figure


def _series(axes: Axes, results: Sequence[EvalResult], names: Sequence[str], values: Any) -> None:
    for name in names:
        points = [(r.policy_version, values(r)[name]) for r in results if name in values(r)]
        _line(axes, [v for v, _ in points], [y for _, y in points], name)


def _counts(axes: Axes, results: Sequence[EvalResult], names: Sequence[str], k: str) -> None:
    """Avg@k of the agent's counts; generated tokens on a second axis (hundreds vs a few)."""
    _series(axes, results, [n for n in names if n not in TOKEN_COUNTS], lambda r: r.averages)
    _finish(axes, f"Avg@{k} per sample")
    tokens = [n for n in names if n in TOKEN_COUNTS]
    if tokens:
        right = axes.twinx()
        for name in tokens:
            points = [(r.policy_version, r.averages[name]) for r in results if name in r.averages]
            _line(right, [v for v, _ in points], [y for _, y in points], name, color="tab:gray",
                  linestyle=":")  # fmt: skip
        right.set_ylabel("generated tokens")
        right.legend(loc="lower right", fontsize="small")
