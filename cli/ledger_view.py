"""Tables for a run's ledger and a chaos run's faults, as `stream audit` and `stream chaos` print
them."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from asearcher.cli.jobs.chaos import ChaosReport
from asearcher.cli.jobs.resource_samples import ResourceReport
from asearcher.consumers.observability.run_ledger import RunLedger


def ledger_view(ledger: RunLedger) -> RenderableType:
    """The counts per guarantee, then the verdict with every violation."""
    table = Table(title=f"Ledger of run {ledger.run!r}")
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_column("of which")
    dropped = dropped_reasons(ledger.dropped_by_reason)
    rows = [
        ("training requests", ledger.requests,
         f"{ledger.groups_complete} complete groups, {ledger.groups_pending} still playing"),
        ("trajectories", ledger.trajectories,
         f"{ledger.trained} trained, {ledger.dropped} dropped, "
         f"{ledger.untrained_pending} not yet trained"),
        ("dropped, by reason", ledger.dropped, dropped or "-"),
        ("weight versions", ledger.versions, f"newest v{ledger.newest_version}"),
        ("evaluations", ledger.evaluations, f"{ledger.eval_trajectories} trajectories"),
        ("foreign trajectories", ledger.foreign,
         "trained or dropped, of requests the run did not send: "
         + (", ".join(ledger.foreign_groups) or "-")),
        ("undecodable records", ledger.undecodable,
         "; ".join(f"{n} x {why}" for why, n in ledger.unreadable.items())
         or "in the dead-letter topic"),
    ]  # fmt: skip
    for what, count, detail in rows:
        table.add_row(what, f"{count:,}", detail)
    if ledger.ok:
        verdict = Text("every guarantee holds", style="bold green")
    else:
        lines = "\n".join(f"  - {v}" for v in ledger.violations)
        verdict = Text(f"{len(ledger.violations)} violations:\n{lines}", style="bold red")
    return Group(table, verdict)


# The trainer counts flat and small groups, but stale and duplicate trajectories: each reason
# names its unit so that the row does not read as if it failed to add up to the trajectories.
_REASON_UNITS = {
    "stale": "stale trajectories",
    "flat_groups": "flat groups",
    "small_groups": "small groups",
    "duplicates": "duplicate trajectories",
}


def dropped_reasons(by_reason: dict[str, int]) -> str:
    """The trainer's reasons for dropping, each with its count and unit ("186 flat groups")."""
    return ", ".join(
        f"{n:,} {_REASON_UNITS.get(k, k.replace('_', ' '))}" for k, n in sorted(by_reason.items())
    )


def chaos_view(report: ChaosReport) -> RenderableType:
    """Every fault with its recovery time, and throughput before, during and after."""
    faults = Table(title=f"Faults (seed {report.plan.seed}, {report.plan.seconds:.0f}s)")
    for column in ("at s", "target", "pid", "back after s", "next step after s"):
        faults.add_column(column, justify="right" if column != "target" else "left")
    for fault in report.faults:
        back = "NOT BACK" if fault.recovered_s is None else f"{fault.recovered_s:.1f}"
        step = "none" if fault.next_step_s is None else f"{fault.next_step_s:.1f}"
        faults.add_row(f"{fault.at_s:.1f}", fault.target, str(fault.pid), back, step)
    rate = report.throughput
    speed = Table(title="Trajectories trained per minute")
    for column in ("before", "during the faults", "after", "lost during"):
        speed.add_column(column, justify="right")
    speed.add_row(f"{rate.before:.1f}", f"{rate.during:.1f}", f"{rate.after:.1f}",
                  f"{100 * rate.lost_fraction:.0f}%")  # fmt: skip
    lines = [f"{report.versions_during} weight versions published during the faults"]
    if report.unplanned_restarts:
        crashed = ", ".join(f"{k} {v}x" for k, v in sorted(report.unplanned_restarts.items()))
        lines.append(f"restarted without being killed (crashed on a fault): {crashed}")
    return Group(
        faults, speed, Text("\n".join(lines)), resources_view(report.resources),
        ledger_view(report.ledger),
    )  # fmt: skip


def resources_view(report: ResourceReport) -> RenderableType:
    """Each memory and disk series after the warm-up: first, last, peak and slope."""
    table = Table(
        title=f"Memory and disk ({len(report.samples)} samples every {report.every_s:.0f}s; "
        f"trends after {report.warmup_s:.0f}s, or of the second half of a shorter run)"
    )
    columns = ("series", "samples", "first MB", "last MB", "peak MB", "MB per hour",
               "processes", "MB per hour within one", "floor MB per hour")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "series" else "right")
    for trend in report.trends:
        within = f"{trend.within_process_mb_per_h:+,.1f}" if trend.processes else "-"
        floor = "-" if trend.floor_mb_per_h is None else f"{trend.floor_mb_per_h:+,.1f}"
        table.add_row(trend.series, str(trend.samples), f"{trend.first_mb:,.1f}",
                      f"{trend.last_mb:,.1f}", f"{trend.peak_mb:,.1f}",
                      f"{trend.slope_mb_per_h:+,.1f}", str(trend.processes or "-"),
                      within, floor)  # fmt: skip
    return table
