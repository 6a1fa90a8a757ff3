"""Retrying a flaky async call: exponential back-off with full jitter, bounded twice.

`retry(call, policy, retryable=...)` awaits `call()` until it succeeds, an error is not worth
repeating, `policy.attempts` calls have failed, or the next wait would take the total time spent
waiting past `policy.max_total_s`. The wait before attempt n+1 is drawn uniformly from
[0, min(cap_s, base_s * 2**(n-1))] ("full jitter"), so many clients that failed together do not
come back together. A server's Retry-After (given through `retry_after`) is a lower bound on the
wait, capped by `cap_s`. When retries end, the last error is raised unchanged.

HTTP helpers for callers: `is_retryable_status` (429 and 5xx) and `parse_retry_after` (the
header's seconds or HTTP-date form).
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import random
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import msgspec
from msgspec import Meta

from asearcher.streams.service.log import get_logger

log = get_logger(__name__)

T = TypeVar("T")


class Backoff(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """How often and how long to retry."""

    attempts: Annotated[int, Meta(description="calls in all, the first included")] = 3
    base_s: Annotated[
        float, Meta(description="ceiling of the first wait; it doubles after each failure")
    ] = 0.5
    cap_s: Annotated[float, Meta(description="the largest single wait, Retry-After included")] = (
        10.0
    )
    max_total_s: Annotated[
        float, Meta(description="the most time spent waiting over all retries of one call")
    ] = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {self.attempts}")
        for name in ("base_s", "cap_s", "max_total_s"):
            if not getattr(self, name) >= 0:  # also rejects NaN
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def ceiling(self, failures: int) -> float:
        """The largest jittered wait after `failures` failed attempts (1 for the first)."""
        # min() first keeps 2**n from overflowing a float for large attempt counts.
        exponent = min(failures - 1, 64)
        return min(self.cap_s, self.base_s * 2.0**exponent)

    def wait(self, failures: int, retry_after: float | None, rng: random.Random) -> float:
        """The wait before the next attempt: full jitter, raised to a capped Retry-After."""
        delay = rng.uniform(0.0, self.ceiling(failures))
        if retry_after is not None and retry_after > 0:
            delay = max(delay, min(retry_after, self.cap_s))
        return delay


def _no_retry_after(exc: BaseException) -> float | None:
    return None


async def retry(
    call: Callable[[], Awaitable[T]],
    policy: Backoff,
    *,
    retryable: Callable[[BaseException], bool],
    retry_after: Callable[[BaseException], float | None] = _no_retry_after,
    what: str = "call",
    rng: random.Random | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """`await call()`, retried per `policy` while `retryable(error)` holds.

    `retry_after(error)` gives the seconds a server asked to wait, or None. Errors that are not
    retryable, and the last retryable one, are raised unchanged; so is any error once the next
    wait would pass `policy.max_total_s`. `rng` and `sleep` exist for tests.
    """
    rng = rng or random.Random()
    waited = 0.0
    for failures in range(1, policy.attempts + 1):
        try:
            return await call()
        except Exception as exc:
            if failures >= policy.attempts or not retryable(exc):
                raise
            delay = policy.wait(failures, retry_after(exc), rng)
            if waited + delay > policy.max_total_s:
                log.warning("%s failed (%s); giving up: waiting budget spent", what, exc)
                raise
            log.warning(
                "%s failed (%s); attempt %d of %d, next in %.2f s",
                what,
                exc,
                failures,
                policy.attempts,
                delay,
            )
            waited += delay
            await sleep(delay)
    raise AssertionError("unreachable: the loop returns or raises")


def is_retryable_status(status: int) -> bool:
    """Whether an HTTP status is worth another attempt: 429 (rate limited) and 5xx."""
    return status == 429 or 500 <= status <= 599


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header value (delta-seconds or HTTP-date), or None.

    A date in the past gives 0; an unreadable value gives None.
    """
    value = (value or "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; "-0000" parses without a zone
        when = when.replace(tzinfo=datetime.UTC)
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)
