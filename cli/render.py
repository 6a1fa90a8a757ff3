"""How the CLI shows things: status tables and replayed events."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from rich.console import Console
from rich.table import Table

from asearcher.streams.admin import ClusterStatus
from asearcher.streams.events import GenerationStep, ToolCallRequested, ToolResultReady
from asearcher.streams.records import Record


def status_tables(status: ClusterStatus) -> list[Table]:
    """The broker, its topics and its consumer groups as rich tables."""
    broker = Table(title="Kafka", show_header=False)
    broker.add_row("bootstrap servers", status.bootstrap_servers)
    broker.add_row("brokers", str(status.brokers))
    broker.add_row("cluster id", status.cluster_id or "?")
    topics = Table(title="Topics")
    for column in ("topic", "partitions", "messages"):
        topics.add_column(column, justify="left" if column == "topic" else "right")
    for topic in status.topics:
        topics.add_row(topic.name, str(topic.partitions), f"{topic.messages:,}")
    groups = Table(title="Consumer groups")
    for column in ("group", "state", "members", "lag", "lag by topic"):
        groups.add_column(column)
    for group in status.groups:
        by_topic = ", ".join(f"{t}={n:,}" for t, n in sorted(group.lag_by_topic.items()))
        groups.add_row(group.group_id, group.state, str(group.members), f"{group.lag:,}", by_topic)
    return [broker, topics, groups]


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
