"""Results by call id, shared by every tool worker: a redelivered call gets the same answer.

A call that reaches two workers (after a rebalance or a crash) is answered once: the first
result stored for a call id wins and every later attempt re-emits that stored event unchanged.
"""

from __future__ import annotations

import hashlib
import os

import fsspec
import msgspec

from asearcher.streams.events import ToolResultReady


class ResultStore:
    """`ToolResultReady` events by call id, on any fsspec URL."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._fs, self._root = fsspec.core.url_to_fs(self.url)
        self._fs.makedirs(self._root, exist_ok=True)
        self._local = self._fs.protocol in ("file", "local") or "file" in self._fs.protocol

    def _path(self, call_id: str) -> str:
        digest = hashlib.sha256(call_id.encode()).hexdigest()
        return f"{self._root}/{digest[:2]}/{digest}.json"

    def get(self, call_id: str) -> ToolResultReady | None:
        """The stored result of `call_id`, if any."""
        path = self._path(call_id)
        try:
            with self._fs.open(path, "rb") as src:
                return msgspec.json.decode(src.read(), type=ToolResultReady)
        except FileNotFoundError:
            return None

    def put_first(self, result: ToolResultReady) -> ToolResultReady:
        """Store `result` unless one is stored already; return the one that is stored."""
        path = self._path(result.call_id)
        payload = msgspec.json.encode(result)
        self._fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        if self._local:
            # Write aside, then link into place: the link fails if another worker got there
            # first, and a reader never sees a half-written file.
            staging = f"{path}.{os.getpid()}.{id(result)}.tmp"
            with open(staging, "wb") as out:
                out.write(payload)
            try:
                os.link(staging, path)
            except FileExistsError:
                return self.get(result.call_id) or result
            finally:
                os.unlink(staging)
            return result
        existing = self.get(result.call_id)
        if existing is not None:
            return existing
        with self._fs.open(path, "wb") as out:
            out.write(payload)
        return result
