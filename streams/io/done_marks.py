"""Which records of a partition are done, when they finish out of order, in a committable form.

Work items (rollout groups) finish out of order, but a committed offset says "everything below
is done". So the commit carries the offset of the oldest unfinished record plus, in the offset's
metadata, the offsets above it that are already done. Both go into the same transaction as the
item's outputs, so a member that takes the partition over after a crash replays exactly the
unfinished records and skips the finished ones: no output reaches its readers twice.
"""

from __future__ import annotations

PREFIX = "done:"
# Kafka's default offset.metadata.max.bytes is 4096; stay well inside it.
MAX_METADATA_CHARS = 3_800


class MetadataTooLong(ValueError):
    """Too many finished records above an unfinished one to record in offset metadata."""


def _runs(numbers: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for number in numbers:
        if runs and runs[-1][1] == number - 1:
            runs[-1] = (runs[-1][0], number)
        else:
            runs.append((number, number))
    return runs


def encode_done(commit_offset: int, done: set[int]) -> str:
    """Offset metadata listing `done` offsets as distances above `commit_offset`, in runs
    ("done:1,3-40"), so a long stretch of finished records stays short."""
    distances = sorted(o - commit_offset for o in done)
    text = PREFIX + ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in _runs(distances))
    if len(text) > MAX_METADATA_CHARS:
        raise MetadataTooLong(f"{len(done)} finished records above offset {commit_offset}")
    return text


def decode_done(commit_offset: int, metadata: str | None) -> set[int]:
    """The done offsets recorded by `encode_done`; empty for metadata written by others."""
    if not metadata or not metadata.startswith(PREFIX) or metadata == PREFIX:
        return set()
    done: set[int] = set()
    try:
        for item in metadata[len(PREFIX) :].split(","):
            first, _, last = item.partition("-")
            done.update(range(int(first), int(last or first) + 1))
    except ValueError:
        return set()
    return {commit_offset + d for d in done}


class PartitionProgress:
    """Records received and finished on one partition since the last commit."""

    def __init__(self, committed: int, metadata: str | None = None) -> None:
        self.commit_offset = max(committed, 0)
        self.done = {o for o in decode_done(committed, metadata) if o >= self.commit_offset}
        self.open: set[int] = set()
        self.next_unseen = self.commit_offset

    def receive(self, offset: int) -> bool:
        """Note a record; False when it was already finished (skip it)."""
        self.next_unseen = max(self.next_unseen, offset + 1)
        # Done, or already being worked on (a record fetched twice must not run twice).
        if offset in self.done or offset in self.open or offset < self.commit_offset:
            return False
        self.open.add(offset)
        return True

    def finish(self, offset: int) -> None:
        """A record's outputs are out (or the record was set aside)."""
        self.open.discard(offset)
        self.done.add(offset)

    def commit_point(self, also_done: set[int] = frozenset()) -> tuple[int, str]:
        """The offset to commit and its metadata, as if `also_done` were finished too.

        Changes nothing: `advance` applies it once the commit succeeded.
        """
        still_open = self.open - also_done
        offset = min(still_open) if still_open else self.next_unseen
        # Offsets below the commit point that were skipped (control records) are done too.
        return offset, encode_done(offset, {o for o in self.done | also_done if o >= offset})

    def advance(self, done: set[int], commit_offset: int) -> None:
        """A commit of `done` at `commit_offset` succeeded: forget what it covers."""
        for offset in done:
            self.finish(offset)
        self.commit_offset = max(self.commit_offset, commit_offset)
        self.done = {o for o in self.done if o >= self.commit_offset}
