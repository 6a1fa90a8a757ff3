"""Requests once by identity: which requests a consumer group has played, per partition.

A request sent twice (a producer's retry, a re-drive by `replay`, a synthesis seed sent again)
is two records with the same identity (a rollout's group id, a seed's id) and, keyed by it, in
the same partition. The member that plays the first writes a `RequestPlayed` marker in the
transaction of its outputs, onto the compacted `requests.played`; whoever owns the partition
later (the same member restarted, another replica) reloads the markers of its partitions on
assignment, after the committed offsets, which Kafka only hands out once the previous owner's
transaction is settled. So the decision is as durable as the group it guards, and a second
copy is finished unplayed and counted.
"""

from __future__ import annotations

from collections.abc import Iterable

from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.tail import read_to_end
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import RequestPlayed, RolloutRequested, SynthesisRequested
from asearcher.streams.wire.records import Outgoing, Record


def request_identity(record: Record) -> str | None:
    """What makes two records the same request (a rollout's group id, a synthesis seed's id),
    or None (never deduplicated)."""
    event = record.event
    if isinstance(event, RolloutRequested):
        return event.group_id
    return event.seed_id if isinstance(event, SynthesisRequested) else None


class PlayedRequests:
    """The played identities of the partitions one member owns, and those handed out now."""

    def __init__(
        self,
        settings: KafkaSettings,
        codec: EventCodec,
        *,
        consumer_group: str,
        topic: str,
        played_topic: str,
    ) -> None:
        self._settings, self._codec = settings, codec
        self.consumer_group, self.topic, self.played_topic = consumer_group, topic, played_topic
        self._played: dict[int, set[str]] = {}  # partition -> identities played
        self._handed_out: dict[str, tuple[int, int]] = {}  # identity -> (partition, offset)
        self.duplicates = 0

    def load(self, partitions: Iterable[int]) -> None:
        """Read the markers of `partitions` (newly assigned) from the played topic."""
        wanted = {number: set[str]() for number in partitions}
        for record in read_to_end(self._settings, self._codec, self.played_topic):
            marker = record.event
            if (
                isinstance(marker, RequestPlayed)
                and marker.consumer_group == self.consumer_group
                and marker.topic == self.topic
                and marker.partition in wanted
            ):
                wanted[marker.partition].add(marker.request_id)
        self._played.update(wanted)

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop what is known of `partitions` (revoked: their next owner reloads it)."""
        for number in partitions:
            self._played.pop(number, None)
        self._handed_out = {
            identity: where
            for identity, where in self._handed_out.items()
            if where[0] in self._played
        }

    def is_copy(self, record: Record) -> bool:
        """True if `record` repeats a request played or handed out from another offset;
        otherwise it is noted as handed out."""
        identity = request_identity(record)
        if identity is None:
            return False
        if identity in self._played.get(record.partition, ()):
            self.duplicates += 1
            return True
        where = self._handed_out.setdefault(identity, (record.partition, record.offset))
        if where != (record.partition, record.offset):
            self.duplicates += 1
            return True
        return False

    def markers(self, records: Iterable[Record]) -> list[Outgoing]:
        """The markers saying `records` were played, to send in their transaction."""
        return [
            Outgoing(
                self.played_topic,
                RequestPlayed(
                    consumer_group=self.consumer_group,
                    topic=self.topic,
                    partition=record.partition,
                    offset=record.offset,
                    request_id=identity,
                ),
            )  # fmt: skip
            for record in records
            if (identity := request_identity(record)) is not None
        ]

    def settled(self, records: Iterable[Record], played: bool) -> None:
        """`records`' transaction committed: played ones are remembered, others released (a
        request set aside unplayed may be re-driven and played later)."""
        for record in records:
            identity = request_identity(record)
            if identity is None:
                continue
            self._handed_out.pop(identity, None)
            if played and record.partition in self._played:
                self._played[record.partition].add(identity)
