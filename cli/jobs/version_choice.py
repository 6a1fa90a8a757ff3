"""Which version `learn` scores after RL: the last one, or (`eval.keep_best`) the one the run's
continuous evaluations on validation questions rate best.

Continuous evaluations score a few dozen questions: one of them can be several points lucky,
and the best of thirty such scores overstates its version by more than that. So a version is
rated by the mean of its own score and its neighbours' (the evaluations just before and after
it), which rewards a stretch of good versions over one lucky draw. Ties go to the later
version: it has trained longer for the same rating.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from asearcher.streams.wire.events import EvalResult


class VersionChoice(msgspec.Struct, frozen=True, kw_only=True):
    """The version scored after RL and why."""

    version: int
    last: int
    rating: float | None = None
    evaluations: int = 0
    reason: str = ""


def ratings(results: Sequence[EvalResult], metric: str = "f1") -> list[tuple[int, float]]:
    """(version, mean of its score and its neighbours') for each version evaluated, in version
    order; a version evaluated twice counts with its later result."""
    scores = {r.policy_version: r.averages.get(metric, 0.0) for r in results}
    versions = sorted(scores)
    rated = []
    for i, version in enumerate(versions):
        window = [scores[v] for v in versions[max(0, i - 1) : i + 2]]
        rated.append((version, sum(window) / len(window)))
    return rated


def choose_version(
    results: Sequence[EvalResult], last: int, keep_best: bool, held: Iterable[int] = ()
) -> VersionChoice:
    """The version to score after RL: with `keep_best`, the best rated of those evaluated
    (`ratings`) that the weight store still `held`; else, or with none, the `last`."""
    if not keep_best:
        return VersionChoice(version=last, last=last, reason="the last version")
    held = set(held)
    rated = [(v, r) for v, r in ratings(results) if v in held]
    if not rated:
        why = "the last version: no continuous evaluation of a version the store still holds"
        return VersionChoice(version=last, last=last, reason=why)
    version, rating = max(rated, key=lambda pair: (round(pair[1], 9), pair[0]))
    return VersionChoice(
        version=version, last=last, rating=rating, evaluations=len(rated),
        reason=(f"the best rated of {len(rated)} continuous evaluations on validation questions "
                f"(F1 {rating:.3f}, the mean of its own and its neighbours'); the last is v{last}"),
    )  # fmt: skip
