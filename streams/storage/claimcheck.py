"""Claim check: payloads too large for a Kafka message live in object storage instead.

The store is content-addressed (the file name is the SHA-256 of the payload), so writing the same
payload twice is harmless and a redelivered producer retry never leaves two copies.

A reference arrives inside a record anyone could have written, so it is untrusted: it is read
only when it names a plain file under this store's own root, never past its declared size, and
only returned when it matches its checksum. Anything else is a `ClaimCheckError`, which the codec
turns into a dead letter.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from asearcher.streams.storage.sharded_store import NotARegularFile, ShardedStore
from asearcher.streams.wire.events import ClaimCheck

DEFAULT_THRESHOLD_BYTES = 512 * 1024
# Far above any real trajectory (hundreds of thousands of tokens are tens of MiB), far below
# what would exhaust a service's memory.
DEFAULT_MAX_BYTES = 1024 * 1024 * 1024
# The one answer for every reference outside the store: telling "missing" from "is a directory"
# for arbitrary paths would let a record probe the consumer's filesystem.
OUTSIDE_THE_STORE = "claim check outside the claims store"
# Path segments the store itself writes (hex digests); anything else (`..`, `%2e`, NUL,
# backslashes, hidden files) is refused before any filesystem sees it.
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class ClaimCheckError(Exception):
    """A claim-check reference that cannot be resolved; the message is the reason."""


class ClaimCheckStore:
    """Stores and fetches large payloads under `base_url` on any fsspec filesystem."""

    def __init__(
        self,
        base_url: str,
        threshold_bytes: int = DEFAULT_THRESHOLD_BYTES,
        storage_options: dict[str, Any] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if max_bytes < threshold_bytes:
            raise ValueError(f"max_bytes {max_bytes} is below threshold_bytes {threshold_bytes}")
        self.threshold_bytes = threshold_bytes
        self.max_bytes = max_bytes
        # Content-addressed: the key of a payload is the payload itself.
        self._store = ShardedStore(base_url, storage_options)
        self.base_url = self._store.url
        # The normalised form references are compared against (what `put` writes).
        root_url = self._store.root_url
        self._prefix = root_url if root_url.endswith("/") else f"{root_url}/"

    def needs_claim(self, payload: bytes) -> bool:
        """Whether `payload` is too large to travel inline."""
        return len(payload) > self.threshold_bytes

    def put(self, payload: bytes, content_type: str, original_kind: str) -> ClaimCheck:
        """Write `payload` (once) and return the reference that travels instead."""
        if len(payload) > self.max_bytes:
            # Readers would refuse it: better a loud error here than a dead letter there.
            raise ValueError(
                f"{original_kind} of {len(payload)} bytes is over the claim store's limit of "
                f"{self.max_bytes} bytes"
            )
        digest = ShardedStore.digest(payload)
        path = self._store.path_of_digest(digest)
        # Written once, atomically where local: racing producers of one payload are harmless.
        self._store.write(path, payload, replace=False)
        return ClaimCheck(
            uri=self._store.uri(path),
            sha256=digest,
            size=len(payload),
            content_type=content_type,
            original_kind=original_kind,
        )

    def get(self, ref: ClaimCheck) -> bytes:
        """Read the payload a reference points at, verifying location, size and checksum."""
        path = self._path_of(ref.uri)
        if not 0 <= ref.size <= self.max_bytes:
            raise ClaimCheckError(
                f"claim check declares {ref.size} bytes, outside the limit of {self.max_bytes}"
            )
        if not _SHA256.fullmatch(ref.sha256):
            raise ClaimCheckError(f"claim check has a malformed sha256: {ref.uri}")
        try:
            # One byte more than declared tells "larger than declared" from "exactly right".
            payload = self._store.read(path, ref.size + 1)
        except NotARegularFile as exc:
            raise ClaimCheckError(f"claimed payload is not a regular file: {path}") from exc
        except FileNotFoundError as exc:
            raise ClaimCheckError(f"claimed payload missing: {ref.uri}") from exc
        except (OSError, ValueError) as exc:
            raise ClaimCheckError(f"claimed payload unreadable: {ref.uri}: {exc}") from exc
        if len(payload) != ref.size:
            raise ClaimCheckError(f"claimed payload size is not the declared {ref.size}: {ref.uri}")
        if hashlib.sha256(payload).hexdigest() != ref.sha256:
            raise ClaimCheckError(f"claimed payload does not match its checksum: {ref.uri}")
        return payload

    def holds(self, uri: str) -> bool:
        """Whether `uri` is under this store's root (whether it is this store's to read)."""
        return uri.startswith(self._prefix)

    def _path_of(self, uri: str) -> str:
        """The store path `uri` names, refusing anything not strictly under the root."""
        if not uri.startswith(self._prefix):
            raise ClaimCheckError(OUTSIDE_THE_STORE)
        segments = uri.removeprefix(self._prefix).split("/")
        if not all(_SEGMENT.fullmatch(segment) for segment in segments):
            raise ClaimCheckError(OUTSIDE_THE_STORE)
        return "/".join([self._store.root.rstrip("/"), *segments])


class ClaimCheckStores:
    """A store that writes to its own root (`primary`) and also reads what other stores wrote:
    a command that reads several runs' topics resolves each run's claim checks from that run's
    store. Each reference is read only by the store whose root it is under, with that store's
    checks; a reference under none of them is outside the claims store, as before."""

    def __init__(self, primary: ClaimCheckStore, others: list[ClaimCheckStore]) -> None:
        self.primary = primary
        self.others = [o for o in others if o.base_url != primary.base_url]
        self.base_url = primary.base_url
        self.threshold_bytes, self.max_bytes = primary.threshold_bytes, primary.max_bytes

    def needs_claim(self, payload: bytes) -> bool:
        """Whether `payload` is too large to travel inline (the primary's threshold)."""
        return self.primary.needs_claim(payload)

    def put(self, payload: bytes, content_type: str, original_kind: str) -> ClaimCheck:
        """Write `payload` to the primary store."""
        return self.primary.put(payload, content_type, original_kind)

    def get(self, ref: ClaimCheck) -> bytes:
        """The payload, read by whichever store holds the reference."""
        owner = next((s for s in (self.primary, *self.others) if s.holds(ref.uri)), self.primary)
        return owner.get(ref)
