"""Which questions the feeder passes over for a while: those whose newest group was flat.

A flat group (every reward equal, most often all wrong) gives GRPO no signal and the trainer drops
it; re-requesting its question next epoch mostly buys another flat group. The trainer names the
flat groups it drops (`flat_groups` on `TrainerStepFinished` and `TrajectoriesDropped`); this
memory maps each back to its question through the epoch's order, and says whether a position
of a later epoch should be passed over: for `revisit_every - 1` epochs after its newest flat
group; then it is requested again, so a question the policy has since learned to answer comes
back, and stays (a group with signal leaves no mark). A report that arrives after the question's
position in the next epoch was fed (the last groups of an epoch) takes effect an epoch later.
"""

from __future__ import annotations

import random
import re
import threading
from functools import lru_cache


def group_id_pattern(run: str) -> re.Pattern[str]:
    """Run `run`'s group ids, `<run>-e<epoch>-<index:06d>`: the epoch and index are its groups."""
    return re.compile(rf"{re.escape(run)}-e(\d+)-(\d+)")


@lru_cache(maxsize=4)
def epoch_order(seed: int, epoch: int, questions: int) -> tuple[int, ...]:
    """The question indices in epoch `epoch`'s order: the same in every process and restart."""
    order = list(range(questions))
    # A string seed goes through SHA-512, not hash(): the same order in every process.
    random.Random(f"{seed}-{epoch}").shuffle(order)
    return tuple(order)


class FlatQuestions:
    """The newest epoch in which each question's group was flat; fed from a tail thread."""

    def __init__(self, run: str, seed: int, questions: int, revisit_every: int) -> None:
        if revisit_every < 1:
            raise ValueError(f"revisit_flat_every must be at least 1, got {revisit_every}")
        self._pattern = group_id_pattern(run)
        self._seed, self._questions, self._every = seed, questions, revisit_every
        self._lock = threading.Lock()
        self._flat_in: dict[int, int] = {}  # question index -> newest epoch its group was flat

    def note(self, group_id: str) -> None:
        """Record that group `group_id` was flat (other runs' groups are ignored)."""
        match = self._pattern.fullmatch(group_id)
        if match is None or int(match[2]) >= self._questions:
            return
        epoch = int(match[1])
        question = epoch_order(self._seed, epoch, self._questions)[int(match[2])]
        with self._lock:
            self._flat_in[question] = max(epoch, self._flat_in.get(question, epoch))

    def passes_over(self, question: int, epoch: int) -> bool:
        """Whether to pass over `question` in `epoch`: its group was flat fewer than
        `revisit_every` epochs before."""
        with self._lock:
            flat_in = self._flat_in.get(question)
        return flat_in is not None and epoch - flat_in < self._every

    @property
    def count(self) -> int:
        """Questions whose newest flat group is known."""
        with self._lock:
            return len(self._flat_in)
