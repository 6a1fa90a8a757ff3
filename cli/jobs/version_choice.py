"""Which version `learn` scores after RL: the last one, or (`eval.keep_best`) one the run's
continuous evaluations on validation questions rate among the best.

Continuous evaluations score a few dozen questions: one of them can be several points lucky,
and the best of thirty such scores overstates its version by more than that. So a version is
rated by the mean of its own score and its neighbours' (the evaluations just before and after
it), which rewards a stretch of good versions over one lucky draw; and of the versions rated
within one standard error of the best, the latest is chosen (the one-standard-error rule of
model selection): RL went on improving the policy in most runs, and in three 30-minute seeds
the best rated version scored 0.1, 6.5 and 5.8 points below the last on the held-out split.
A run whose score falls late still gets a version from before the fall.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import msgspec

from asearcher.streams.wire.events import EvalResult


class VersionChoice(msgspec.Struct, frozen=True, kw_only=True):
    """The version scored after RL and why."""

    version: int
    last: int
    rating: float | None = None
    best: int | None = None  # the best rated version, where the choice is among the best
    evaluations: int = 0
    reason: str = ""


class Rating(NamedTuple):
    """A version's rating: the mean of its score and its neighbours', with a bound on its
    standard error."""

    version: int
    value: float
    error: float


def ratings(results: Sequence[EvalResult], metric: str = "f1") -> list[Rating]:
    """Each version evaluated, rated (`Rating`), in version order; a version evaluated twice
    counts with its later result."""
    latest = {r.policy_version: r for r in results}
    versions = sorted(latest)
    rated = []
    for i, version in enumerate(versions):
        window = [latest[v] for v in versions[max(0, i - 1) : i + 2]]
        scores = [r.averages.get(metric, 0.0) for r in window]
        # A score within [0, 1] whose mean is p varies by at most p(1 - p); the questions, not
        # their samples, are the independent draws.
        variance = sum(
            p * (1 - p) / max(r.questions, 1) for p, r in zip(scores, window, strict=True)
        )
        rated.append(Rating(version, sum(scores) / len(window), math.sqrt(variance) / len(window)))
    return rated


def choose_version(
    results: Sequence[EvalResult], last: int, keep_best: bool, held: Iterable[int] = ()
) -> VersionChoice:
    """The version to score after RL: with `keep_best`, of those evaluated (`ratings`) that
    the weight store still `held`, the latest rated within one standard error of the best;
    else, or with none, the `last`."""
    if not keep_best:
        return VersionChoice(version=last, last=last, reason="the last version")
    held = set(held)
    rated = [r for r in ratings(results) if r.version in held]
    if not rated:
        why = "the last version: no continuous evaluation of a version the store still holds"
        return VersionChoice(version=last, last=last, reason=why)
    best = max(rated, key=lambda r: (round(r.value, 9), r.version))
    near = [r for r in rated if r.value >= best.value - best.error]
    chosen = max(near, key=lambda r: r.version)
    return VersionChoice(
        version=chosen.version, last=last, rating=chosen.value, evaluations=len(rated),
        best=best.version,
        reason=(f"the latest of {len(rated)} continuous evaluations on validation questions "
                f"rated within one standard error of the best (v{best.version}: F1 "
                f"{best.value:.3f} ± {best.error:.3f}, each the mean of its own and its "
                f"neighbours'), F1 {chosen.value:.3f}; the last is v{last}"),
    )  # fmt: skip
