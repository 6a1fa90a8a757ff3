"""`GenerationStep` number arrays travel packed, other clients can read them, and steps written
before packing (plain arrays, schema version 1) still decode."""

from __future__ import annotations

import base64
import json
import pickle
import random
import struct

import msgspec
import pytest

from asearcher.streams.io.replay import export_jsonl, load_jsonl
from asearcher.streams.wire.codec import EventCodec, EventDecodeError
from asearcher.streams.wire.events import GenerationStep
from asearcher.streams.wire.packed import Float32s, Int32s
from asearcher.streams.wire.records import Record
from tests.support.samples import generation_step


def step(tokens: int = 5) -> GenerationStep:
    return GenerationStep(
        trajectory_id="t1",
        turn=1,
        token_ids=list(range(100, 100 + tokens)),
        logprobs=[-0.25 * (i + 1) for i in range(tokens)],
        policy_version=3,
        context_token_ids=[7, 8],
    )


def test_lists_given_to_the_constructor_are_packed_and_still_compare_as_lists() -> None:
    event = step()
    assert isinstance(event.token_ids, Int32s) and isinstance(event.logprobs, Float32s)
    assert event.token_ids == [100, 101, 102, 103, 104] and event.token_ids != [100, 101]
    assert event.logprobs == [-0.25, -0.5, -0.75, -1.0, -1.25]
    assert pickle.loads(pickle.dumps(event.token_ids)) == event.token_ids
    assert [1] + event.context_token_ids + [9] == [1, 7, 8, 9]  # lists, as before packing


def test_msgpack_carries_raw_little_endian_bytes_another_client_can_unpack() -> None:
    value, _ = EventCodec().encode(step())
    raw = msgspec.msgpack.decode(value)  # what a client with no knowledge of our types sees
    assert isinstance(raw["token_ids"], bytes) and len(raw["token_ids"]) == 5 * 4
    assert list(struct.unpack("<5i", raw["token_ids"])) == [100, 101, 102, 103, 104]
    assert list(struct.unpack("<5f", raw["logprobs"])) == [-0.25, -0.5, -0.75, -1.0, -1.25]
    assert raw["schema_version"] == 2


def test_json_carries_base64_and_both_formats_round_trip() -> None:
    event = step()
    value, headers = EventCodec(wire_format="json").encode(event)
    document = json.loads(value)
    assert struct.unpack("<2i", base64.b64decode(document["context_token_ids"])) == (7, 8)
    for wire_format in ("json", "msgpack"):
        codec = EventCodec(wire_format=wire_format)
        assert codec.decode(*codec.encode(event), (GenerationStep,)) == event


@pytest.mark.parametrize("wire_format", ["msgpack", "json"])
def test_a_version_1_step_with_plain_arrays_still_decodes(wire_format: str) -> None:
    document = {
        "kind": "GenerationStep", "schema_version": 1, "trajectory_id": "t0", "turn": 0,
        "token_ids": [5, 6, 7], "logprobs": [-0.5, -1.0, -2.0], "policy_version": 0,
    }  # fmt: skip
    encode = msgspec.msgpack.encode if wire_format == "msgpack" else msgspec.json.encode
    codec = EventCodec(wire_format=wire_format)
    decoded = codec.decode(encode(document), codec.headers_for(step()), (GenerationStep,))
    assert decoded.token_ids == [5, 6, 7] and decoded.logprobs == [-0.5, -1.0, -2.0]
    assert decoded.context_token_ids == [] and decoded.schema_version == 1


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("token_ids", b"\x01\x02\x03", "not a whole number of 4-byte values"),
        ("token_ids", [1, 2**40], "token_ids"),
        ("logprobs", ["x"], "logprobs"),
        ("token_ids", None, "expected packed bytes or an array"),
        ("token_ids", 7, "expected packed bytes or an array"),
    ],
)
def test_arrays_that_cannot_be_unpacked_are_decode_errors(field, value, reason) -> None:
    document = msgspec.msgpack.decode(EventCodec().encode(step())[0])
    document[field] = value
    with pytest.raises(EventDecodeError, match=reason):
        EventCodec().decode(msgspec.msgpack.encode(document), [], (GenerationStep,))


def test_bad_base64_in_json_is_a_decode_error() -> None:
    codec = EventCodec(wire_format="json")
    document = json.loads(codec.encode(step())[0])
    document["token_ids"] = "not base64!"
    with pytest.raises(EventDecodeError, match="base64"):
        codec.decode(json.dumps(document).encode(), [], (GenerationStep,))


def test_exported_json_lines_show_numbers_and_load_back(tmp_path) -> None:
    event = generation_step(random.Random(3), tokens=4)
    record = Record(event, "rollout.steps", partition=0, offset=9, key=None, timestamp_ms=1)
    url = str(tmp_path / "steps.jsonl")
    assert export_jsonl([record], url) == 1
    line = json.loads((tmp_path / "steps.jsonl").read_text())
    assert line["event"]["token_ids"] == event.token_ids.tolist()
    (loaded,) = load_jsonl(url)
    assert loaded.event == event
