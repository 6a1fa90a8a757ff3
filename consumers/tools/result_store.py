"""Results by call id, shared by every tool worker: a redelivered call gets the same answer.

A call that reaches two workers (after a rebalance or a crash) is answered once: the first
result stored for a call id wins and every later attempt re-emits that stored event unchanged.
"""

from __future__ import annotations

import msgspec

from asearcher.streams.storage.sharded_store import ShardedStore
from asearcher.streams.wire.events import ToolResultReady


class ResultStore:
    """`ToolResultReady` events by call id, on any fsspec URL."""

    def __init__(self, url: str) -> None:
        self._store = ShardedStore(url, suffix=".json")
        self.url = self._store.url
        self._store.ensure_root()  # an unwritable store stops a worker at start

    def get(self, call_id: str) -> ToolResultReady | None:
        """The stored result of `call_id`, if any."""
        try:
            payload = self._store.read(self._store.path(call_id))
        except FileNotFoundError:
            return None
        return msgspec.json.decode(payload, type=ToolResultReady)

    def put_first(self, result: ToolResultReady) -> ToolResultReady:
        """Store `result` unless one is stored already; return the one that is stored.

        On a local filesystem the first of racing workers wins for sure, and a reader never
        sees a half-written result; elsewhere a race may store either of two finished results.
        """
        path = self._store.path(result.call_id)
        if self._store.write(path, msgspec.json.encode(result), replace=False):
            return result
        return self.get(result.call_id) or result
