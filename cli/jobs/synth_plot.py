"""The synthesis statistics as one PNG: questions by injections, fuzzes and supporting facts,
and the no-tool model's accuracy by a candidate's number of edits."""

from __future__ import annotations

from pathlib import Path

from asearcher.consumers.synthesis.stats import SynthStats


def plot_stats(stats: SynthStats, path: Path) -> Path:
    """Draw `stats` into `path` (PNG) and return it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(12, 3.2), layout="constrained")
    FigureCanvasAgg(figure)
    panels = figure.subplots(1, 4)
    histograms = (("injections", stats.injections), ("fuzzes", stats.fuzzes),
                  ("supporting facts", stats.facts))  # fmt: skip
    for axes, (name, histogram) in zip(panels, histograms, strict=False):
        axes.bar(list(histogram), list(histogram.values()), color="tab:blue")
        axes.set(title=f"accepted questions by {name}", xlabel=name, ylabel="questions")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    edits = list(stats.no_tool_accuracy)
    accuracy = [100 * share for _, share in stats.no_tool_accuracy.values()]
    panels[3].plot(edits, accuracy, marker="o", color="tab:red")
    panels[3].set(title="no-tool accuracy by edits", xlabel="edits", ylabel="% right",
                  ylim=(0, 100))  # fmt: skip
    panels[3].xaxis.set_major_locator(MaxNLocator(integer=True))
    figure.savefig(path, dpi=100)
    return path
