"""How many times an epoch the feeder plays each question: questions that take more hops, more.

On the learning run's world every point RL gained in 15 minutes was on 2-hop questions, and
came with reading more pages for them; 1-hop questions stayed at one page and the same F1 in
every seed (docs/learning.md). `plays_by_hops` spends more of the run's groups where RL moves:
`[1, 2]` plays a 1-hop question once an epoch and a question of 2 or more hops twice. A
question whose file does not say its hops (`hops == 0`) is played once. Measured there, it did
not help: 2-hop groups are flatter, so more of them bought no more signal (+3.0 over five
15-minute seeds against +4.7 without; docs/learning.md), and the default is off.
"""

from __future__ import annotations

from collections.abc import Sequence

from asearcher.consumers.formats.qa_files import QaQuestion


def plays_of(hops: int, plays_by_hops: Sequence[int]) -> int:
    """Plays an epoch for a question of `hops` hops: its entry, the last for longer ones."""
    if not plays_by_hops or hops < 1:
        return 1
    return plays_by_hops[min(hops, len(plays_by_hops)) - 1]


def epoch_slots(questions: Sequence[QaQuestion], plays_by_hops: Sequence[int]) -> list[QaQuestion]:
    """The positions of an epoch before shuffling: each question as often as its hops ask."""
    return [q for q in questions for _ in range(plays_of(q.hops, plays_by_hops))]


def check_plays(plays_by_hops: Sequence[int]) -> None:
    """ValueError naming the setting where a play count is below 1."""
    if any(plays < 1 for plays in plays_by_hops):
        raise ValueError(
            f"plays_by_hops must hold counts of at least 1 (plays an epoch for 1, 2, ... hops), "
            f"got {list(plays_by_hops)}"
        )
