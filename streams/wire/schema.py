"""JSON Schema of every event and a description of every topic, for clients in any language."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from asearcher.streams.io.deadletter import ERROR_TYPE_HEADER, ORIGIN_HEADER, REASON_HEADER
from asearcher.streams.wire.codec import CONTENT_TYPES, DEFAULT_WIRE_FORMAT
from asearcher.streams.wire.events import EVENT_TYPES, Event
from asearcher.streams.wire.packed import schema_hook
from asearcher.streams.wire.topics import TOPICS


def event_schema(event_type: type[Event]) -> dict:
    """The JSON Schema (2020-12) of one event kind, self-contained."""
    schema = msgspec.json.schema(event_type, schema_hook=schema_hook)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = event_type.kind()
    schema["x-schema-version"] = event_type.SCHEMA_VERSION
    return schema


def topics_manifest() -> dict:
    """What each topic holds and how its records are laid out on the wire."""
    return {
        "wire_format": {
            "content_type_header": "content-type",
            "producers_write": CONTENT_TYPES[DEFAULT_WIRE_FORMAT],
            "readers_accept": sorted(CONTENT_TYPES.values()),
            "headers": ["kind", "schema-version", "content-type", "claim-check (when claimed)"],
            "claim_check": "a ClaimCheck event stands in for a large event; fetch `uri`, check "
            "`sha256`, decode with `content_type`",
            "dead_letter_headers": [REASON_HEADER, ORIGIN_HEADER, ERROR_TYPE_HEADER],
        },
        "topics": [
            {
                "name": spec.name,
                "partitions": spec.partitions,
                "key": spec.key_field,
                "kinds": [t.kind() for t in spec.event_types],
                "compacted": spec.compacted,
                "description": spec.description,
            }
            for spec in TOPICS
        ],
    }


def export_schemas(out_dir: Path) -> list[Path]:
    """Write `<Kind>.schema.json` for every event and `topics.json`; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for event_type in EVENT_TYPES:
        path = out_dir / f"{event_type.kind()}.schema.json"
        path.write_text(json.dumps(event_schema(event_type), indent=2) + "\n")
        written.append(path)
    manifest = out_dir / "topics.json"
    manifest.write_text(json.dumps(topics_manifest(), indent=2) + "\n")
    written.append(manifest)
    return written
