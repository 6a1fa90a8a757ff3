"""Packed number arrays for events: token ids as int32, log-probs as float32, little-endian.

A `GenerationStep` of 256 tokens carries 512 numbers. As MessagePack arrays every number is a
Python object to build on decode (about 10 µs per event, the bus's bottleneck); packed, the
decoder copies one buffer. On the wire a packed array is MessagePack `bin` (raw little-endian
bytes) or, in JSON, a base64 string; readers also take a plain array of numbers, so events
written before packing (schema version 1) and events other clients write by hand still decode.
In Python a packed array is an `array.array` that compares equal to the list of its values and
concatenates with lists into lists.
"""

from __future__ import annotations

import array
import base64
import sys
from collections.abc import Iterable
from typing import Any, ClassVar

_SWAP = sys.byteorder != "little"  # the wire is little-endian whatever the host


class Packed(array.array):
    """Numbers of one C type in one buffer; subclasses fix the type."""

    typecode_: ClassVar[str]
    wire_type: ClassVar[str]  # what the JSON Schema says an element is
    description: ClassVar[str]

    def __new__(cls, values: Iterable[Any] = ()) -> Packed:
        return super().__new__(cls, cls.typecode_, values)  # type: ignore[call-arg]

    @classmethod
    def from_wire(cls, raw: bytes) -> Packed:
        packed = cls()
        packed.frombytes(raw)
        if _SWAP:
            packed.byteswap()
        return packed

    def to_wire(self) -> bytes:
        if not _SWAP:
            return self.tobytes()
        swapped = type(self)(self)
        swapped.byteswap()
        return swapped.tobytes()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, list | tuple):
            return len(self) == len(other) and self.tolist() == list(other)
        return super().__eq__(other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    # Mixed with lists as token ids always were: `context + step.token_ids` is a list.
    def __add__(self, other: Any) -> Any:
        if isinstance(other, list):
            return self.tolist() + other
        return super().__add__(other)

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, list):
            return other + self.tolist()
        return NotImplemented

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.tolist()!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.tolist(),)


class Int32s(Packed):
    """Token ids: int32, little-endian."""

    typecode_ = "i"
    wire_type = "integer"
    description = "int32 values, packed little-endian (MessagePack bin; base64 in JSON)"


class Float32s(Packed):
    """Log-probs: float32, little-endian."""

    typecode_ = "f"
    wire_type = "number"
    description = "float32 values, packed little-endian (MessagePack bin; base64 in JSON)"


def enc_hook(value: Any) -> Any:
    """msgspec encoders: a packed array goes out as its bytes (`bin`, or base64 in JSON)."""
    if isinstance(value, Packed):
        return value.to_wire()
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


def as_list(value: Any) -> Any:
    """msgspec encoders for people (exported JSON lines): a packed array as its numbers."""
    if isinstance(value, Packed):
        return value.tolist()
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


def dec_hook(kind: type, value: Any) -> Any:
    """msgspec decoders: bytes, a base64 string or a plain array of numbers into `kind`."""
    if isinstance(kind, type) and issubclass(kind, Packed):
        if isinstance(value, bytes):
            return _sized(kind, value)
        if isinstance(value, str):
            try:
                return _sized(kind, base64.b64decode(value, validate=True))
            except ValueError as exc:
                raise ValueError(f"not base64: {exc}") from exc
        if isinstance(value, list):
            try:
                return kind(value)
            except (TypeError, OverflowError) as exc:
                raise ValueError(f"not {kind.wire_type}s of {kind.description[:7]}: {exc}") from exc
        # A ValueError, so msgspec reports a bad record rather than crashing its reader.
        raise ValueError(f"expected packed bytes or an array, got {type(value).__name__}")
    raise NotImplementedError(f"cannot decode {kind!r}")


def _sized(kind: type[Packed], raw: bytes) -> Packed:
    width = array.array(kind.typecode_).itemsize
    if len(raw) % width:
        raise ValueError(f"{len(raw)} bytes is not a whole number of {width}-byte values")
    return kind.from_wire(raw)


def schema_hook(kind: type) -> dict[str, Any]:
    """msgspec JSON Schema: a packed array is a base64 string, or a plain array of numbers."""
    if isinstance(kind, type) and issubclass(kind, Packed):
        return {
            "description": kind.description,
            "anyOf": [
                {"type": "string", "contentEncoding": "base64"},
                {"type": "array", "items": {"type": kind.wire_type}},
            ],
        }
    raise NotImplementedError(f"no schema for {kind!r}")
