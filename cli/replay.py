"""`asearcher replay ...`: read any range of the log back, export it, or re-drive it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from asearcher.cli.errors import CliError
from asearcher.cli.wiring import ClusterOptions, as_cli_error, with_cluster

if TYPE_CHECKING:
    from asearcher.streams.io.replay import ReplayRange

console = Console()


@with_cluster
def replay(
    topics: Annotated[list[str], typer.Argument(help="Topics to read (several: merged view).")],
    from_offset: Annotated[
        int | None, typer.Option(min=0, help="First offset, every partition.")
    ] = None,
    to_offset: Annotated[int | None, typer.Option(min=0, help="Stop before this offset.")] = None,
    since: Annotated[str | None, typer.Option(help="Start time: ISO-8601 or epoch ms.")] = None,
    until: Annotated[str | None, typer.Option(help="End time (exclusive).")] = None,
    trajectory: Annotated[
        str | None, typer.Option("--trajectory", "-t", help="Only this trajectory, turn by turn.")
    ] = None,
    kind: Annotated[
        list[str] | None, typer.Option("--kind", "-k", help="Only these event kinds (repeatable).")
    ] = None,
    export: Annotated[
        str | None, typer.Option(help="Write JSONL to this fsspec URL (.gz/.zst compress).")
    ] = None,
    to_topic: Annotated[
        str | None, typer.Option(help="Re-drive the events into this existing topic.")
    ] = None,
    create: Annotated[
        bool,
        typer.Option(
            "--create", help="Create a missing --to-topic (declared layout, else the source's)."
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Re-drive into a --to-topic whose declared kinds do not match."
        ),
    ] = False,
    run: Annotated[
        str | None,
        typer.Option(
            "--run", help="Only this run's records (by model, group, pool or instance name)."
        ),
    ] = None,
    *,
    cluster: ClusterOptions,
) -> None:
    """Read a range of TOPICS back: print it, export it to JSONL, or re-drive it into a topic.

    Replay reads without joining a consumer group, so it never moves anyone's offsets.
    --run NAME narrows it to one run's records (the topics are shared by every run).
    Example: asearcher replay rollout.steps tool.calls tool.results -t 3f2a...
    """
    from asearcher.cli.render import print_records, print_trajectory
    from asearcher.streams.cluster.preflight import missing_topics
    from asearcher.streams.io.replay import ReplayError, export_jsonl, read_range

    if export and to_topic:
        raise CliError("choose one of --export and --to-topic")
    if (create or force) and not to_topic:
        raise CliError("--create and --force go with --to-topic")
    if to_topic and not force:
        _check_kinds(topics, kind or [], to_topic)
    rng = _range(from_offset, to_offset, since, until, trajectory, kind or [])
    settings = cluster.settings(check_local=True)
    missing = missing_topics(settings, topics)
    if missing:
        raise CliError(f"no topic {missing[0]!r} on {settings.bootstrap_servers} "
                       "(`asearcher stream status` lists the topics)")  # fmt: skip
    codec = cluster.codec()
    records = read_range(settings, codec, topics, rng)
    if run:
        from asearcher.consumers.observability.run_records import run_filter

        ours = run_filter(settings, codec, run, topics)
        records = (record for record in records if ours.accepts(record.event))
    with as_cli_error(ReplayError):
        if export:
            console.print(f"exported {export_jsonl(records, export):,} events to {export}")
        elif to_topic:
            count = _redrive(settings, codec, topics, records, to_topic, create)
            console.print(f"re-drove {count:,} events into {to_topic}")
        elif trajectory:
            print_trajectory(console, records)
        else:
            console.print(f"[dim]{print_records(console, records):,} events[/dim]")


def _range(
    from_offset: int | None,
    to_offset: int | None,
    since: str | None,
    until: str | None,
    trajectory: str | None,
    kinds: list[str],
) -> ReplayRange:
    from asearcher.streams.io.replay import ReplayRange, parse_timestamp
    from asearcher.streams.wire.events import EVENTS_BY_KIND

    unknown = sorted(set(kinds) - set(EVENTS_BY_KIND))
    if unknown:
        raise CliError(f"--kind {unknown[0]!r} is not an event kind ({', '.join(EVENTS_BY_KIND)})")
    try:
        return ReplayRange(
            from_offset=from_offset,
            to_offset=to_offset,
            since_ms=parse_timestamp(since) if since else None,
            until_ms=parse_timestamp(until) if until else None,
            trajectory_id=trajectory,
            kinds=kinds,
        )
    except ValueError as exc:
        raise CliError(f"--since/--until: {exc}") from exc


def _check_kinds(topics: list[str], kinds: list[str], to_topic: str) -> None:
    """Refuse to re-drive kinds the declared target topic does not carry: every consumer of it
    would dead-letter them. Undeclared topics (a user's own) are not checked."""
    from asearcher.streams.wire.topics import TOPICS_BY_NAME

    target = TOPICS_BY_NAME.get(to_topic)
    if target is None:
        return
    accepted = {event.kind() for event in target.event_types}
    sent = set(kinds) or {
        event.kind()
        for topic in topics
        if topic in TOPICS_BY_NAME
        for event in TOPICS_BY_NAME[topic].event_types
    }
    foreign = sorted(sent - accepted)
    if foreign:
        raise CliError(
            f"{to_topic} carries {', '.join(sorted(accepted))}, not {', '.join(foreign)}: "
            "its consumers would dead-letter them (pick --kind, or add --force)"
        )


def _redrive(settings, codec, topics: list[str], records, to_topic: str, create: bool) -> int:
    from asearcher.streams.cluster.admin import ensure_topics
    from asearcher.streams.cluster.preflight import missing_topics
    from asearcher.streams.io.producer import EventProducer
    from asearcher.streams.io.replay import redrive
    from asearcher.streams.wire.topics import TOPICS_BY_NAME, topic_spec

    if missing_topics(settings, [to_topic]):
        if not create:
            # A typo here would otherwise silently start a new topic.
            raise CliError(f"topic {to_topic!r} does not exist: add --create to create it")
        # A fresh target gets its declared layout, else that of the (first) source topic.
        spec = TOPICS_BY_NAME.get(to_topic) or topic_spec(topics[0]).with_name(to_topic)
        ensure_topics(settings, [spec])
    with EventProducer(settings, codec) as producer:
        return redrive(records, producer, to_topic)
