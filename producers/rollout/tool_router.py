"""Tool calls through Kafka: send `ToolCallRequested`, await the matching `ToolResultReady`.

Every rollout producer follows all of `tool.results` and picks out the call ids it is waiting
for, so any tool worker of the client's pool (its run) may answer any of its calls. A result
that does not arrive within the call's timeout becomes an error observation; if it arrives
later it is counted and dropped.
"""

from __future__ import annotations

import asyncio
import time

import msgspec

from asearcher.consumers.tools.toolbox import Toolbox, answer_call
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.io.tail import TopicTail
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import ToolCallRequested, ToolResultReady
from asearcher.streams.wire.records import Record
from asearcher.streams.wire.topics import TOOL_CALLS, TOOL_RESULTS

TIMED_OUT_MEMORY = 10_000  # timed-out call ids remembered, to count their late results


def timeout_result(request: ToolCallRequested, waited_s: float) -> ToolResultReady:
    """The error observation for a call nobody answered in time."""
    return ToolResultReady(
        call_id=request.call_id,
        trajectory_id=request.trajectory_id,
        turn=request.turn,
        tool=request.tool,
        error=f"{request.tool} timed out: no result within {request.timeout_s:g} s",
        latency_s=waited_s,
    )


class KafkaToolClient:
    """A `ToolClient` whose calls travel over the `tool.calls` / `tool.results` topics."""

    def __init__(
        self,
        settings: KafkaSettings,
        codec: EventCodec,
        producer: EventProducer,
        *,
        calls_topic: str = TOOL_CALLS,
        results_topic: str = TOOL_RESULTS,
        pool: str = "",
    ) -> None:
        self.producer, self.calls_topic, self.pool = producer, calls_topic, pool
        self._tail = TopicTail(settings, codec, results_topic, self._on_record, producer)
        self._pending: dict[str, asyncio.Future[ToolResultReady]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        # Recent timed-out call ids (an insertion-ordered dict as a bounded set).
        self._timed_out: dict[str, None] = {}
        self.late_results = 0
        self.timeouts = 0
        self.send_s = 0.0  # time spent encoding and queueing calls

    def start(self) -> None:
        """Start following results; call from the event loop that will await the calls."""
        self._loop = asyncio.get_running_loop()
        self._tail.start()

    async def call(self, request: ToolCallRequested) -> ToolResultReady:
        """Send `request` and wait for its result, or return a timeout error observation."""
        assert self._loop is not None, "start() the client first"
        if request.pool != self.pool:
            request = msgspec.structs.replace(request, pool=self.pool)
        future: asyncio.Future[ToolResultReady] = self._loop.create_future()
        self._pending[request.call_id] = future
        started = time.monotonic()
        try:
            self.producer.send(self.calls_topic, request)
            self.send_s += time.monotonic() - started
            return await asyncio.wait_for(future, request.timeout_s)
        except TimeoutError:
            self.timeouts += 1
            self._timed_out[request.call_id] = None
            if len(self._timed_out) > TIMED_OUT_MEMORY:
                self._timed_out.pop(next(iter(self._timed_out)))
            return timeout_result(request, time.monotonic() - started)
        finally:
            self._pending.pop(request.call_id, None)

    def _on_record(self, record: Record) -> None:
        # Runs in the tail's thread: hand the result to the event loop's thread.
        loop = self._loop
        if isinstance(record.event, ToolResultReady) and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._deliver, record.event)

    def _deliver(self, result: ToolResultReady) -> None:
        future = self._pending.get(result.call_id)
        if future is not None and not future.done():
            future.set_result(result)
        elif result.call_id in self._timed_out:
            self.late_results += 1

    def stop(self) -> None:
        """Stop following results."""
        self._tail.stop()


class InProcessToolClient:
    """A `ToolClient` that runs a `Toolbox` in this process: no Kafka (tests, local runs, and
    the benchmark that measures what the bus costs)."""

    def __init__(self, toolbox: Toolbox) -> None:
        self.toolbox = toolbox

    async def call(self, request: ToolCallRequested) -> ToolResultReady:
        """Run the call here and wrap its text or error as a tool worker would."""
        return await answer_call(self.toolbox, request, "in-process")
