"""Bytes on the wire: event encoding, the headers that describe it, and the claim check.

Producers write MessagePack (measured faster and smaller than JSON for token arrays, see the
README). Readers also accept JSON, chosen by the `content-type` header, so a third-party client
such as kcat can produce events by hand. Every record carries headers naming its kind, schema
version and content type, so a reader can filter without decoding the value.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache, partial
from typing import Literal, Union

import msgspec

from asearcher.streams.storage.claimcheck import ClaimCheckError, ClaimCheckStore, ClaimCheckStores
from asearcher.streams.wire.events import ClaimCheck, Event, S
from asearcher.streams.wire.packed import dec_hook, enc_hook

WireFormat = Literal["msgpack", "json"]
CONTENT_TYPES: dict[str, str] = {"msgpack": "application/msgpack", "json": "application/json"}
FORMATS_BY_CONTENT_TYPE = {v: k for k, v in CONTENT_TYPES.items()}
_FORMATS_BY_HEADER = {v.encode(): k for k, v in CONTENT_TYPES.items()}
DEFAULT_WIRE_FORMAT: WireFormat = "msgpack"

Headers = list[tuple[str, bytes]]


class EventDecodeError(Exception):
    """A record that cannot become an event of its topic; the message is the reason."""


def header_value(headers: Sequence[tuple[str, bytes | None]] | None, name: str) -> str | None:
    """The last value of header `name` as text, or None."""
    for key, value in reversed(headers or ()):
        if key == name and value is not None:
            return value.decode("utf-8", "replace")
    return None


@cache
def _decoders(event_types: tuple[type[Event], ...]) -> dict[str, msgspec.msgpack.Decoder]:
    union = Union[(*event_types, ClaimCheck)]  # noqa: UP007 - a runtime union of a tuple
    return {
        "msgpack": msgspec.msgpack.Decoder(union, dec_hook=dec_hook),
        "json": msgspec.json.Decoder(union, dec_hook=dec_hook),
    }


def _decode_as(wire_format: str, value: bytes, struct: type[S]) -> S:
    """`value` decoded as `struct` (its fields only), for an event read at an older version."""
    decode = msgspec.json.decode if wire_format == "json" else msgspec.msgpack.decode
    return decode(value, type=struct, dec_hook=dec_hook)


class EventCodec:
    """Encodes events for one wire format and decodes either format, resolving claim checks."""

    def __init__(
        self,
        claims: ClaimCheckStore | ClaimCheckStores | None = None,
        wire_format: WireFormat = DEFAULT_WIRE_FORMAT,
    ) -> None:
        if wire_format not in CONTENT_TYPES:
            raise ValueError(
                f"wire_format must be one of {sorted(CONTENT_TYPES)}, not {wire_format!r}"
            )
        self.claims = claims
        self.wire_format = wire_format
        self.content_type = CONTENT_TYPES[wire_format]
        encoder = msgspec.msgpack.Encoder if wire_format == "msgpack" else msgspec.json.Encoder
        self._encoder = encoder(enc_hook=enc_hook)

    def encode(self, event: Event) -> tuple[bytes, Headers]:
        """The record value and headers for `event`, claim-checked when too large."""
        payload = self._encoder.encode(event)
        headers = self.headers_for(event)
        if self.claims is not None and self.claims.needs_claim(payload):
            ref = self.claims.put(payload, self.content_type, event.kind())
            headers.append(("claim-check", ref.uri.encode()))
            return self._encoder.encode(ref), headers
        return payload, headers

    def headers_for(self, event: Event) -> Headers:
        """The descriptive headers every record carries."""
        return [
            ("kind", event.kind().encode()),
            ("schema-version", str(event.schema_version).encode()),
            ("content-type", self.content_type.encode()),
        ]

    def decode(
        self,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] | None,
        event_types: tuple[type[Event], ...],
    ) -> Event:
        """The event in a record; raises `EventDecodeError` with the reason when impossible."""
        if value is None:
            raise EventDecodeError("record has no value (tombstone)")
        event = self._decode_value(value, self._format_of(headers), event_types)
        if isinstance(event, ClaimCheck):
            event = self._resolve(event, event_types)
        if event.schema_version > event.SCHEMA_VERSION:
            raise EventDecodeError(
                f"{event.kind()} schema version {event.schema_version} is newer than the "
                f"supported version {event.SCHEMA_VERSION}"
            )
        return event

    def _format_of(self, headers: Sequence[tuple[str, bytes | None]] | None) -> str:
        for key, value in headers or ():
            # The hot path: our own producers write exactly these header values.
            if key == "content-type" and value in _FORMATS_BY_HEADER:
                return _FORMATS_BY_HEADER[value]
        content_type = header_value(headers, "content-type")
        if content_type is None:
            return self.wire_format
        wire_format = FORMATS_BY_CONTENT_TYPE.get(content_type.split(";")[0].strip())
        if wire_format is None:
            raise EventDecodeError(f"unsupported content-type {content_type!r}")
        return wire_format

    def _decode_value(
        self, value: bytes, wire_format: str, event_types: tuple[type[Event], ...]
    ) -> Event:
        try:
            event = _decoders(event_types)[wire_format].decode(value)
            if event.schema_version < event.SCHEMA_VERSION:
                event = event.upgraded(partial(_decode_as, wire_format, value))
        except msgspec.DecodeError as exc:
            kinds = ", ".join(t.kind() for t in event_types)
            raise EventDecodeError(f"not a valid {wire_format} event of [{kinds}]: {exc}") from exc
        return event

    def _resolve(self, ref: ClaimCheck, event_types: tuple[type[Event], ...]) -> Event:
        if self.claims is None:
            raise EventDecodeError(f"claim check {ref.uri} but no claim-check store configured")
        try:
            payload = self.claims.get(ref)
        except (ClaimCheckError, OSError) as exc:
            raise EventDecodeError(str(exc)) from exc
        event = self._decode_value(
            payload, FORMATS_BY_CONTENT_TYPE.get(ref.content_type, "msgpack"), event_types
        )
        if isinstance(event, ClaimCheck):
            raise EventDecodeError(f"claim check {ref.uri} points at another claim check")
        return event
