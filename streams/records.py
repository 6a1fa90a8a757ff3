"""What a consume loop hands to a handler, and what a transform hands back."""

from __future__ import annotations

from dataclasses import dataclass, field

from asearcher.streams.events import Event


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
