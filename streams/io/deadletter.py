"""Records that cannot be used are kept, whole, on the dead-letter topic with the reason."""

from __future__ import annotations

from confluent_kafka import Message

from asearcher.streams.wire.codec import Headers
from asearcher.streams.wire.events import DeadLetter

# Headers let a plain Kafka client see why a record is here without decoding the value.
REASON_HEADER = "dlq-reason"
ORIGIN_HEADER = "dlq-origin"
ERROR_TYPE_HEADER = "dlq-error-type"


def dead_letter_of(message: Message, reason: str, error_type: str) -> DeadLetter:
    """The envelope that keeps `message` and says why it was set aside."""
    key = message.key()
    return DeadLetter(
        origin_topic=message.topic() or "",
        origin_partition=message.partition() or 0,
        origin_offset=message.offset() or 0,
        reason=reason,
        error_type=error_type,
        key=key.encode() if isinstance(key, str) else key,
        payload=message.value(),
        headers=[(k, v or b"") for k, v in (message.headers() or [])],
    )


def dead_letter_headers(letter: DeadLetter) -> Headers:
    """The reason, origin and error type as record headers."""
    origin = f"{letter.origin_topic}[{letter.origin_partition}]@{letter.origin_offset}"
    return [
        (REASON_HEADER, letter.reason.encode()),
        (ORIGIN_HEADER, origin.encode()),
        (ERROR_TYPE_HEADER, letter.error_type.encode()),
    ]
