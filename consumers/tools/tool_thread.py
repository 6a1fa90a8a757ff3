"""A real tool worker answering in a background thread, for commands that play rollouts
themselves (the demo, a run's warm start) before or without the run's tool services."""

from __future__ import annotations

import threading

from asearcher.consumers.tools.result_store import ResultStore
from asearcher.consumers.tools.tool_worker import ToolWorker
from asearcher.consumers.tools.toolbox import Toolbox, ToolConfig, build_backends
from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.service.log import get_logger
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.topics import TOOL_CALLS, TOOL_RESULTS

log = get_logger(__name__)


class ToolWorkerThread:
    """A context manager: the worker answers `tool.calls` in consumer group `group_id` while
    the block runs, and stops (committing what it answered) when it ends."""

    def __init__(
        self,
        settings: KafkaSettings,
        codec: EventCodec,
        config: ToolConfig,
        results_url: str,
        group_id: str,
        *,
        calls_topic: str = TOOL_CALLS,
        results_topic: str = TOOL_RESULTS,
    ) -> None:
        toolbox = Toolbox(*build_backends(config), config)
        self.worker = ToolWorker(
            settings, codec, toolbox, ResultStore(results_url), group_id=group_id,
            calls_topic=calls_topic, results_topic=results_topic,
        )  # fmt: skip
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def __enter__(self) -> ToolWorkerThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.stop()
        self.thread.join(60)
        self.worker.close()
        log.info("tool worker %s stopped", self.worker.name)
