"""Graceful shutdown: SIGINT/SIGTERM ask a loop to finish its current work and stop.

A supervisor sends SIGTERM whenever it likes, also while a service still loads its model or
joins its group. `service_starting` remembers such an early SIGTERM instead of dying of it, and
`stop_on_signals` acts on it as soon as the service loop begins, so the service closes cleanly
and exits with status 0 whatever it was doing.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from asearcher.streams.service.log import get_logger

log = get_logger(__name__)

# Set by a SIGTERM that came while a service was starting; read when its loop begins.
_early_stop = threading.Event()


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def service_starting(name: str) -> Iterator[None]:
    """Around a whole service command: a SIGTERM no longer kills it, it stops its loop.

    SIGINT is left alone: Ctrl-C while a model loads should interrupt at once.
    """
    if not _in_main_thread():
        yield
        return

    def remember(signum: int, _frame: object) -> None:
        log.info("received %s while starting: stopping once started", signal.Signals(signum).name)
        _early_stop.set()

    previous = signal.signal(signal.SIGTERM, remember)
    log.debug("%s starting: SIGTERM from now on stops it cleanly", name)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _early_stop.clear()


@contextmanager
def stop_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """Call `stop` on SIGINT/SIGTERM while inside the block; restore the old handlers after.

    A SIGTERM that came while the service was starting calls `stop` at once. Signal handlers
    can only be installed from the main thread; elsewhere this does nothing and the owner of the
    thread is expected to call `stop` itself.
    """
    if not _in_main_thread():
        yield
        return

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s: finishing current work, then stopping", signal.Signals(signum).name)
        stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    if _early_stop.is_set():
        stop()
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
