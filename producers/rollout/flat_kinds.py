"""Which kinds of question the feeder mostly passes over: those whose groups come back flat.

A flat group (every reward equal) teaches GRPO nothing, and in the learning run they gather on
a few kinds of question (a synthetic world's template: what is asked, of what): on one run's v1,
13 of 13 groups asking the year a person's birthplace was founded were all wrong, while no
group asking the year a person died was. A question's own history cannot act within a run of
minutes (no question comes back before the next epoch), but its kind's can: the kinds repeat
dozens of times an epoch. Once at least `MIN_GROUPS` groups of a kind have finished and a
share of at least `share` of them were flat, the kind's questions are passed over, all but every
`probe_every`-th, so that a kind the policy learns (or unlearns) is seen again and its share
moves. Questions without a kind (`kind == ""`) are never passed over here.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence

from asearcher.producers.rollout.flat_questions import epoch_order, group_id_pattern

MIN_GROUPS = 4  # finished groups of a kind before its flat share is trusted


class FlatKinds:
    """Finished and flat groups per kind of question; fed from the feeder's tail threads."""

    def __init__(
        self, run: str, seed: int, kinds: Sequence[str], share: float, probe_every: int
    ) -> None:
        self._pattern = group_id_pattern(run)
        self._seed, self._kinds = seed, list(kinds)
        self._share, self._probe_every = share, probe_every
        self._lock = threading.Lock()
        self.active = share > 0 and any(kinds)  # whether any question can be passed over
        self._finished: Counter[str] = Counter()
        self._flat: Counter[str] = Counter()
        self._considered: Counter[str] = Counter()  # questions met while their kind was flat

    def _kind_of(self, group_id: str) -> str | None:
        match = self._pattern.fullmatch(group_id) if self.active else None
        if match is None or int(match[2]) >= len(self._kinds):
            return None
        order = epoch_order(self._seed, int(match[1]), len(self._kinds))
        return self._kinds[order[int(match[2])]] or None

    def finished(self, group_id: str) -> None:
        """Record that group `group_id` is done; once a group (other runs' are ignored)."""
        kind = self._kind_of(group_id)
        if kind is not None:
            with self._lock:
                self._finished[kind] += 1

    def flat(self, group_id: str) -> None:
        """Record that the trainer dropped group `group_id` as flat."""
        kind = self._kind_of(group_id)
        if kind is not None:
            with self._lock:
                self._flat[kind] += 1

    def flat_share(self, kind: str) -> float | None:
        """The share of `kind`'s finished groups that were flat; None below `MIN_GROUPS`."""
        with self._lock:
            finished, flat = self._finished[kind], self._flat[kind]
        return None if finished < MIN_GROUPS else min(1.0, flat / finished)

    def passes_over(self, question: int) -> bool:
        """Whether to pass over question `question` now: its kind's groups are mostly flat and
        it is not this kind's turn to be probed. Counts the passes, so call it once a position."""
        kind = self._kinds[question]
        if not self.active or not kind:
            return False
        share = self.flat_share(kind)
        if share is None or share < self._share:
            return False
        with self._lock:
            self._considered[kind] += 1
            return self._considered[kind] % self._probe_every != 0

    def summary(self) -> str:
        """The kinds passed over so far, with their flat shares, for the log."""
        with self._lock:
            kinds = sorted(self._considered)
        parts = [f"{kind} ({self.flat_share(kind) or 0:.0%} flat)" for kind in kinds]
        return ", ".join(parts) or "none"
