"""The one way tests wait: poll a condition until it holds, or fail naming what never came."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    what: str | Callable[[], str], check: Callable[[], T], timeout: float, every: float = 1.0
) -> T:
    """`check()`'s first truthy value, polled every `every` seconds; AssertionError naming
    `what` (a text, or a function that describes the state at the time) after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {described}")
        time.sleep(every)
