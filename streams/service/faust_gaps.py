"""A fix for how faust-streaming (0.15.3) commits offsets over gaps, installed for every app.

Input written by transactional producers has gaps: each commit marker takes an offset that no
consumer sees. When a record arrives after such a gap, faust notes the skipped offsets so that
its committer can step over them, but the range it notes also holds the arriving record's own
offset. Once that record is acked, its offset is in the acked list twice, faust's search for
the first run of consecutive acked offsets stops at the duplicate, and each commit moves on by
about one record (faust-streaming/faust#312, robinhood/faust#625). An app that processes
faster than that (the evaluation processor during continuous evaluation) falls behind in its
commits, and everything it publishes on commit (`stream_publish_on_commit`) waits: measured
on 2 cores, an evaluation result was readable 193 s after the processor made it.

The fix notes only the offsets that were skipped, never the arriving record's.
"""

from __future__ import annotations

from faust.transport.consumer import Consumer
from faust.types import TP

_faust_add_gap = Consumer._add_gap


async def _add_skipped_offsets(self: Consumer, tp: TP, offset_from: int, offset_to: int) -> None:
    # faust calls this with the arriving record's offset as `offset_to` (inclusive): the
    # offsets skipped end just before it.
    await _faust_add_gap(self, tp, offset_from, offset_to - 1)


def install() -> None:
    """Make every faust consumer note only skipped offsets as gaps (idempotent)."""
    Consumer._add_gap = _add_skipped_offsets  # type: ignore[method-assign]


def installed() -> bool:
    """Whether `install` is in effect."""
    return Consumer._add_gap is _add_skipped_offsets
