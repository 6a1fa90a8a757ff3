"""A claim-check reference is untrusted: it is read only under the claims root, up to its size.

Every probe is a `ClaimCheck` record followed by a good record on a private topic. The probe must
end on the dead-letter topic with a reason, and the consume loop must go on to the good record.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import msgspec
import pytest

from asearcher.streams.io.consumer import EventConsumer
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.storage.claimcheck import ClaimCheckStore
from asearcher.streams.wire.codec import EventCodec, EventDecodeError
from asearcher.streams.wire.events import ClaimCheck, DeadLetter, ToolCallRequested
from asearcher.streams.wire.topics import DEAD_LETTERS
from tests.conftest import read_raw

OUTSIDE = "claim check outside the claims store"
GOOD = ToolCallRequested(call_id="good", trajectory_id="t", tool="search")
# What a probe points at when it points at something readable: a valid event, so only the
# location (not a decode failure) can make the record dead.
CLAIMED = ToolCallRequested(call_id="claimed", trajectory_id="t", tool="search")
PAYLOAD = msgspec.msgpack.encode(CLAIMED)


class Loopback:
    """An HTTP server on 127.0.0.1 that serves PAYLOAD and counts who asked."""

    def __init__(self) -> None:
        self.hits = 0
        loopback = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server naming
                loopback.hits += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(PAYLOAD)))
                self.end_headers()
                self.wfile.write(PAYLOAD)

            def do_HEAD(self) -> None:  # noqa: N802
                loopback.hits += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(PAYLOAD)))
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Scene:
    """Where probes point: the store, its root directory and URL, a place outside it."""

    claims: ClaimCheckStore
    root: Path
    outside: Path
    loopback: Loopback

    @property
    def root_url(self) -> str:
        return self.claims.base_url


@pytest.fixture
def scene(claims: ClaimCheckStore, tmp_path: Path) -> Iterator[Scene]:
    root = tmp_path / "claims"  # where the `claims` fixture keeps its store
    root.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(PAYLOAD)
    loopback = Loopback()
    yield Scene(claims, root, outside, loopback)
    loopback.close()


def ref(uri: str, payload: bytes = PAYLOAD, **changes: object) -> ClaimCheck:
    fields = {
        "uri": uri,
        "sha256": hashlib.sha256(payload).hexdigest(),
        "size": len(payload),
        "content_type": "application/msgpack",
        "original_kind": "ToolCallRequested",
        **changes,
    }
    return ClaimCheck(**fields)


def fifo(where: Path) -> Path:
    where.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(where)
    return where


def stored(scene: Scene) -> ClaimCheck:
    return scene.claims.put(PAYLOAD, "application/msgpack", "ToolCallRequested")


PROBES: dict[str, tuple[Callable[[Scene], ClaimCheck], str]] = {
    "gopher": (lambda s: ref("gopher://127.0.0.1:70/1/claims"), OUTSIDE),
    "dev-zero": (lambda s: ref("file:///dev/zero", size=1 << 20), OUTSIDE),
    "fifo-outside": (lambda s: ref(fifo(s.outside / "pipe").as_uri()), OUTSIDE),
    "http-loopback": (lambda s: ref(f"{s.loopback.url}/claims/{PAYLOAD.hex()[:8]}"), OUTSIDE),
    "file-outside": (lambda s: ref((s.outside / "secret").as_uri()), OUTSIDE),
    "missing-outside": (lambda s: ref((s.outside / "absent").as_uri()), OUTSIDE),
    "directory-outside": (lambda s: ref(s.outside.as_uri()), OUTSIDE),
    "dot-dot": (lambda s: ref(f"{s.root_url}/../outside/secret"), OUTSIDE),
    "nested-dot-dot": (lambda s: ref(f"{s.root_url}/ab/../../outside/secret"), OUTSIDE),
    "other-protocol": (lambda s: ref(f"memory://{s.root}/ab/cd"), OUTSIDE),
    "root-itself": (lambda s: ref(s.root_url), OUTSIDE),
    "sibling-prefix": (lambda s: ref(f"{s.root_url}-evil/secret"), OUTSIDE),
    "fifo-inside": (lambda s: ref(fifo(s.root / "ab" / "pipe").as_uri()), "not a regular file"),
    "size-smaller": (lambda s: msgspec.structs.replace(stored(s), size=len(PAYLOAD) - 1), "size"),
    "size-over-limit": (lambda s: msgspec.structs.replace(stored(s), size=1 << 62), "limit"),
    "wrong-checksum": (lambda s: msgspec.structs.replace(stored(s), sha256="0" * 64), "checksum"),
}


def dead_letter_for(settings, topic: str) -> DeadLetter:
    [letter] = [
        letter
        for message in read_raw(settings, DEAD_LETTERS)
        if (letter := EventCodec().decode(message.value(), message.headers(), (DeadLetter,)))
        and letter.origin_topic == topic
    ]
    return letter


def consume(settings, codec: EventCodec, topic: str, group: str, **limits) -> tuple:
    handled: list[str] = []
    with EventConsumer(settings, group, [topic], codec) as consumer:
        stats = consumer.run(lambda r: handled.append(r.event.call_id), **limits)
    return stats, handled


@pytest.mark.timeout(90)  # a FIFO that blocks the reader fails the test instead of hanging it
@pytest.mark.parametrize("probe", list(PROBES))
def test_claim_check_probe_is_dead_lettered_and_the_loop_handles_the_next_record(
    settings, make_topic, scene: Scene, codec: EventCodec, probe: str
) -> None:
    build, reason = PROBES[probe]
    topic = make_topic()
    with EventProducer(settings, codec) as producer:
        producer.send(topic, build(scene), key="t")
        producer.send(topic, GOOD)
    stats, handled = consume(
        settings, codec, topic, f"probe-{time.time_ns()}", max_messages=2, timeout=30
    )
    assert (stats.dead_lettered, stats.handled, handled) == (1, 1, ["good"])
    letter = dead_letter_for(settings, topic)
    assert letter.error_type == "EventDecodeError"
    if reason == OUTSIDE:
        # One reason for everything outside: nothing about other paths may be learned.
        assert letter.reason == OUTSIDE
    else:
        assert reason in letter.reason
    assert scene.loopback.hits == 0


def test_claim_check_probe_after_restart_is_not_seen_again(
    settings, make_topic, codec: EventCodec
) -> None:
    topic, group = make_topic(), f"restart-{time.time_ns()}"
    with EventProducer(settings, codec) as producer:
        producer.send(topic, ref("gopher://127.0.0.1:70/1/claims"), key="t")
        producer.send(topic, GOOD)
    first, _ = consume(settings, codec, topic, group, max_messages=2, timeout=30)
    again, handled = consume(settings, codec, topic, group, timeout=5)
    assert (first.dead_lettered, first.handled) == (1, 1)
    assert (again.total, handled) == (0, [])


def small_store(tmp_path: Path) -> ClaimCheckStore:
    return ClaimCheckStore((tmp_path / "c").as_uri(), threshold_bytes=16, max_bytes=256)


def test_claim_check_store_with_a_small_limit_refuses_larger_declared_sizes(
    tmp_path: Path,
) -> None:
    store = small_store(tmp_path)
    codec = EventCodec(store)
    reference = store.put(PAYLOAD, "application/msgpack", "ToolCallRequested")
    assert codec.decode(codec._encoder.encode(reference), [], (ToolCallRequested,)) == CLAIMED
    too_big = msgspec.structs.replace(reference, size=257)
    with pytest.raises(EventDecodeError, match="limit of 256"):
        codec.decode(codec._encoder.encode(too_big), [], (ToolCallRequested,))


def test_claim_check_store_put_over_its_limit_refuses_to_write(tmp_path: Path) -> None:
    codec = EventCodec(small_store(tmp_path))
    with pytest.raises(ValueError, match="limit of 256"):
        codec.encode(ToolCallRequested(call_id="x" * 300, trajectory_id="t", tool="search"))
    assert not list((tmp_path / "c").rglob("*"))  # readers would refuse it: nothing written
