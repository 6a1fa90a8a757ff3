"""The tool worker service: `tool.calls` in, `tool.results` out.

Inputs: `ToolCallRequested` from `tool.calls` (consumer group, so workers share partitions);
a worker answers only the calls addressed to its pool (`ToolConfig.pool`, a run's name), since
every run on the cluster reads the same topic and each run's workers serve its own corpus.
Outputs: one `ToolResultReady` per call on `tool.results`, keyed by trajectory id.
Components: the `Toolbox` (search and browse over pluggable backends), a `ResultStore` that
makes answers idempotent by call id, and the shared consume loop, which stores a batch's
offsets only after every result of the batch was delivered, so no call goes unanswered.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from asearcher.consumers.tools.result_store import ResultStore
from asearcher.consumers.tools.toolbox import Toolbox, answer_call
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.consumer import EventConsumer, LoopStats
from asearcher.streams.io.producer import LOW_LATENCY, EventProducer
from asearcher.streams.service.log import get_logger
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import ToolCallRequested, ToolResultReady
from asearcher.streams.wire.records import Record
from asearcher.streams.wire.topics import TOOL_CALLS, TOOL_RESULTS

log = get_logger(__name__)
GROUP = "asearcher-tool-workers"


class ToolWorker:
    """Answers tool calls concurrently (bounded by the config's `max_concurrency`)."""

    def __init__(
        self,
        settings: KafkaSettings,
        codec: EventCodec,
        toolbox: Toolbox,
        results: ResultStore,
        *,
        group_id: str = GROUP,
        calls_topic: str = TOOL_CALLS,
        results_topic: str = TOOL_RESULTS,
        name: str | None = None,
        **consumer_config: Any,
    ) -> None:
        self.toolbox, self.results = toolbox, results
        self.results_topic = results_topic
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.consumer = EventConsumer(settings, group_id, [calls_topic], codec, **consumer_config)
        self.producer = EventProducer(settings, codec, **LOW_LATENCY)
        self._limit = asyncio.Semaphore(toolbox.config.max_concurrency)
        self._in_flight: dict[str, asyncio.Future[ToolResultReady]] = {}
        self.pool = toolbox.config.pool
        self.foreign_calls = 0  # calls of other pools, passed over

    def run(self, *, max_messages: int | None = None, timeout: float | None = None) -> LoopStats:
        """Serve calls until stopped (SIGINT/SIGTERM), `max_messages` calls, or `timeout` s."""
        with asyncio.Runner() as runner:
            return self.consumer.run_batches(
                lambda records: runner.run(self._answer_batch(records)),
                max_messages=max_messages,
                timeout=timeout,
                batch_size=self.toolbox.config.max_concurrency,
            )

    def stop(self) -> None:
        """Finish the current batch, then return from `run` (thread-safe)."""
        self.consumer.stop()

    async def _answer_batch(self, records: list[Record]) -> None:
        calls = [r.event for r in records if r.event.pool == self.pool]
        self.foreign_calls += len(records) - len(calls)
        await asyncio.gather(*(self._answer_and_send(call) for call in calls))
        # Offsets move past these calls only once their results are durable.
        await asyncio.to_thread(self.producer.flush)

    async def _answer_and_send(self, call: ToolCallRequested) -> None:
        # Each result goes out as soon as it is ready: a slow call does not hold back the rest.
        self.producer.send(self.results_topic, await self._answer(call))

    async def _answer(self, call: ToolCallRequested) -> ToolResultReady:
        # The same call twice in one batch (a redelivery) is executed once.
        running = self._in_flight.get(call.call_id)
        if running is None:
            running = self._in_flight[call.call_id] = asyncio.ensure_future(self._execute(call))
            running.add_done_callback(lambda _: self._in_flight.pop(call.call_id, None))
        return await running

    async def _execute(self, call: ToolCallRequested) -> ToolResultReady:
        stored = await asyncio.to_thread(self.results.get, call.call_id)
        if stored is not None:
            log.info("call %s answered before; re-sending the stored result", call.call_id)
            return stored
        async with self._limit:
            result = await answer_call(self.toolbox, call, self.name)
        return await asyncio.to_thread(self.results.put_first, result)

    def close(self) -> None:
        """Leave the group and deliver what is queued."""
        self.consumer.close()
        self.producer.close()
