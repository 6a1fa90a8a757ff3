"""Draws that repeat in every run: a number in [0, 1) from a stable hash of what is drawn for.

Scripted actors (the expert's shortcuts, the synthesis roles' choices) and per-group prompt
choices draw this way rather than from a random generator, so the same question or group gets
the same draw on whichever process plays it and in whatever order plays finish.
"""

from __future__ import annotations

import hashlib


def stable_unit(*parts: object) -> float:
    """A number in [0, 1) from `parts`: a stable hash, never Python's `hash`."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest) / 2**64
