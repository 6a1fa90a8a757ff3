"""Web tools against a real local HTTP server: readers, search, retries, limits and URL safety."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from asearcher.consumers.tools.backends import (
    Page,
    PageReader,
    SearchBackend,
    ToolError,
    load_plugin,
)
from asearcher.consumers.tools.url_safety import PinnedTransport, UrlPolicy, check_url
from asearcher.consumers.tools.web import (
    HttpReader,
    HttpStatusError,
    JinaReader,
    PageCache,
    SerperSearch,
    TransientError,
    fetch,
    html_to_markdown,
    with_retries,
)

SERPER_KEY = "serper-test-key-123"
JINA_KEY = "jina-test-key-456"

ARTICLE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Why the log is the database</title>
<style>body { font-family: serif }</style>
<script>window.tracker = "SCRIPT_TEXT";</script></head>
<body>
<header class="site"><a href="/">Home</a> SITE_HEADER</header>
<nav><ul><li><a href="/blog">NAV_BLOG</a></li><li><a href="/about">NAV_ABOUT</a></li></ul></nav>
<main><article>
<header><h1>Why the log is the database</h1><p>By Ada Lovelace</p></header>
<p>A <strong>log</strong> is an append-only sequence. Read <a href="../docs/intro">the intro</a>
or <a href="https://example.org/paper">the paper</a>, or <a href="#props">skip ahead</a>.</p>
<h2 id="props">Properties</h2>
<ul><li>Ordered per partition</li><li>Durable<ul><li>Replicated</li></ul></li></ul>
<ol><li>Write</li><li>Read</li></ol>
<h3>Throughput</h3>
<table><thead><tr><th>System</th><th>Messages/s</th></tr></thead>
<tbody><tr><td>Kafka</td><td>1000000</td></tr><tr><td>snake_case_db</td><td>10000</td></tr></tbody>
</table>
<form action="/subscribe"><input name="email"><button>FORM_SUBSCRIBE</button></form>
<aside>ASIDE_ADVERT</aside><noscript>NOSCRIPT_TEXT</noscript>
</article></main>
<footer>FOOTER_COPYRIGHT</footer>
<script>console.log("SCRIPT_TEXT")</script>
</body></html>"""

ORGANIC = [
    {"title": f"Result {i}", "link": f"https://example.com/{i}", "snippet": f"Snippet {i}",
     "position": i}
    for i in range(1, 6)
]  # fmt: skip


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hits: Counter[str] = Counter()
        self.bodies: list[Any] = []
        self.headers_seen: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients hanging up on the endless and slow paths is the point of those tests


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, data: Any) -> None:
        self._send(status, json.dumps(data).encode(), "application/json")

    def do_GET(self) -> None:
        path = self.path
        with self.server.lock:
            self.server.hits[path] += 1
            count = self.server.hits[path]
            self.server.headers_seen.append(dict(self.headers))
        if path.startswith("/jina/"):
            return self._jina(path.removeprefix("/jina/"))
        route = {
            "/article": lambda: self._send(200, ARTICLE.encode(), "text/html; charset=utf-8"),
            "/plain": lambda: self._send(200, b"just *text*\n", "text/plain; charset=utf-8"),
            "/pdf": lambda: self._send(200, b"%PDF-1.7", "application/pdf"),
            "/missing": lambda: self._json(404, {"message": "no such page"}),
            "/redirect-relative": lambda: self._send(302, b"", "text/plain", Location="/article"),
            "/redirect-loop": lambda: self._send(302, b"", "text/plain", Location="/redirect-loop"),
            "/endless": self._endless,
            "/slow": lambda: self._slow(2.0),
            "/busy": lambda: self._slow(0.1),
        }.get(path)
        if path == "/flaky":
            if count <= 2:
                return self._send(503, b"try later", "text/plain")
            return self._send(200, ARTICLE.encode(), "text/html")
        if path == "/redirect-loopback":
            port = self.server.server_address[1]
            target = f"http://localhost:{port}/secret"
            return self._send(302, b"", "text/plain", Location=target)
        if route is None:
            return self._send(404, b"not found", "text/plain")
        route()

    def do_POST(self) -> None:
        with self.server.lock:
            self.server.hits[self.path] += 1
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"null")
        self.server.bodies.append(body)
        key = self.headers.get("X-API-KEY", "")
        if self.path != "/search":
            return self._json(404, {"message": "not found"})
        if key != SERPER_KEY:
            # A server that echoes the rejected key: the client must scrub it.
            return self._json(403, {"message": f"Unauthorized: key {key} is not valid"})
        self._json(200, {"searchParameters": body, "organic": ORGANIC[: body["num"]]})

    def _jina(self, target: str) -> None:
        if self.headers.get("Authorization") != f"Bearer {JINA_KEY}":
            return self._json(401, {"message": "bad key"})
        if self.headers.get("Accept") != "application/json":
            return self._json(406, {"message": "want json"})
        data = {"title": "Jina title", "url": target, "content": f"# Jina\n\nMarkdown of {target}"}
        self._json(200, {"code": 200, "status": 20000, "data": data})

    def _endless(self) -> None:
        # No Content-Length, so only the client's running count can stop it.
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        chunk = b"<p>" + b"x" * 16_384 + b"</p>"
        for _ in range(10_000):  # bounded anyway, should the client misbehave
            self.wfile.write(chunk)

    def _slow(self, seconds: float) -> None:
        with self.server.lock:
            self.server.in_flight += 1
            self.server.max_in_flight = max(self.server.max_in_flight, self.server.in_flight)
        time.sleep(seconds)
        with self.server.lock:
            self.server.in_flight -= 1
        self._send(200, b"<html><body><p>slow</p></body></html>", "text/html")


class Site:
    """The running test server and what it saw."""

    def __init__(self, server: _Server) -> None:
        self.server = server
        self.port = server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.policy = UrlPolicy(allowed_hosts=[f"127.0.0.1:{self.port}"], timeout_s=5.0)

    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    def hits(self, path: str) -> int:
        return self.server.hits[path]


@pytest.fixture
def site() -> Iterator[Site]:
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield Site(server)
    finally:
        server.shutdown()
        server.server_close()


def _reader(site: Site, **options: Any) -> HttpReader:
    return HttpReader(policy=site.policy, backoff_s=0.001, **options)


def _read(reader: HttpReader | JinaReader, url: str) -> Page:
    async def go() -> Page:
        async with reader:
            return await reader.read(url)

    return asyncio.run(go())


def _refusal(coro: Any) -> str:
    with pytest.raises(ToolError) as info:
        asyncio.run(coro)
    return str(info.value)


# --- URL safety -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("file:///etc/passwd", "refused: file:// URLs are not fetched"),
        ("ftp://x", "refused: ftp:// URLs are not fetched"),
        ("http://127.0.0.1/", "refused: 127.0.0.1 is a loopback address"),
        ("http://[::1]/", "refused: ::1 is a loopback address"),
        ("http://[::ffff:127.0.0.1]/", "refused: ::ffff:127.0.0.1 is a loopback address"),
        ("http://169.254.169.254/latest/meta-data", "is a link-local address"),
        ("http://10.1.2.3/", "refused: 10.1.2.3 is a private address"),
        ("http://[fd00::1]/", "refused: fd00::1 is a unique-local address"),
        ("http://0.0.0.0/", "refused: 0.0.0.0 is an unspecified address"),
        ("http://localhost/", "refused: host localhost resolves to loopback address"),
        ("http://user:pass@example.com/", "refused: URLs with credentials"),
        ("not a url", "not an absolute http(s) URL"),
    ],
)
def test_check_url_unsafe_url_refused_with_reason(url: str, reason: str) -> None:
    assert reason in _refusal(check_url(url, UrlPolicy()))


def test_check_url_host_resolving_private_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_dns(monkeypatch, {"intranet.example": ["192.168.1.7"]})
    message = _refusal(check_url("https://intranet.example/wiki", UrlPolicy()))
    assert message == "refused: host intranet.example resolves to private address 192.168.1.7"


def test_check_url_any_private_address_among_public_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_dns(monkeypatch, {"mixed.example": ["93.184.216.34", "10.0.0.5"]})
    assert "private address 10.0.0.5" in _refusal(check_url("http://mixed.example/", UrlPolicy()))


def test_check_url_public_ip_literal_passes() -> None:
    asyncio.run(check_url("http://93.184.216.34/", UrlPolicy()))
    asyncio.run(check_url("https://[2606:4700::1111]/dns-query", UrlPolicy()))


def test_check_url_allowed_host_or_allow_private_passes() -> None:
    asyncio.run(check_url("http://127.0.0.1:8123/x", UrlPolicy(allowed_hosts=["127.0.0.1:8123"])))
    asyncio.run(check_url("http://10.1.2.3/", UrlPolicy(allow_private=True)))
    assert "loopback" in _refusal(
        check_url("http://127.0.0.1:9999/x", UrlPolicy(allowed_hosts=["127.0.0.1:8123"]))
    )


def test_reader_local_server_without_exception_refused(site: Site) -> None:
    assert "127.0.0.1 is a loopback address" in _refusal(check_url(site.url("/"), UrlPolicy()))
    message = _refusal(HttpReader(policy=UrlPolicy()).read(site.url("/article")))
    assert "loopback" in message
    assert site.hits("/article") == 0


def test_pinned_transport_connection_to_loopback_refused(site: Site) -> None:
    async def get(policy: UrlPolicy) -> int:
        async with httpx.AsyncClient(transport=PinnedTransport(policy)) as client:
            return (await client.get(site.url("/plain"))).status_code

    assert "loopback" in _refusal(get(UrlPolicy()))
    assert asyncio.run(get(site.policy)) == 200


def test_pinned_transport_name_resolving_to_loopback_refused(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DNS rebinding: whatever a pre-flight check saw, the connection itself re-checks the address.
    _fake_dns(monkeypatch, {"rebind.example": ["127.0.0.1"]})
    url = f"http://rebind.example:{site.port}/plain"

    async def get(transport: httpx.AsyncBaseTransport | None) -> int:
        async with httpx.AsyncClient(transport=transport) as client:
            return (await client.get(url)).status_code

    assert asyncio.run(get(None)) == 200  # an unpinned client does reach our server
    message = _refusal(get(PinnedTransport(UrlPolicy())))
    assert message == "refused: host rebind.example resolves to loopback address 127.0.0.1"
    assert site.hits("/plain") == 1


# --- Direct HTTP reader -----------------------------------------------------------------------


def test_html_to_markdown_article_keeps_content_drops_boilerplate() -> None:
    title, markdown = html_to_markdown(ARTICLE, "https://blog.example/posts/log.html")
    assert title == "Why the log is the database"
    assert markdown.startswith("# Why the log is the database")
    assert "## Properties" in markdown and "### Throughput" in markdown
    assert "- Ordered per partition" in markdown and "  - Replicated" in markdown
    assert "1. Write\n2. Read" in markdown
    assert "[the intro](https://blog.example/docs/intro)" in markdown
    assert "[the paper](https://example.org/paper)" in markdown
    assert "skip ahead" in markdown and "#props" not in markdown
    assert "| System | Messages/s |" in markdown and "| snake_case_db | 10000 |" in markdown
    for boilerplate in ("SCRIPT", "SITE_HEADER", "NAV_", "FORM_", "ASIDE_", "NOSCRIPT", "FOOTER"):
        assert boilerplate not in markdown
    assert "\n\n\n" not in markdown


def test_http_reader_article_returns_markdown_page(site: Site) -> None:
    page = _read(_reader(site), site.url("/article"))
    assert page.url == site.url("/article")
    assert page.title == "Why the log is the database"
    assert f"[the intro]({site.base}/docs/intro)" in page.markdown
    assert "SCRIPT_TEXT" not in page.markdown
    assert "asearcher" in site.server.headers_seen[0]["User-Agent"]


def test_http_reader_plain_text_returned_as_is(site: Site) -> None:
    assert _read(_reader(site), site.url("/plain")).markdown == "just *text*\n"


def test_http_reader_pdf_unsupported_content_type(site: Site) -> None:
    assert "unsupported content type application/pdf" in _refusal(
        _reader(site).read(site.url("/pdf"))
    )


def test_http_reader_503_twice_retried_until_success(site: Site) -> None:
    page = _read(_reader(site), site.url("/flaky"))
    assert page.title == "Why the log is the database"
    assert site.hits("/flaky") == 3


def test_http_reader_404_not_retried(site: Site) -> None:
    message = _refusal(_reader(site).read(site.url("/missing")))
    assert "404" in message and "/missing" in message
    assert site.hits("/missing") == 1


def test_http_reader_relative_redirect_followed(site: Site) -> None:
    page = _read(_reader(site), site.url("/redirect-relative"))
    assert page.url == site.url("/article")


def test_http_reader_redirect_to_loopback_refused(site: Site) -> None:
    message = _refusal(_reader(site).read(site.url("/redirect-loopback")))
    assert message.startswith("refused: host localhost resolves to loopback address")
    assert site.hits("/secret") == 0


def test_http_reader_redirect_loop_refused(site: Site) -> None:
    policy = UrlPolicy(allowed_hosts=site.policy.allowed_hosts, max_redirects=3)
    assert "more than 3 redirects" in _refusal(
        HttpReader(policy=policy).read(site.url("/redirect-loop"))
    )
    assert site.hits("/redirect-loop") == 4


def test_fetch_endless_body_cut_with_refusal(site: Site) -> None:
    policy = UrlPolicy(allowed_hosts=site.policy.allowed_hosts, max_bytes=100_000)

    async def go() -> tuple[str, bytes, str]:
        async with httpx.AsyncClient() as client:
            return await fetch(client, site.url("/endless"), policy)

    assert _refusal(go()) == "refused: response larger than 100000 bytes"


def test_http_reader_slow_server_times_out(site: Site) -> None:
    policy = UrlPolicy(allowed_hosts=site.policy.allowed_hosts, timeout_s=0.3)
    started = time.monotonic()
    message = _refusal(HttpReader(policy=policy, max_attempts=1).read(site.url("/slow")))
    assert "timed out after 0.3 s" in message
    assert time.monotonic() - started < 1.5


def test_http_reader_concurrency_capped_per_instance(site: Site) -> None:
    reader = _reader(site, max_concurrency=2)

    async def go() -> list[Page]:
        async with reader:
            return await asyncio.gather(*(reader.read(site.url("/busy")) for _ in range(6)))

    assert len(asyncio.run(go())) == 6
    assert site.server.max_in_flight == 2


def test_http_reader_second_read_served_from_cache(site: Site, tmp_path: Path) -> None:
    reader = _reader(site, cache_url=f"file://{tmp_path}/pages")

    async def go() -> tuple[Page, Page]:
        async with reader:
            return await reader.read(site.url("/article")), await reader.read(site.url("/article"))

    first, second = asyncio.run(go())
    assert first == second
    assert site.hits("/article") == 1
    assert PageCache(f"file://{tmp_path}/pages").get(site.url("/article")) == first


def test_page_cache_corrupt_entry_is_a_miss(tmp_path: Path) -> None:
    cache = PageCache(str(tmp_path))
    page = Page(url="https://example.com/", title="t", markdown="m")
    cache.put(page)
    assert cache.get("https://example.com/") == page
    for entry in tmp_path.rglob("*.json"):
        entry.write_bytes(b"{not json")
    assert cache.get("https://example.com/") is None
    assert cache.get("https://example.com/other") is None


# --- Retries ----------------------------------------------------------------------------------


def test_with_retries_transient_errors_until_attempts_exhausted() -> None:
    calls: list[int] = []

    async def failing() -> None:
        calls.append(1)
        raise TransientError("connection reset")

    with pytest.raises(TransientError):
        asyncio.run(with_retries(failing, what="test", max_attempts=4, backoff_s=0.001))
    assert len(calls) == 4


def test_with_retries_429_retried_400_not() -> None:
    statuses = iter([429, 400])

    async def call() -> None:
        status = next(statuses)
        raise HttpStatusError(status, f"HTTP {status}")

    with pytest.raises(HttpStatusError) as info:
        asyncio.run(with_retries(call, what="test", max_attempts=5, backoff_s=0.001))
    assert info.value.status == 400


# --- Jina reader ------------------------------------------------------------------------------


def _jina(site: Site, monkeypatch: pytest.MonkeyPatch, key: str = JINA_KEY) -> JinaReader:
    # The target URL is checked here, so its host must resolve (to a public address) offline too.
    _fake_dns(monkeypatch, {"example.com": ["93.184.216.34"], "a.example": ["93.184.216.35"]})
    monkeypatch.setenv("JINA_API_KEY", key)
    return JinaReader(base_url=site.url("/jina"), backoff_s=0.001)


def test_jina_reader_json_becomes_page(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    page = _read(_jina(site, monkeypatch), "https://example.com/post")
    assert page == Page(
        url="https://example.com/post",
        title="Jina title",
        markdown="# Jina\n\nMarkdown of https://example.com/post",
    )
    assert site.hits("/jina/https://example.com/post") == 1
    assert JINA_KEY not in repr(page)


def test_jina_reader_private_target_refused_without_request(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = _refusal(_jina(site, monkeypatch).read("http://169.254.169.254/latest/meta-data"))
    assert message == "refused: 169.254.169.254 is a link-local address"
    assert sum(site.server.hits.values()) == 0


def test_jina_reader_rejected_key_not_retried(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    message = _refusal(_jina(site, monkeypatch, key="wrong-jina-key").read("https://a.example/"))
    assert "401" in message and "wrong-jina-key" not in message
    assert site.hits("/jina/https://a.example/") == 1


# --- Serper search ----------------------------------------------------------------------------


def _serper(site: Site, monkeypatch: pytest.MonkeyPatch, key: str = SERPER_KEY) -> SerperSearch:
    monkeypatch.setenv("SERPER_API_KEY", key)
    return load_plugin(
        "asearcher.consumers.tools.web:SerperSearch", base_url=site.base, backoff_s=0.001
    )


def test_serper_search_top_k_hits(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    search = _serper(site, monkeypatch)
    assert isinstance(search, SearchBackend)
    hits = asyncio.run(search.search("  kafka   log ", 3))
    assert [hit.url for hit in hits] == [f"https://example.com/{i}" for i in (1, 2, 3)]
    assert hits[0].title == "Result 1" and hits[0].snippet == "Snippet 1"
    assert site.server.bodies == [{"q": "kafka log", "num": 3}]


def test_serper_search_rejected_key_scrubbed_not_retried(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    search = _serper(site, monkeypatch, key="leaky-key-789")
    message = _refusal(search.search("kafka", 5))
    assert "403" in message and "Unauthorized" in message
    assert "leaky-key-789" not in message
    assert site.hits("/search") == 1


def test_serper_search_missing_key_fails_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    with pytest.raises(ValueError, match="SERPER_API_KEY"):
        load_plugin("asearcher.consumers.tools.web:SerperSearch")


def test_readers_built_from_config_dict_are_page_readers(tmp_path: Path) -> None:
    options = {"policy": {"allowed_hosts": ["127.0.0.1:1"]}, "cache_url": str(tmp_path)}
    reader = load_plugin("asearcher.consumers.tools.web:HttpReader", **options)
    assert isinstance(reader, PageReader) and reader.policy.allowed_hosts == ["127.0.0.1:1"]
    assert isinstance(
        load_plugin("asearcher.consumers.tools.web:JinaReader", **options), PageReader
    )
    with pytest.raises(ValueError, match="max_bytes"):
        load_plugin("asearcher.consumers.tools.web:HttpReader", policy={"max_bytes": "lots"})


# --- Helpers ----------------------------------------------------------------------------------


def _fake_dns(monkeypatch: pytest.MonkeyPatch, table: dict[str, Any]) -> None:
    """Answer `getaddrinfo` for the hosts in `table` (a list of IPs or a callable giving one)."""
    real = asyncio.base_events.BaseEventLoop.getaddrinfo

    async def getaddrinfo(self: Any, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        # anyio (the unpinned httpx path) asks with the IDNA-encoded name as bytes.
        answer = table.get(host.decode() if isinstance(host, bytes) else host)
        if answer is None:
            return await real(self, host, port, *args, **kwargs)
        addresses = answer() if callable(answer) else answer
        return [
            (
                socket.AF_INET6 if ":" in ip else socket.AF_INET,
                socket.SOCK_STREAM,
                6,
                "",
                (ip, port),
            )
            for ip in addresses
        ]

    monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "getaddrinfo", getaddrinfo)
