"""Live weight updates: follow the compacted `weights` topic and load each new version.

The follower reads the topic from the beginning (compaction keeps the newest event per model),
so a producer that starts late still learns the current trainer version. The engine loads a new
version between generate calls; a version that fails its checksum is logged and skipped, and
the engine keeps generating with the weights it has.

Anyone who can write the topic can announce anything, so an announcement is believed only
if it is in the trainer's chain in the configured weight store (`VersionChain`: this store's own
directory for the version, a manifest with the announced hash, version, parent and step, signed
when a key is set, and the version after the last one believed or one the store marks as
announced). A refused announcement is logged, counted and dead-lettered, and changes nothing:
neither the version loaded nor the trainer version staleness is counted from. Tombstones are
dead-lettered by the decoder.
"""

from __future__ import annotations

import asyncio
import time

from asearcher.producers.engines.base import InferenceEngine
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.deadletter import dead_letter_headers
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.io.tail import TopicTail
from asearcher.streams.service.log import get_logger
from asearcher.streams.storage.weight_reader import (
    VersionChain,
    WeightStoreError,
    WeightStoreReader,
    resolve_store_url,
)
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import DeadLetter, WeightsPublished
from asearcher.streams.wire.records import Record
from asearcher.streams.wire.topics import DEAD_LETTERS, WEIGHTS

log = get_logger(__name__)


class WeightsFollower:
    """Knows the newest published version of one model and keeps an engine on it."""

    def __init__(
        self,
        settings: KafkaSettings,
        codec: EventCodec,
        dead_letters: EventProducer,
        *,
        model: str = "policy",
        topic: str = WEIGHTS,
        store: WeightStoreReader | None = None,
    ) -> None:
        """`store` is where the trainer publishes; by default $ASEARCHER_WEIGHT_STORE or the
        state directory's, as for the trainer."""
        self.model = model
        self.store = store or WeightStoreReader(resolve_store_url())
        self.latest: WeightsPublished | None = None
        self.refused = 0  # announcements not believed (each one dead-lettered)
        self.failed_loads = 0
        self.load_seconds: list[float] = []
        self.loaded_at: dict[int, float] = {}  # version -> wall-clock time its load finished
        self._chain = VersionChain(self.store, model)
        self._codec, self._dead_letters = codec, dead_letters
        self._tail = TopicTail(settings, codec, topic, self._on_record, dead_letters, "beginning")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()

    def start(self) -> None:
        """Start following; call from the event loop that runs `keep_current`."""
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()  # bound to this loop, which may be a new one
        self._tail.start()

    def trainer_version(self, default: int) -> int:
        """The newest published version, or `default` before anything was published."""
        return self.latest.version if self.latest is not None else default

    async def changed(self) -> None:
        """Wait until a newer version is announced."""
        await self._changed.wait()
        self._changed.clear()

    async def keep_current(self, engine: InferenceEngine) -> None:
        """Load every newer version into `engine`, until cancelled."""
        while True:
            latest = self.latest
            if latest is not None and latest.version > engine.version:
                await self.load(engine, latest)
            await self.changed()

    def caught_up(self) -> bool:
        """Whether every version announced before `start()` has been read."""
        return self._tail.caught_up.is_set()

    async def load(self, engine: InferenceEngine, event: WeightsPublished) -> None:
        """Load `event`'s version into `engine`; a failure is logged and counted."""
        started = time.perf_counter()
        try:
            await engine.load_weights(event.uri, event.version, event.sha256)
        except Exception as exc:  # a bad version must not stop rollouts on the good one
            self.failed_loads += 1
            log.error("could not load v%d from %s: %s", event.version, event.uri, exc)
            return
        self.load_seconds.append(time.perf_counter() - started)
        self.loaded_at[event.version] = time.time()
        log.info("loaded %s v%d in %.2f s", self.model, event.version, self.load_seconds[-1])

    def _on_record(self, record: Record) -> None:
        event = record.event
        if not isinstance(event, WeightsPublished) or event.model != self.model:
            return
        try:
            newer = self._chain.admit(event.version, event.uri, event.sha256, event.step)
        except WeightStoreError as exc:
            self._refuse(record, str(exc))
            return
        if newer:
            self.latest = event
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._changed.set)

    def _refuse(self, record: Record, reason: str) -> None:
        """Log, count and dead-letter an announcement that is not believed."""
        self.refused += 1
        # Re-encoded (the tail keeps events, not bytes): the headers are those of the new payload.
        payload, headers = self._codec.encode(record.event)
        letter = DeadLetter(
            origin_topic=record.topic, origin_partition=record.partition,
            origin_offset=record.offset, reason=f"refused announcement: {reason}",
            error_type="RefusedAnnouncement", key=record.key.encode() if record.key else None,
            payload=payload, headers=[(k, v or b"") for k, v in headers],
        )  # fmt: skip
        log.warning("not loading: %s", letter.summary())
        self._dead_letters.send(DEAD_LETTERS, letter, headers=dead_letter_headers(letter))

    def stop(self) -> None:
        """Stop following the topic."""
        self._tail.stop()
