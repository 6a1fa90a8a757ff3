"""What every stream processor (a faust-streaming app) shares: the app, decoding, sending.

faust reads and writes with its own Kafka client (aiokafka); records stay in the project's
codec (`EventCodec`: the `kind` and content-type headers, claim checks resolved), so a faust
agent consumes raw bytes and decodes them here. A record that cannot be decoded goes to
`dead.letters` with the reason, sent in the agent's transaction, and the agent goes on.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import faust
from faust.types import EventT, StreamT, TopicT

from asearcher.streams.cluster.admin import cluster_size
from asearcher.streams.cluster.settings import KafkaSettings, SettingsError
from asearcher.streams.io.deadletter import dead_letter_headers
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.service import faust_gaps, faust_highwaters
from asearcher.streams.service.log import get_logger
from asearcher.streams.wire.codec import EventCodec, EventDecodeError
from asearcher.streams.wire.events import DeadLetter, Event
from asearcher.streams.wire.topics import DEAD_LETTERS, record_key, replicas_on

log = get_logger(__name__)
faust_gaps.install()  # before any app exists: its commits must step over transaction markers
faust_highwaters.install()  # and a restarted app must rebuild its tables whole
DEAD_LETTER_FLUSH_S = 10.0

RawHeaders = Sequence[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None


def broker_url(settings: KafkaSettings) -> str:
    """faust's broker URL for the cluster (`kafka://host:port;host:port`)."""
    hosts = [h.strip() for h in settings.bootstrap_servers.split(",") if h.strip()]
    return ";".join(f"kafka://{host}" for host in hosts)


def broker_credentials(settings: KafkaSettings) -> faust.auth.Credentials | None:
    """SASL/PLAIN or SCRAM credentials from the client config, as faust takes them."""
    config = settings.client_config
    protocol = config.get("security.protocol", "PLAINTEXT").upper()
    if protocol == "PLAINTEXT":
        return None
    if protocol != "SASL_PLAINTEXT":
        raise SettingsError(
            f"security.protocol {protocol}: stream processors support PLAINTEXT and SASL_PLAINTEXT"
        )
    return faust.SASLCredentials(
        username=config.get("sasl.username", ""),
        password=config.get("sasl.password", ""),
        mechanism=config.get("sasl.mechanism", "PLAIN"),
    )


def make_app(
    app_id: str,
    settings: KafkaSettings,
    datadir: Path,
    *,
    exactly_once: bool = True,
    partitions: int = 4,
    replicas: int | None = None,
    **options: Any,
) -> faust.App:
    """A faust app on the cluster; tables live in memory and are rebuilt from their changelog
    topics on start, so a restarted processor continues where its last commit left it."""
    datadir.mkdir(parents=True, exist_ok=True)
    return faust.App(
        app_id,
        broker=broker_url(settings),
        broker_credentials=broker_credentials(settings),
        store="memory://",
        datadir=str(datadir),
        processing_guarantee="exactly_once" if exactly_once else "at_least_once",
        topic_partitions=partitions,
        # Its changelog and repartition topics are copied like the project's own topics (on the
        # cluster as it is when the app is made, unless `replicas` says).
        topic_replication_factor=replicas or replicas_on(cluster_size(settings)),
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        **options,
    )


def raw_topic(app: faust.App, name: str) -> TopicT:
    """A topic read and written as bytes (the codec does the rest)."""
    return app.topic(name, key_type=bytes, value_type=bytes, value_serializer="raw",
                     key_serializer="raw")  # fmt: skip


def transactional_output(app: faust.App, name: str) -> TopicT:
    """Topic `name` as an output of `app` that joins its exactly-once transactions, for
    `FaustEvents.send_with_commit`.

    faust picks a record's transactional producer by the output topic's partition group and
    partition; a topic the app does not follow has no group, and its records go out at once,
    outside any transaction, even under exactly-once processing. So the app follows the topic
    (an agent that reads and drops it: faust's assignor then groups it with the input topics
    of the same partition count, which must be the output's), and a record sent on the
    partition of the event being processed is written by the producer that commits that
    event's offset.
    """
    topic = raw_topic(app, name)

    async def drop(stream: StreamT) -> None:
        async for _ in stream:
            pass

    app.agent(topic, name=f"follow-{name}")(drop)
    return topic


def _header_list(headers: RawHeaders) -> list[tuple[str, bytes | None]]:
    if headers is None:
        return []
    if isinstance(headers, Mapping):
        return list(headers.items())
    return [(k, v) for k, v in headers]


class StagedWrites(MutableMapping[str, str]):
    """A table of JSON text as one event's processing sees it: reads see the table and this
    event's own writes, which are kept here until `FaustEvents.commit_writes` sends them with
    the event's commit. For code that reads and writes a mapping (a pure function's state)."""

    def __init__(self, table: faust.Table) -> None:
        self.table = table
        self.writes: dict[str, str] = {}

    def __getitem__(self, key: str) -> str:
        if key in self.writes:
            return self.writes[key]
        value = self.table.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: str, value: str) -> None:
        self.writes[key] = value

    def __delitem__(self, key: str) -> None:
        raise TypeError("entries of a staged table are replaced, never deleted")

    def __iter__(self) -> Iterator[str]:
        return iter({*self.table.keys(), *self.writes})

    def __len__(self) -> int:
        return len({*self.table.keys(), *self.writes})


class FaustEvents:
    """Decodes the records a faust agent gets and sends events the way every service does."""

    def __init__(self, app: faust.App, codec: EventCodec, settings: KafkaSettings) -> None:
        self.codec, self.settings = codec, settings
        self._letters: EventProducer | None = None
        self.dead_lettered = 0

    async def decode(self, event: EventT, kinds: tuple[type[Event], ...]) -> Event | None:
        """The event in `event`'s record, or None once it went to the dead-letter topic."""
        message = event.message
        try:
            return self.codec.decode(message.value, _header_list(message.headers), kinds)
        except EventDecodeError as exc:
            await self.set_aside(event, str(exc), "EventDecodeError")
            return None

    async def set_aside(self, event: EventT, reason: str, error_type: str) -> None:
        """Send `event`'s record to the dead-letter topic with `reason`."""
        message = event.message
        key = message.key
        letter = DeadLetter(
            origin_topic=message.topic, origin_partition=message.partition,
            origin_offset=message.offset, reason=reason, error_type=error_type,
            key=key.encode() if isinstance(key, str) else key, payload=message.value or b"",
            headers=[(k, v or b"") for k, v in _header_list(message.headers)],
        )  # fmt: skip
        self.dead_lettered += 1
        log.warning("set aside %s[%d]@%d: %s", message.topic, message.partition, message.offset,
                    reason)  # fmt: skip
        # Through a plain producer, at once and outside any transaction: faust routes a record
        # to a transactional producer by its topic's partition group, and dead.letters (one
        # partition, not followed) has none; a record read again after a kill is set aside
        # again, so a letter may repeat but is never lost.
        if self._letters is None:
            self._letters = EventProducer(self.settings, self.codec)
        self._letters.send(DEAD_LETTERS, letter, headers=dead_letter_headers(letter))
        self._letters.flush(DEAD_LETTER_FLUSH_S)

    async def send_with_commit(self, source: EventT, topic: TopicT, event: Event) -> None:
        """Send `event` on `topic` (a `transactional_output`) in the transaction that commits
        `source`'s offset: it is published when that offset is committed, never before, so a
        processor killed mid-event leaves nothing of it. The app must publish on commit
        (`make_app(..., stream_publish_on_commit=True)`)."""
        payload, headers = self.codec.encode(event)
        key = record_key(topic.get_topic_name(), event)
        await source.send(topic, key=key.encode() if key is not None else None, value=payload,
                          partition=source.message.partition, headers=headers)  # fmt: skip

    async def set_with_commit(
        self, source: EventT, table: faust.Table, key: str, value: str
    ) -> None:
        """`table[key] = value`, its changelog record sent like `send_with_commit`: in the
        transaction that commits `source`'s offset.

        A plain `table[key] = value` sends the record at once, into whichever transaction is
        open; while faust's committer is mid-commit of earlier offsets that is theirs. Killed
        before `source`'s own commit, a processor would then restart with the entry (a seed
        "done") but without the outputs that were to go out with it."""
        table.data[key] = value  # the local store only; the record goes out with the commit
        await source.send(table.changelog_topic, key=key, value=value,
                          partition=source.message.partition, key_serializer=table.key_serializer,
                          value_serializer=table.value_serializer)  # fmt: skip

    async def commit_writes(self, source: EventT, *staged: StagedWrites) -> None:
        """Each of `staged`'s writes to its table, with `source`'s commit (`set_with_commit`)."""
        for writes in staged:
            for key, value in writes.writes.items():
                await self.set_with_commit(source, writes.table, key, value)

    async def send(
        self, topic: TopicT, event: Event, headers: list[tuple[str, bytes]] | None = None
    ) -> None:
        """Send `event` (encoded, keyed as its topic keys it) now, outside any transaction,
        also in an app that publishes on commit (which would otherwise hold it until the
        offset of the event being processed commits); see `send_with_commit`."""
        payload, codec_headers = self.codec.encode(event)
        key = record_key(topic.get_topic_name(), event)
        await topic.send(
            key=key.encode() if key is not None else None,
            value=payload,
            headers=[*codec_headers, *(headers or [])],
            force=True,
        )


def run_worker(app: faust.App, log_level: str = "INFO") -> int:
    """Run `app` until SIGINT/SIGTERM (faust's worker stops its agents and commits); the exit
    status the worker ended with."""
    worker = faust.Worker(app, loglevel=log_level.lower(), quiet=True, redirect_stdouts=False)
    # faust's worker installs its own handlers for the root logger; keep ours.
    logging.getLogger("faust").setLevel(log_level.upper())
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:  # how the worker ends, also after a clean stop
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return 0


def exit_now(code: int) -> NoReturn:
    """End a processor's process with `code` at once. A stopped faust worker can leave a
    thread of aiokafka's behind that keeps the process alive after its event loop closed."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
