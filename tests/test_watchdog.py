"""A call that hangs past its bound ends the process with a reason, so its supervisor restarts
it; a call that returns in time changes nothing."""

from __future__ import annotations

import subprocess
import sys

from asearcher.streams.service.watchdog import STUCK_EXIT_STATUS

HANGING = """
import time
from asearcher.streams.service.watchdog import exit_if_stuck
with exit_if_stuck("send_offsets_to_transaction", {seconds}):
    time.sleep({sleep})
print("returned")
"""


def run(seconds: float, sleep: float) -> subprocess.CompletedProcess:
    code = HANGING.format(seconds=seconds, sleep=sleep)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_call_stuck_past_its_bound_exits_the_process_with_the_reason() -> None:
    done = run(seconds=0.5, sleep=30)
    assert done.returncode == STUCK_EXIT_STATUS
    assert "returned" not in done.stdout
    assert "send_offsets_to_transaction has not returned after 0s" in done.stdout + done.stderr


def test_a_call_that_returns_in_time_goes_on() -> None:
    done = run(seconds=5, sleep=0.1)
    assert done.returncode == 0 and done.stdout.strip() == "returned"
