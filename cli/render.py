"""How the CLI shows things: status tables and replayed events."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import TYPE_CHECKING

from rich.console import Console, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from asearcher.streams.cluster.settings import KafkaSettings

from asearcher.streams.cluster.admin import ClusterStatus, TopicStatus
from asearcher.streams.service.run_status import TrainerSummary
from asearcher.streams.service.supervisor import ProcessState
from asearcher.streams.wire.events import (
    EvalResult,
    GenerationStep,
    ServiceStatus,
    ToolCallRequested,
    ToolResultReady,
)
from asearcher.streams.wire.records import Record

STALE_HEARTBEAT_S = 30.0  # heartbeats come every few seconds: older ones mean trouble
BAR_WIDTH = 40
STATE_STYLES = {"running": "green", "waiting": "yellow", "stopping": "yellow", "stopped": "red"}


def status_tables(status: ClusterStatus, counts: dict[str, int] | None = None) -> list[Table]:
    """The broker, its topics and its consumer groups as rich tables.

    `counts` overrides the per-topic message counts (which otherwise come from the watermarks
    and so include transaction markers), e.g. with those of `run_status.message_counts`.
    """
    counts = counts or {}
    broker = Table(title="Kafka", show_header=False)
    broker.add_row("bootstrap servers", status.bootstrap_servers)
    nodes = ", ".join(f"{node} at {at}" for node, at in sorted(status.broker_addresses.items()))
    broker.add_row("brokers", f"{status.brokers} ({nodes})" if nodes else str(status.brokers))
    broker.add_row("cluster id", status.cluster_id or "?")
    lagging = status.under_replicated
    broker.add_row("under-replicated partitions", Text(str(lagging), "yellow" if lagging else ""))
    topics = Table(title="Topics")
    for column in ("topic", "partitions", "replicas", "leaders", "messages"):
        topics.add_column(column, justify="left" if column in ("topic", "leaders") else "right")
    for topic in status.topics:
        messages = counts.get(topic.name, topic.messages)
        topics.add_row(
            topic.name, str(topic.partitions), _replicas(topic), _leaders(topic), f"{messages:,}"
        )
    groups = Table(title="Consumer groups")
    for column in ("group", "state", "members", "lag", "lag by topic"):
        groups.add_column(column)
    for group in status.groups:
        by_topic = ", ".join(f"{t}={n:,}" for t, n in sorted(group.lag_by_topic.items()))
        groups.add_row(group.group_id, group.state, str(group.members), f"{group.lag:,}", by_topic)
    return [broker, topics, groups]


def _replicas(topic: TopicStatus) -> Text:
    """Replicas, and how many partitions lack an in-sync copy (yellow)."""
    if not topic.under_replicated:
        return Text(str(topic.replicas))
    return Text(f"{topic.replicas} ({topic.under_replicated} under)", "yellow")


def _leaders(topic: TopicStatus) -> Text:
    """Partitions led per broker (`1:3 2:3 3:2`); partitions without a leader in red."""
    text = Text(" ".join(f"{node}:{n}" for node, n in topic.leaders.items() if node >= 0))
    if offline := topic.leaders.get(-1, 0):
        text.append(f" {offline} offline", "red")
    return text


# One supervised process, as the process supervisor reports it.
ProcessRow = ProcessState


def run_tables(
    processes: list[ProcessRow] | None,
    heartbeats: dict[str, ServiceStatus],
    trainer: TrainerSummary | None,
    dead_letters: int,
    now: float,
    evaluations: list[EvalResult] | None = None,
) -> list[RenderableType]:
    """What a run is doing: its processes, heartbeats, waits, trainer, staleness and drops.

    `processes` is None when no supervisor runs (services started by hand); `now` is the unix
    time heartbeat ages and the last step are measured against.
    """
    shown: list[RenderableType] = []
    if processes is not None:
        shown.append(services_table(processes))
    if heartbeats:
        shown.append(heartbeats_table(heartbeats, now))
        shown.extend(waiting_lines(heartbeats))
    if trainer is not None:
        shown.append(trainer_panel(trainer, now))
        if any(trainer.staleness_counts):
            shown.append(staleness_histogram(trainer))
    if evaluations:
        from asearcher.consumers.evaluation.eval_scores import render_table

        table = render_table(evaluations)
        table.title = "latest evaluation per benchmark"
        shown.append(table)
    shown.append(drops_line(trainer, dead_letters))
    return shown


def duration(seconds: float) -> str:
    """A short human duration: 42s, 3m12s, 2h05m, 1d03h."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _state(state: str) -> Text:
    return Text(state, style=STATE_STYLES.get(state, "bold red"))


def services_table(processes: list[ProcessRow]) -> Table:
    """The supervised processes: state, pid, uptime and restarts."""
    table = Table(title="Services", caption=None if processes else "no supervised processes")
    for column in ("service", "state", "pid", "uptime", "restarts", "description"):
        table.add_column(column, justify="right" if column in ("pid", "restarts") else "left")
    for row in processes:
        restarts = Text(str(row.restarts), style="bold red" if row.restarts else "")
        pid = str(row.pid) if row.pid > 0 else "-"
        table.add_row(
            row.name, _state(row.state), pid, duration(row.uptime_s), restarts, row.description
        )
    return table


def heartbeats_table(heartbeats: dict[str, ServiceStatus], now: float) -> Table:
    """The newest heartbeat of every instance, with its key counters and its age."""
    table = Table(title="Heartbeats")
    for column in ("instance", "service", "state", "version", "progress", "age"):
        table.add_column(column, justify="right" if column in ("version", "age") else "left")
    for status in sorted(heartbeats.values(), key=lambda s: (s.service, s.instance)):
        age = now - status.created_at
        age_text = Text(f"{age:.0f}s")
        if age > STALE_HEARTBEAT_S:
            age_text = Text(f"{age:.0f}s stale", style="bold red")
        version = str(status.version) if status.version >= 0 else "-"
        table.add_row(
            status.instance, status.service, _state(status.state), version,
            counters_text(status), age_text,
        )  # fmt: skip
    return table


def counters_text(status: ServiceStatus) -> str:
    """The counters that say how a service is getting on, by service kind."""
    c = status.counters
    if status.service in ("rollout", "evaluator"):
        text = f"{c.get('trajectories_per_s', 0):.2f} traj/s, {c.get('in_flight', 0):.0f} in flight"
        copies = c.get("duplicates", 0)
        return f"{text}, {copies:.0f} copies not played" if copies else text
    if status.service == "trainer":
        text = f"{c.get('steps', 0):.0f} steps, {c.get('held', 0):.0f} held"
        return f"{text}, fetching paused (enough ready)" if c.get("fetching_paused") else text
    if status.service == "feeder":
        return f"{c.get('published', 0):.0f} published, {c.get('outstanding', 0):.0f} outstanding"
    return ", ".join(f"{name} {value:g}" for name, value in sorted(c.items()))


def waiting_lines(heartbeats: dict[str, ServiceStatus]) -> list[Text]:
    """One highlighted line per instance that says it waits, with its reason."""
    lines = []
    for status in sorted(heartbeats.values(), key=lambda s: (s.service, s.instance)):
        if status.waiting_for and status.state != "stopped":
            # Text, not markup: a reason may hold brackets.
            lines.append(
                Text.assemble(
                    ("waiting ", "bold yellow"),
                    (f"{status.service}/{status.instance}", "bold"),
                    ": ",
                    (status.waiting_for, "yellow"),
                )
            )
    return lines


def trainer_panel(trainer: TrainerSummary, now: float) -> Panel:
    """The trainer's version, steps, recent reward, speed and idle share."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim")
    grid.add_column()
    reward = "-" if trainer.reward_mean is None else f"{trainer.reward_mean:.3f}"
    ago = "-" if trainer.last_step_at is None else f"{duration(now - trainer.last_step_at)} ago"
    grid.add_row("version", str(trainer.version))
    grid.add_row("steps", f"{trainer.steps:,}")
    grid.add_row("reward mean (last 5 steps)", reward)
    grid.add_row("tokens/s", f"{trainer.tokens_per_s:,.0f}")
    grid.add_row("idle", f"{trainer.idle_fraction:.0%}")
    grid.add_row("last step", ago)
    return Panel(grid, title="Trainer", expand=False)


def staleness_histogram(trainer: TrainerSummary) -> Table:
    """One row per staleness (versions behind) with a bar and the number of samples."""
    counts = trainer.staleness_counts
    table = Table(title=f"Staleness of samples trained in the last {trainer.recent_steps} steps")
    table.add_column("versions behind", justify="right")
    table.add_column("samples", justify="right")
    table.add_column("", min_width=BAR_WIDTH)
    biggest = max(counts, default=0) or 1
    for staleness, count in enumerate(counts):
        width = round(count / biggest * BAR_WIDTH)
        bar = "█" * (max(width, 1) if count else 0)
        table.add_row(str(staleness), f"{count:,}", Text(bar, style="cyan"))
    return table


def drops_line(trainer: TrainerSummary | None, dead_letters: int) -> Text:
    """What was set aside: flat, small and stale groups, duplicates, and invalid records."""
    summary = trainer or TrainerSummary()
    parts = [
        ("flat groups", summary.dropped_flat_groups),
        ("small groups", summary.dropped_small_groups),
        ("stale samples", summary.dropped_stale),
        ("duplicates", summary.duplicates),
        ("invalid", dead_letters),
    ]
    line = Text("drops: ", style="bold")
    for index, (name, count) in enumerate(parts):
        if index:
            line.append(" · ", style="dim")
        line.append(f"{name} ")
        line.append(f"{count:,}", style="bold red" if count and name == "invalid" else "bold")
    return line


def _time(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def print_records(console: Console, records: Iterable[Record]) -> int:
    """One line per record: where it is, when, and what it says."""
    count = 0
    for record in records:
        console.print(
            f"[dim]{record.origin} {_time(record.timestamp_ms)}[/dim] {record.event.summary()}",
            highlight=False,
            soft_wrap=True,  # one record per line, also when piped into grep
        )
        count += 1
    return count


def print_trajectory(console: Console, records: Iterable[Record]) -> int:
    """One trajectory turn by turn: what the policy wrote, what it called, what came back."""
    ordered = sorted(records, key=lambda r: (getattr(r.event, "turn", 1 << 30), r.event.created_at))
    current_turn = None
    for record in ordered:
        turn = getattr(record.event, "turn", None)
        if turn != current_turn:
            console.rule(f"turn {turn}" if turn is not None else "end")
            current_turn = turn
        console.print(f"[bold]{record.event.summary()}[/bold]", highlight=False, soft_wrap=True)
        text = _text_of(record)
        if text:
            console.print(text, markup=False, highlight=False)
    return len(ordered)


def _text_of(record: Record) -> str:
    event = record.event
    if isinstance(event, GenerationStep):
        return event.text
    if isinstance(event, ToolCallRequested):
        return ", ".join(f"{k}: {v}" for k, v in event.arguments.items())
    if isinstance(event, ToolResultReady):
        return event.error or event.text[:2000]
    return ""


def status_view(settings: KafkaSettings, home: str | None, run: str | None):
    """Everything `status` shows, as one renderable."""
    import time

    from rich.console import Group

    from asearcher.cli.render import run_tables, status_tables
    from asearcher.cli.run import topology
    from asearcher.streams.cluster.admin import cluster_status
    from asearcher.streams.cluster.settings import state_dir
    from asearcher.streams.service.run_status import (
        latest_eval_results,
        latest_heartbeats,
        message_counts,
        trainer_summary,
    )
    from asearcher.streams.wire.codec import EventCodec
    from asearcher.streams.wire.topics import DEAD_LETTERS

    root = state_dir(home)
    supervisors = topology.runs_up(root)
    if run is not None:
        supervisors = [s for s in supervisors if s.run_dir.name == run]
    processes = [p for s in supervisors for p in s.processes()] if supervisors else None
    cluster = cluster_status(settings)
    counts = message_counts(settings, [t.name for t in cluster.topics], root / "status-counts.json")
    codec = EventCodec()
    parts = run_tables(
        processes,
        latest_heartbeats(settings, codec),
        trainer_summary(settings, codec),
        counts.get(DEAD_LETTERS, 0),
        time.time(),
        latest_eval_results(settings, codec, run),
    )
    return Group(*parts, *status_tables(cluster, counts))  # fmt: skip
