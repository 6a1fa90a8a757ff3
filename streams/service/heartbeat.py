"""Service heartbeats on the compacted `service.status` topic: state, counters, why it waits.

`stream status` reads the newest heartbeat of every instance, so a user sees what each service
is doing and, when work is held back, the reason with counts, without reading log files.
"""

from __future__ import annotations

import os
import socket
import time

from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.events import ServiceStatus
from asearcher.streams.wire.topics import SERVICE_STATUS


class Heartbeat:
    """Sends a `ServiceStatus` at most every `every_s` seconds (and at once when forced)."""

    def __init__(
        self,
        producer: EventProducer,
        service: str,
        instance: str,
        *,
        topic: str = SERVICE_STATUS,
        every_s: float = 5.0,
    ) -> None:
        self.producer, self.service, self.instance = producer, service, instance
        self.topic, self.every_s = topic, every_s
        self._last_sent = float("-inf")

    def beat(
        self,
        *,
        state: str = "running",
        waiting_for: str = "",
        version: int = -1,
        counters: dict[str, float] | None = None,
        force: bool = False,
    ) -> bool:
        """Send a heartbeat if one is due (or `force`); True if one went out."""
        now = time.monotonic()
        if not force and now - self._last_sent < self.every_s:
            return False
        self._last_sent = now
        self.producer.send(
            self.topic,
            ServiceStatus(
                service=self.service, instance=self.instance, state=state,
                waiting_for=waiting_for, version=version, counters=dict(counters or {}),
                pid=os.getpid(), host=socket.gethostname(),
            ),
        )  # fmt: skip
        return True
