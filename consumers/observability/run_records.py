"""Which records of the shared topics belong to one run (`asearcher replay --run NAME`).

Every run on a cluster writes the same topics; an event says whose it is by one of its fields:
the model name (versions, steps, drops, evaluation results), the feeder's group ids
(`<run>-e<epoch>-<index>`: requests, generation steps, trajectories), the warm start's
(`<run>-expert-<question>`, `metadata["run"]`), an evaluation's group ids
and metadata (`<run>-v<N>[-<hex>]/...`, `metadata["model"]`), the tool pool of a call, the
instance names of heartbeats. A tool result names only its call, so the run's calls are read
first when results are replayed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from asearcher.streams.cluster.settings import KafkaSettings
from asearcher.streams.io.replay import ReplayRange, read_range
from asearcher.streams.wire.codec import EventCodec
from asearcher.streams.wire.events import (
    Event,
    FeederProgress,
    RolloutRequested,
    ServiceStatus,
    ToolCallRequested,
    ToolResultReady,
    TrajectoryFinished,
)
from asearcher.streams.wire.topics import TOOL_CALLS, TOOL_RESULTS


class RunFilter:
    """Accepts the events of run `run` (see the module docstring for how each kind tells)."""

    def __init__(self, run: str, tool_calls: Iterable[str] = ()) -> None:
        name = re.escape(run)
        self.run = run
        self._groups = re.compile(rf"{name}-e\d+-\d+$|{name}-v\d+(-[0-9a-f]+)?/|{name}-expert-")
        self._instances = re.compile(
            rf"{name}-(tools|rollout|evaluator)-\d+$|{name}-(trainer|feeder)$"
            rf"|asearcher-{name}-(eval|synth|metrics)$"
        )
        self._calls = set(tool_calls)

    def accepts(self, event: Event) -> bool:
        """Whether `event` is one of the run's."""
        if isinstance(event, ToolCallRequested):
            return event.pool == self.run
        if isinstance(event, ToolResultReady):
            return event.call_id in self._calls
        if isinstance(event, ServiceStatus):
            return self._instances.match(event.instance) is not None
        if isinstance(event, FeederProgress):
            return event.run == self.run
        if isinstance(event, RolloutRequested | TrajectoryFinished):
            if self.run in (event.metadata.get("model"), event.metadata.get("run")):
                return True
        model = getattr(event, "model", None)
        if isinstance(model, str):
            return model == self.run
        group = getattr(event, "group_id", None)
        return isinstance(group, str) and self._groups.match(group) is not None


def run_filter(
    settings: KafkaSettings, codec: EventCodec, run: str, topics: Iterable[str]
) -> RunFilter:
    """The filter of run `run`; when tool results are to be replayed, the run's tool calls are
    read first (a result names only its call)."""
    calls: list[str] = []
    if TOOL_RESULTS in topics:
        wanted = ReplayRange(kinds=[ToolCallRequested.kind()])
        calls = [
            record.event.call_id
            for record in read_range(settings, codec, [TOOL_CALLS], wanted)
            if isinstance(record.event, ToolCallRequested) and record.event.pool == run
        ]
    return RunFilter(run, calls)
