"""What a consume loop hands to a handler, and what a transform hands back."""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka import Message

from asearcher.streams.wire.events import Event


@dataclass(frozen=True, slots=True)
class Record:
    """A decoded event with where it came from."""

    event: Event
    topic: str
    partition: int
    offset: int
    key: str | None
    timestamp_ms: int
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)

    @classmethod
    def of(cls, message: Message, event: Event) -> Record:
        """The record for a consumed `message` whose value decoded to `event`."""
        key = message.key()
        return cls(
            event=event,
            topic=message.topic() or "",
            partition=message.partition() or 0,
            offset=message.offset() or 0,
            key=key.decode("utf-8", "replace") if isinstance(key, bytes) else key,
            timestamp_ms=message.timestamp()[1],
            headers=message.headers() or [],
        )

    @property
    def origin(self) -> str:
        """`topic[partition]@offset`, for logs."""
        return f"{self.topic}[{self.partition}]@{self.offset}"


@dataclass(frozen=True, slots=True)
class Outgoing:
    """An event to produce; the key defaults to the one the topic spec derives from the event."""

    topic: str
    event: Event
    key: str | None = None
