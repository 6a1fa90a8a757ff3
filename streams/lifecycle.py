"""Graceful shutdown: SIGINT/SIGTERM ask a loop to finish its current work and stop."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from asearcher.streams.log import get_logger

log = get_logger(__name__)


@contextmanager
def stop_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """Call `stop` on SIGINT/SIGTERM while inside the block; restore the old handlers after.

    Signal handlers can only be installed from the main thread; elsewhere this does nothing and
    the owner of the thread is expected to call `stop` itself.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s: finishing current work, then stopping", signal.Signals(signum).name)
        stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
