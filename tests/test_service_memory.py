"""Handing back what a start-up peak freed (`streams/service/memory.py`)."""

from __future__ import annotations

import threading

from asearcher.streams.service.memory import release_freed_memory, resident_mb

BLOCK = 4096  # above pymalloc's limit: each block comes from malloc
BLOCKS = 16_384  # 64 MB


def test_memory_freed_by_a_thread_behind_a_live_block_is_handed_back() -> None:
    kept: list[bytes] = []

    def peak() -> None:
        # A thread allocates in its own glibc arena; the last block stays alive, so the freed
        # ones below it are not at the arena's top and glibc keeps them, as after a catch-up.
        blocks = [bytes([i % 251]) * BLOCK for i in range(BLOCKS)]
        kept.append(blocks[-1])
        del blocks

    # Memory earlier tests freed is handed back first: the peak must touch pages afresh.
    release_freed_memory("before the peak")
    before = resident_mb()
    worker = threading.Thread(target=peak)
    worker.start()
    worker.join()
    held = resident_mb()
    released = release_freed_memory("test")
    assert released is not None
    assert released > 0.5 * (held - before) > 16, (before, held, released)
