"""What the trainer refuses to train on: trajectories that decode but cannot work.

A record on `trajectories` may come from anyone who can write the topic (another run, an old
producer, a hand-written JSON event). One whose values would crash a step (a token id past the
embedding, lengths that disagree) or poison the weights (a non-finite reward or log-prob) is
dead-lettered with the reason where the trainer meets it, its offset committed, and the trainer
goes on: it can never crash the trainer again after a restart. A trajectory whose purpose is
not training (an evaluation's) is refused the same way.
"""

from __future__ import annotations

import math

from asearcher.streams.wire.events import Event, TrajectoryFinished


def reason_to_refuse(
    event: Event, vocab_size: int, newest_version: int | None = None
) -> str | None:
    """Why `event` cannot be trained on by a policy with `vocab_size` tokens, or None.

    With `newest_version` (the newest version the trainer has published), a trajectory claiming
    tokens of a later version is refused: no producer can have played a version that does not
    exist, so it is forged or from another run, and its staleness would read as negative."""
    if not isinstance(event, TrajectoryFinished):
        return f"not a trajectory: {event.kind()}"
    if event.purpose != "train":
        # Evaluation (and synthesis) trajectories have their own topics; one that reaches this
        # topic anyway must not train the policy it measures.
        return f"purpose {event.purpose!r}: only training trajectories are trained on"
    lengths = {
        "token_ids": len(event.token_ids),
        "logprobs": len(event.logprobs),
        "loss_mask": len(event.loss_mask),
        "token_versions": len(event.token_versions),
    }
    if len(set(lengths.values())) != 1:
        return f"per-token fields differ in length: {lengths}"
    if not event.token_ids:
        return "no tokens"
    return (
        _tokens(event, vocab_size)
        or _future(event, newest_version)
        or _sequences(event)
        or _numbers(event)
        or _group(event)
    )


def _future(event: TrajectoryFinished, newest_version: int | None) -> str | None:
    if newest_version is None or not event.token_versions:
        return None
    latest = max(event.token_versions)
    if latest <= newest_version:
        return None
    return f"token version {latest} is newer than the newest version published ({newest_version})"


def _tokens(event: TrajectoryFinished, vocab_size: int) -> str | None:
    bad = next((t for t in event.token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        return f"token id {bad} outside the policy's vocabulary (0..{vocab_size - 1})"
    if any(m not in (0, 1) for m in event.loss_mask):
        return "loss_mask holds values other than 0 and 1"
    if any(v < -1 for v in event.token_versions):
        return "token_versions holds a version below -1"
    return None


def _sequences(event: TrajectoryFinished) -> str | None:
    # Each start opens a training sequence that must hold at least one token.
    starts, length = event.sequence_starts, len(event.token_ids)
    if any(not 1 <= start <= length - 1 for start in starts):
        return f"sequence_starts {starts} reach outside 1..{length - 1}"
    if any(a >= b for a, b in zip(starts, starts[1:], strict=False)):
        return f"sequence_starts {starts} are not strictly increasing (a sequence with no tokens)"
    return None


def _numbers(event: TrajectoryFinished) -> str | None:
    if not math.isfinite(event.reward):
        return f"reward {event.reward} is not finite"
    if not (math.isfinite(event.temperature) and event.temperature >= 1e-3):
        return f"temperature {event.temperature} cannot be trained at (finite, >= 0.001)"
    if not all(math.isfinite(x) and x <= 0.0 for x in event.logprobs):
        return "a behaviour log-prob is not finite or above 0"
    return None


def _group(event: TrajectoryFinished) -> str | None:
    if event.group_size < 1 or event.group_size > 4096:
        return f"group_size {event.group_size} outside 1..4096"
    if not event.group_id or not event.trajectory_id:
        return "empty group_id or trajectory_id"
    return None
