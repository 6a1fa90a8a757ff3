"""Exit a service whose call into a client library hangs past any bound it was given.

librdkafka can block forever in `send_offsets_to_transaction` although it was given a timeout,
when the group coordinator went away and came back (confluentinc/librdkafka#5456 and #5511,
open against the 2.x releases we use; seen here in chaos runs that restart the broker). No
exception ever comes, so the service would sit silent for good. A supervised service is better
off dead: its restart fences the stuck transaction, which is aborted, and its input is consumed
again from the last commit, so nothing is lost or counted twice.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from asearcher.streams.service.log import get_logger

log = get_logger(__name__)
STUCK_EXIT_STATUS = 75  # EX_TEMPFAIL: try again (the supervisor restarts the service)


@contextmanager
def exit_if_stuck(what: str, seconds: float) -> Iterator[None]:
    """Run the body; if it has not returned after `seconds`, log why and exit the process."""
    timer = threading.Timer(seconds, _exit_stuck, args=(what, seconds))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _exit_stuck(what: str, seconds: float) -> None:
    log.critical(
        "%s has not returned after %.0fs although it was bounded (librdkafka #5456): exiting "
        "with status %d so that the supervisor restarts this service; the restart fences the "
        "stuck transaction",
        what, seconds, STUCK_EXIT_STATUS,
    )  # fmt: skip
    logging.shutdown()
    os._exit(STUCK_EXIT_STATUS)
