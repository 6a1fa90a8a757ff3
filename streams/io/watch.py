"""Following what services do: the events of some topics a job waits for, gathered as they come.

A job (an evaluation, a synthesis job, the RL phase of `learn`) sends work and then watches the
topics where its outcomes appear, each with a test that picks its own events out of everyone
else's. `TopicWatch` is that one mechanism: a tail per topic, the picked events kept in arrival
order, read from the job's thread while the tails' threads add to them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from functools import partial

from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.io.tail import StartAt, TopicTail
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import Event
from asearcher.streams.wire.records import Record

Pick = Callable[[Event], bool]


class TopicWatch:
    """The events of `picks`' topics that their test accepts, from `start_at` on."""

    def __init__(
        self,
        settings: KafkaSettings,
        codec: EventCodec,
        picks: Mapping[str, Pick],
        start_at: StartAt = "end",
    ) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, list[Event]] = {topic: [] for topic in picks}
        self._letters = EventProducer(settings, codec)  # where undecodable records go
        self._tails = [
            TopicTail(settings, codec, topic, partial(self._on_record, topic, pick),
                      self._letters, start_at)
            for topic, pick in picks.items()
        ]  # fmt: skip

    def _on_record(self, topic: str, pick: Pick, record: Record) -> None:
        if pick(record.event):
            with self._lock:
                self._events[topic].append(record.event)

    def events(self, topic: str, start: int = 0) -> list[Event]:
        """The picked events of `topic` so far, from the `start`-th on (a copy)."""
        with self._lock:
            return self._events[topic][start:]

    def count(self, topic: str) -> int:
        """How many events of `topic` were picked so far."""
        with self._lock:
            return len(self._events[topic])

    def caught_up(self, timeout: float) -> bool:
        """Wait until every tail has read what its topic held when it started; False on timeout."""
        deadline = time.monotonic() + timeout
        return all(
            tail.caught_up.wait(max(0.0, deadline - time.monotonic())) for tail in self._tails
        )

    def start(self) -> TopicWatch:
        """Start following (nothing written after this returns is missed)."""
        for tail in self._tails:
            tail.start()
        return self

    def stop(self) -> None:
        """Stop following; what was picked stays readable."""
        for tail in self._tails:
            tail.stop()
        self._letters.close()

    def __enter__(self) -> TopicWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
