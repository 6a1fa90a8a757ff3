"""Live weight updates: follow the compacted `weights` topic and load each new version.

The follower reads the topic from the beginning (compaction keeps the newest event per model),
so a producer that starts late still learns the current trainer version. The engine loads a new
version between generate calls; a version that fails its checksum is logged and skipped, and
the engine keeps generating with the weights it has.
"""

from __future__ import annotations

import asyncio
import time

from asearcher.producers.engine import InferenceEngine
from asearcher.streams.codec import EventCodec
from asearcher.streams.events import WeightsPublished
from asearcher.streams.log import get_logger
from asearcher.streams.producer import EventProducer
from asearcher.streams.records import Record
from asearcher.streams.settings import KafkaSettings
from asearcher.streams.tail import TopicTail
from asearcher.streams.topics import WEIGHTS

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
    ) -> None:
        self.model = model
        self.latest: WeightsPublished | None = None
        self.failed_loads = 0
        self.load_seconds: list[float] = []
        self.loaded_at: dict[int, float] = {}  # version -> wall-clock time its load finished
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
        if self.latest is None or event.version > self.latest.version:
            self.latest = event
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._changed.set)

    def stop(self) -> None:
        """Stop following the topic."""
        self._tail.stop()
