"""Claim check: payloads too large for a Kafka message live in object storage instead.

The store is content-addressed (the file name is the SHA-256 of the payload), so writing the same
payload twice is harmless and a redelivered producer retry never leaves two copies.
"""

from __future__ import annotations

import hashlib
from typing import Any

import fsspec

from asearcher.streams.events import ClaimCheck

DEFAULT_THRESHOLD_BYTES = 512 * 1024


class ClaimCheckError(Exception):
    """A claimed payload is missing or does not match its checksum."""


class ClaimCheckStore:
    """Stores and fetches large payloads under `base_url` on any fsspec filesystem."""

    def __init__(
        self,
        base_url: str,
        threshold_bytes: int = DEFAULT_THRESHOLD_BYTES,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.threshold_bytes = threshold_bytes
        self._fs, self._root = fsspec.core.url_to_fs(self.base_url, **(storage_options or {}))

    def needs_claim(self, payload: bytes) -> bool:
        """Whether `payload` is too large to travel inline."""
        return len(payload) > self.threshold_bytes

    def put(self, payload: bytes, content_type: str, original_kind: str) -> ClaimCheck:
        """Write `payload` (once) and return the reference that travels instead."""
        digest = hashlib.sha256(payload).hexdigest()
        path = f"{self._root}/{digest[:2]}/{digest}"
        if not self._fs.exists(path):
            self._fs.makedirs(f"{self._root}/{digest[:2]}", exist_ok=True)
            with self._fs.open(path, "wb") as out:
                out.write(payload)
        return ClaimCheck(
            uri=self._fs.unstrip_protocol(path),
            sha256=digest,
            size=len(payload),
            content_type=content_type,
            original_kind=original_kind,
        )

    def get(self, ref: ClaimCheck) -> bytes:
        """Read the payload a reference points at, verifying size and checksum."""
        fs, path = fsspec.core.url_to_fs(ref.uri, **self._options_for(ref.uri))
        try:
            with fs.open(path, "rb") as src:
                payload = src.read()
        except FileNotFoundError as exc:
            raise ClaimCheckError(f"claimed payload missing: {ref.uri}") from exc
        if len(payload) != ref.size or hashlib.sha256(payload).hexdigest() != ref.sha256:
            raise ClaimCheckError(f"claimed payload does not match its checksum: {ref.uri}")
        return payload

    def _options_for(self, uri: str) -> dict[str, Any]:
        # A reference written by this store reuses its filesystem options (e.g. an S3 endpoint).
        mine = uri.startswith(self._fs.unstrip_protocol(self._root))
        return self._fs.storage_options if mine else {}
