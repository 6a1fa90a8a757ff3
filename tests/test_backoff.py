"""The shared back-off helper: attempt counts, jittered waits within their ceilings, the total
waiting budget, Retry-After, and a real HTTP exchange against a local stand-in server."""

from __future__ import annotations

import asyncio
import email.utils
import random
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import msgspec
import pytest

from asearcher.streams.service.backoff import Backoff, is_retryable_status, parse_retry_after, retry


class Flaky(Exception):
    def __init__(self, retry_after: float | None = None) -> None:
        super().__init__("flaky")
        self.retry_after = retry_after


class Fatal(Exception):
    pass


class Script:
    """A call that raises the scripted errors in turn, then returns "ok"."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


class Sleeps:
    """Records waits instead of sleeping."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


class Highest(random.Random):
    """Always draws the top of the range, so waits equal their ceilings."""

    def uniform(self, a: float, b: float) -> float:
        return b


def _run(call: Script, policy: Backoff, sleeps: Sleeps, rng: random.Random | None = None) -> str:
    return asyncio.run(
        retry(
            call,
            policy,
            retryable=lambda exc: isinstance(exc, Flaky),
            retry_after=lambda exc: getattr(exc, "retry_after", None),
            rng=rng or random.Random(7),
            sleep=sleeps,
        )
    )


def test_retry_succeeds_after_failures_with_one_wait_each() -> None:
    call, sleeps = Script(Flaky(), Flaky()), Sleeps()
    assert _run(call, Backoff(attempts=3), sleeps) == "ok"
    assert call.calls == 3 and len(sleeps.waits) == 2


def test_retry_attempts_exhausted_raises_last_error_unchanged() -> None:
    errors = [Flaky() for _ in range(4)]
    call, sleeps = Script(*errors), Sleeps()
    with pytest.raises(Flaky) as caught:
        _run(call, Backoff(attempts=4), sleeps)
    assert caught.value is errors[3] and call.calls == 4 and len(sleeps.waits) == 3


def test_retry_not_retryable_raises_at_once() -> None:
    call, sleeps = Script(Fatal()), Sleeps()
    with pytest.raises(Fatal):
        _run(call, Backoff(attempts=5), sleeps)
    assert call.calls == 1 and sleeps.waits == []


def test_retry_one_attempt_never_waits() -> None:
    call, sleeps = Script(Flaky()), Sleeps()
    with pytest.raises(Flaky):
        _run(call, Backoff(attempts=1), sleeps)
    assert call.calls == 1 and sleeps.waits == []


def test_waits_ceilings_double_up_to_the_cap() -> None:
    call, sleeps = Script(*[Flaky() for _ in range(6)]), Sleeps()
    policy = Backoff(attempts=7, base_s=0.5, cap_s=3.0, max_total_s=100.0)
    assert _run(call, policy, sleeps, Highest()) == "ok"
    assert sleeps.waits == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_waits_full_jitter_within_bounds_and_spread() -> None:
    policy = Backoff(attempts=5, base_s=1.0, cap_s=5.0, max_total_s=1000.0)
    ceilings = [1.0, 2.0, 4.0, 5.0]
    firsts = []
    for seed in range(40):
        call, sleeps = Script(*[Flaky() for _ in range(4)]), Sleeps()
        _run(call, policy, sleeps, random.Random(seed))
        assert all(0.0 <= w <= c for w, c in zip(sleeps.waits, ceilings, strict=True))
        firsts.append(sleeps.waits[0] / ceilings[0])
    # Full jitter: draws cover [0, ceiling], not a narrow band near it.
    assert min(firsts) < 0.2 and max(firsts) > 0.8


def test_total_wait_budget_ends_retries_before_passing_it() -> None:
    # Ceilings 1, 2, 4: the second wait would make 3 s > 2.5 s, so the second failure is final.
    errors = [Flaky() for _ in range(9)]
    call, sleeps = Script(*errors), Sleeps()
    policy = Backoff(attempts=10, base_s=1.0, cap_s=10.0, max_total_s=2.5)
    with pytest.raises(Flaky) as caught:
        _run(call, policy, sleeps, Highest())
    assert sleeps.waits == [1.0] and call.calls == 2 and caught.value is errors[1]


def test_retry_after_is_a_lower_bound_capped_by_cap() -> None:
    call, sleeps = Script(Flaky(retry_after=4.0), Flaky(retry_after=60.0)), Sleeps()
    policy = Backoff(attempts=3, base_s=0.01, cap_s=10.0, max_total_s=100.0)
    assert _run(call, policy, sleeps) == "ok"
    assert sleeps.waits == [4.0, 10.0]


def test_retry_after_beyond_the_budget_gives_up() -> None:
    call, sleeps = Script(Flaky(retry_after=5.0)), Sleeps()
    with pytest.raises(Flaky):
        _run(call, Backoff(attempts=3, max_total_s=4.0), sleeps)
    assert sleeps.waits == [] and call.calls == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [("attempts", 0), ("base_s", -1.0), ("cap_s", float("nan")), ("max_total_s", -0.5)],
)
def test_backoff_bad_settings_name_the_field(field: str, value: float) -> None:
    with pytest.raises(msgspec.ValidationError, match=field):
        msgspec.convert({field: value}, Backoff)


def test_backoff_huge_attempt_count_does_not_overflow() -> None:
    assert Backoff(base_s=1.0, cap_s=7.0).ceiling(5000) == 7.0


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(429, True), (500, True), (503, True), (599, True), (400, False), (404, False),
     (200, False), (600, False)],
)  # fmt: skip
def test_is_retryable_status(status: int, retryable: bool) -> None:
    assert is_retryable_status(status) is retryable


def test_parse_retry_after_seconds_dates_and_garbage() -> None:
    now = 1_700_000_000.0
    in_90_s = email.utils.formatdate(now + 90, usegmt=True)
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(" 0 ") == 0.0
    assert parse_retry_after(in_90_s, now=now) == pytest.approx(90.0)
    assert parse_retry_after(email.utils.formatdate(now - 90, usegmt=True), now=now) == 0.0
    assert parse_retry_after(email.utils.formatdate(now + 30), now=now) == pytest.approx(30.0)
    for bad in (None, "", "soon", "-5", "1.5"):
        assert parse_retry_after(bad) is None


# --- against a local stand-in HTTP server -------------------------------------------------------


class Limited:
    """A local server answering 503 (with Retry-After) `failures` times, then 200."""

    def __init__(self, failures: int, retry_after: str | None) -> None:
        self.failures, self.retry_after = failures, retry_after
        self.times: list[float] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        limited = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                limited.times.append(time.monotonic())
                failing = len(limited.times) <= limited.failures
                self.send_response(503 if failing else 200)
                if failing and limited.retry_after is not None:
                    self.send_header("Retry-After", limited.retry_after)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        return Handler


@pytest.fixture
def limited() -> Iterator[Callable[..., Limited]]:
    servers: list[Limited] = []

    def start(failures: int, retry_after: str | None = None) -> Limited:
        server = Limited(failures, retry_after)
        threading.Thread(target=server.server.serve_forever, args=(0.01,), daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.server.shutdown()
        server.server.server_close()


class StatusError(Exception):
    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.status = response.status_code
        self.retry_after = parse_retry_after(response.headers.get("retry-after"))


def _get(url: str, policy: Backoff) -> tuple[int, int]:
    calls = 0

    async def main() -> int:
        async with httpx.AsyncClient() as client:

            async def once() -> int:
                nonlocal calls
                calls += 1
                response = await client.get(url)
                if response.status_code >= 400:
                    raise StatusError(response)
                return response.status_code

            return await retry(
                once,
                policy,
                retryable=lambda exc: (
                    isinstance(exc, StatusError) and is_retryable_status(exc.status)
                ),
                retry_after=lambda exc: getattr(exc, "retry_after", None),
                what="GET",
            )

    return asyncio.run(main()), calls


def test_http_retry_after_honoured_with_real_sleeps(limited) -> None:
    server = limited(failures=1, retry_after="1")
    status, calls = _get(server.url, Backoff(attempts=3, base_s=0.0))
    assert (status, calls) == (200, 2)
    assert server.times[1] - server.times[0] >= 0.95


def test_http_attempts_and_total_wait_bounded(limited) -> None:
    server = limited(failures=100)
    started = time.monotonic()
    with pytest.raises(StatusError, match="HTTP 503"):
        _get(server.url, Backoff(attempts=4, base_s=0.05, cap_s=0.1, max_total_s=1.0))
    assert len(server.times) == 4
    # Three waits of at most 0.05, 0.1 and 0.1 s, plus the requests themselves.
    assert time.monotonic() - started < 0.25 + 1.0
