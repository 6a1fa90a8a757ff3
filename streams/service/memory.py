"""Handing freed memory back to the system after a service's start-up peak.

A service that reads a long log at start (the feeder follows `trajectories` from its beginning)
peaks while it catches up; glibc keeps what its threads freed in their arenas, so the process
settles as high as its peak was, and the peak grows with the log. The trainer is the other
case: its largest batch leaves its activations' pages in the heap (an hour without faults: its
floor rose 240 MB at its largest batch, in minute 20, and stayed there), so it trims after every
step (~15 ms for 1 GB freed). `malloc_trim` returns the free pages of every arena. Elsewhere than
glibc it does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

import psutil

from asearcher.streams.service.log import get_logger

log = get_logger(__name__)


def resident_mb() -> float:
    """This process's resident memory in MB."""
    return psutil.Process().memory_info().rss / 2**20


def release_freed_memory(why: str, *, quiet: bool = False) -> float | None:
    """Return freed heap pages to the system; the MB released, None where that cannot be done.

    Logged at info, or at debug when `quiet` (a service that trims after every step)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is None:
        return None
    before = resident_mb()
    trim(0)
    after = resident_mb()
    log.log(
        logging.DEBUG if quiet else logging.INFO,
        "%s: %.0f MB resident, %.0f MB handed back", why, after, before - after,
    )  # fmt: skip
    return before - after
