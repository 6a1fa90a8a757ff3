"""Web tools for the search agent: Serper search, and page readers that return Markdown.

Inputs are the queries and URLs the model writes; outputs are `SearchHit` lists and `Page`s.
Components:
- `fetch`: a GET that checks every redirect hop against a `UrlPolicy` and caps size and time;
- `html_to_markdown`: the readable part of an HTML page as Markdown (bs4 + markdownify);
- `with_retries`: the shared back-off (full jitter, Retry-After) on network errors, timeouts,
  429 and 5xx;
- `PageCache`: pages on any fsspec URL, shared between readers and processes;
- `HttpReader`, `JinaReader` (page readers) and `SerperSearch` (search backend), each with its own
  concurrency limit, built from config by `load_plugin("asearcher.consumers.tools.web:Name",
  **options)`.

API keys come from environment variables and travel only in request headers: they are never
logged and never part of an exception or a page.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Self, TypeVar
from urllib.parse import urljoin

import httpx
import msgspec
from bs4 import BeautifulSoup, Tag, UnicodeDammit
from markdownify import ATX, MarkdownConverter

from asearcher.consumers.tools.backends import Page, SearchHit, ToolError
from asearcher.consumers.tools.url_safety import PinnedTransport, UrlPolicy, as_policy, check_url
from asearcher.streams.service.backoff import Backoff, parse_retry_after, retry
from asearcher.streams.service.log import get_logger
from asearcher.streams.storage.sharded_store import ShardedStore

log = get_logger(__name__)

T = TypeVar("T")

DEFAULT_USER_AGENT = "Mozilla/5.0 (compatible; asearcher/0.1; research search agent)"
# Error bodies from APIs are read only this far, for their one-line message.
_ERROR_BODY_BYTES = 4096


class HttpStatusError(ToolError):
    """The server answered with a non-success status; 429 and 5xx are worth retrying."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class TransientError(ToolError):
    """A network failure or timeout: the same request may succeed a moment later."""


def is_retryable(exc: BaseException) -> bool:
    """Whether another attempt can help: network errors, timeouts, 429 and 5xx."""
    if isinstance(exc, HttpStatusError):
        return exc.status == 429 or exc.status >= 500
    return isinstance(exc, TransientError)


async def with_retries(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    max_attempts: int = 3,
    backoff_s: float = 0.5,
    max_backoff_s: float = 10.0,
) -> T:
    """`await call()`, retrying retryable `ToolError`s through the shared back-off
    (`asearcher.streams.service.backoff`: full jitter, a server's Retry-After as a lower bound, the
    total wait bounded by the attempts' ceilings). Other errors raise at once."""
    policy = Backoff(attempts=max_attempts, base_s=backoff_s, cap_s=max_backoff_s,
                     max_total_s=max_backoff_s * max_attempts)  # fmt: skip
    return await retry(call, policy, retryable=is_retryable, retry_after=_retry_after_of,
                       what=what)  # fmt: skip


def _retry_after_of(exc: BaseException) -> float | None:
    return exc.retry_after if isinstance(exc, HttpStatusError) else None


# --- HTTP exchanges ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _limits(timeout_s: float, target: str) -> AsyncIterator[None]:
    """A total time limit, with httpx errors turned into `ToolError`s the agent can read."""
    try:
        async with asyncio.timeout(timeout_s):
            yield
    except TimeoutError as exc:
        raise TransientError(f"timed out after {timeout_s:g} s: {target}") from exc
    except httpx.TransportError as exc:
        raise TransientError(f"network error: {target}: {str(exc) or type(exc).__name__}") from exc
    except httpx.HTTPError as exc:
        raise ToolError(f"HTTP error: {target}: {str(exc) or type(exc).__name__}") from exc


async def read_capped(response: httpx.Response, max_bytes: int) -> bytes:
    """The (decompressed) body of a streamed response, refused once it passes `max_bytes`."""
    refusal = f"refused: response larger than {max_bytes} bytes"
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise ToolError(refusal)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise ToolError(refusal)
        chunks.append(chunk)
    return b"".join(chunks)


def _retry_after(response: httpx.Response) -> float | None:
    return parse_retry_after(response.headers.get("retry-after"))


async def _status_error(response: httpx.Response, target: str, secret: str = "") -> HttpStatusError:
    """The error for a non-success response, with the API's own one-line message if it sent one."""
    message = f"HTTP {response.status_code} {response.reason_phrase} from {target}".rstrip()
    detail = await _error_detail(response)
    if detail:
        message = f"{message} ({detail})"
    if secret:
        # Some APIs echo the key they rejected; it must not reach the agent or the logs.
        message = message.replace(secret, "***")
    return HttpStatusError(response.status_code, message, _retry_after(response))


async def _error_detail(response: httpx.Response) -> str:
    if "json" not in response.headers.get("content-type", ""):
        return ""
    try:
        data = json.loads(await read_capped(response, _ERROR_BODY_BYTES))
    except (ToolError, ValueError, httpx.HTTPError):
        return ""
    if isinstance(data, dict):
        for key in ("readableMessage", "message"):
            if isinstance(data.get(key), str):
                return " ".join(data[key].split())[:200]
    return ""


async def fetch(client: httpx.AsyncClient, url: str, policy: UrlPolicy) -> tuple[str, bytes, str]:
    """GET `url` as (final url, body, content-type), within `policy`.

    Redirects are followed here, not by httpx, so that every hop passes `check_url`; the body is
    streamed and refused past `policy.max_bytes`; `policy.timeout_s` bounds the whole fetch.
    Raises `ToolError` (`HttpStatusError` for a non-success status).
    """
    async with _limits(policy.timeout_s, url):
        for _ in range(policy.max_redirects + 1):
            await check_url(url, policy)
            async with client.stream("GET", url, follow_redirects=False) as response:
                location = response.headers.get("location")
                if response.is_redirect and location:
                    url = str(response.url.join(location))
                    continue
                if not response.is_success:
                    raise await _status_error(response, url)
                body = await read_capped(response, policy.max_bytes)
                return str(response.url), body, response.headers.get("content-type", "")
    raise ToolError(f"refused: more than {policy.max_redirects} redirects (last: {url})")


async def _call_api(
    client: httpx.AsyncClient,
    request: httpx.Request,
    *,
    target: str,
    timeout_s: float,
    max_bytes: int,
    secret: str,
) -> bytes:
    """Send one request to a trusted API and return its body (no redirects, capped, timed)."""
    async with _limits(timeout_s, target):
        response = await client.send(request, stream=True, follow_redirects=False)
        try:
            if not response.is_success:
                raise await _status_error(response, target, secret)
            return await read_capped(response, max_bytes)
        finally:
            await response.aclose()


# --- HTML to Markdown -------------------------------------------------------------------------

_DROP_TAGS = [
    "script", "style", "noscript", "template", "nav", "aside", "form", "button", "input",
    "select", "textarea", "iframe", "svg", "canvas", "img", "picture", "video", "audio",
    "object", "embed",
]  # fmt: skip
_UNLINKED = ("javascript:", "data:", "#")
_MARKDOWN = MarkdownConverter(
    heading_style=ATX,
    bullets="-",
    escape_underscores=False,
    escape_asterisks=False,
    table_infer_header=True,
)


def html_to_markdown(html: str, url: str) -> tuple[str, str]:
    """(title, Markdown) of the readable part of an HTML page.

    Scripts, styles, navigation, site headers and footers, asides, forms and media are dropped;
    headings (ATX `#`), lists, tables and links stay, links made absolute against `url` (or the
    page's `<base href>`). The `<main>` element is used when the page has one.
    """
    soup = BeautifulSoup(html, "html.parser")
    title = _title(soup)
    base = soup.find("base", href=True)
    base_url = urljoin(url, str(base["href"])) if isinstance(base, Tag) else url
    _drop_boilerplate(soup)
    _absolutize_links(soup, base_url)
    root = soup.find("main") or soup.body or soup
    return title, _tidy(_MARKDOWN.convert_soup(root))


def _title(soup: BeautifulSoup) -> str:
    """<title>, else og:title, else the first <h1>; whitespace collapsed."""
    og = soup.find("meta", property="og:title")
    h1 = soup.find("h1")
    candidates = (
        soup.title.get_text() if soup.title else "",
        str(og.get("content") or "") if isinstance(og, Tag) else "",
        h1.get_text() if isinstance(h1, Tag) else "",
    )
    return next((" ".join(text.split()) for text in candidates if text.strip()), "")


def _drop_boilerplate(soup: BeautifulSoup) -> None:
    doomed = soup.find_all(_DROP_TAGS)
    # A <header>/<footer> inside an <article> is the article's own (title, byline), not the site's.
    doomed += [t for t in soup.find_all(["header", "footer"]) if not t.find_parent("article")]
    doomed += soup.find_all(attrs={"hidden": True}) + soup.find_all(attrs={"aria-hidden": "true"})
    doomed += soup.find_all(attrs={"role": ["navigation", "banner", "contentinfo"]})
    for tag in doomed:
        if not tag.decomposed:
            tag.decompose()


def _absolutize_links(soup: BeautifulSoup, base_url: str) -> None:
    for link in soup.find_all("a"):
        href = str(link.get("href") or "").strip()
        if not href or href.lower().startswith(_UNLINKED):
            link.unwrap()  # in-page and script links mean nothing outside the page: keep the text
        else:
            link["href"] = urljoin(base_url, href)


def _tidy(markdown: str) -> str:
    lines = [line.rstrip() for line in markdown.splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _content_type(header: str) -> tuple[str, str]:
    """(media type, charset) of a Content-Type header, both lower-case, '' when absent."""
    media, _, params = header.partition(";")
    charset = ""
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip("\"'").lower()
    with contextlib.suppress(LookupError):
        return media.strip().lower(), codecs.lookup(charset).name if charset else ""
    return media.strip().lower(), ""


def page_from_body(url: str, body: bytes, content_type: str) -> Page:
    """A `Page` from a fetched body: HTML as Markdown, plain text as is, anything else refused."""
    media, charset = _content_type(content_type)
    if not media and body.lstrip()[:1] == b"<":
        media = "text/html"  # no Content-Type at all: sniff only the obvious case
    if media in ("text/html", "application/xhtml+xml"):
        html = UnicodeDammit(body, [charset] if charset else [], is_html=True).unicode_markup
        title, markdown = html_to_markdown(html or "", url)
        return Page(url=url, title=title, markdown=markdown)
    if media in ("text/plain", "text/markdown"):
        return Page(url=url, title="", markdown=body.decode(charset or "utf-8", errors="replace"))
    raise ToolError(f"unsupported content type {media or 'unknown'} at {url}")


# --- Page cache -------------------------------------------------------------------------------


class PageCache:
    """Pages as msgspec JSON under `cache_url` (any fsspec URL), keyed by SHA-256 of the URL.

    Safe to share between readers and processes: an unreadable entry is a miss (and on a local
    disk none is ever half-written), and a cache that cannot be written only costs a refetch
    (it is logged, never raised).
    """

    def __init__(self, cache_url: str, storage_options: dict[str, Any] | None = None) -> None:
        self._store = ShardedStore(cache_url, storage_options, suffix=".json")
        self.cache_url = self._store.url

    def get(self, url: str) -> Page | None:
        """The cached page for `url`, or None."""
        try:
            return msgspec.json.decode(self._store.read(self._store.path(url)), type=Page)
        except FileNotFoundError:
            return None
        except (OSError, msgspec.DecodeError) as exc:
            log.warning("page cache entry for %s unreadable, refetching: %s", url, exc)
            return None

    def put(self, page: Page, url: str | None = None) -> None:
        """Store `page` under `url` (the URL that was asked for; default `page.url`)."""
        try:
            self._store.write(self._store.path(url or page.url), msgspec.json.encode(page))
        except OSError as exc:
            log.warning("page cache %s not writable: %s", self.cache_url, exc)


# --- Backends ---------------------------------------------------------------------------------


class _HttpBackend:
    """What every web backend shares: an httpx client per event loop, retries, a concurrency cap."""

    def __init__(
        self, *, timeout_s: float, max_attempts: int, backoff_s: float, max_concurrency: int
    ) -> None:
        if timeout_s <= 0 or max_attempts < 1 or backoff_s < 0 or max_concurrency < 1:
            raise ValueError(
                "need timeout_s > 0, max_attempts >= 1, backoff_s >= 0, max_concurrency >= 1"
            )
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_concurrency = max_concurrency
        self._client: httpx.AsyncClient | None = None
        self._slots = asyncio.Semaphore(max_concurrency)
        self._loop: asyncio.AbstractEventLoop | None = None

    def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self.timeout_s)

    def _session(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            # Connections and semaphores belong to one event loop: a backend reused under a new
            # `asyncio.run` gets fresh ones (the old client's sockets died with the old loop).
            self._client = self._new_client()
            self._slots = asyncio.Semaphore(self.max_concurrency)
            self._loop = loop
        return self._client, self._slots

    async def _call(self, what: str, attempt: Callable[[httpx.AsyncClient], Awaitable[T]]) -> T:
        """Run `attempt` with retries inside one concurrency slot (held through the backoff, so
        a struggling backend sees fewer requests, not more)."""
        client, slots = self._session()
        async with slots:
            return await with_retries(
                lambda: attempt(client),
                what=what,
                max_attempts=self.max_attempts,
                backoff_s=self.backoff_s,
            )

    async def aclose(self) -> None:
        """Close the HTTP client (a later call opens a new one)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _CachingReader(_HttpBackend):
    """A page reader: the URL policy first, then the cache, then `_read_fresh`."""

    def __init__(
        self, *, policy: UrlPolicy | dict[str, Any] | None, cache_url: str | None, **options: Any
    ) -> None:
        super().__init__(**options)
        self.policy = as_policy(policy)
        self.cache = PageCache(cache_url) if cache_url else None

    async def read(self, url: str) -> Page:
        """`url` as Markdown (from the cache when there); raises `ToolError`."""
        url = url.strip()
        # Checked before the cache too: a shared cache must not serve what this policy refuses.
        await check_url(url, self.policy)
        if self.cache is not None and (cached := await asyncio.to_thread(self.cache.get, url)):
            return cached
        page = await self._read_fresh(url)
        if self.cache is not None:
            await asyncio.to_thread(self.cache.put, page, url)
        return page

    async def _read_fresh(self, url: str) -> Page:
        raise NotImplementedError


class HttpReader(_CachingReader):
    """Reads pages with a direct GET: HTML becomes Markdown, plain text stays as it is.

    Time, size and redirect limits come from `policy`; connections go only to addresses the
    policy allows, checked when connecting (no DNS rebinding) and on every redirect hop.
    """

    def __init__(
        self,
        *,
        policy: UrlPolicy | dict[str, Any] | None = None,
        max_attempts: int = 3,
        backoff_s: float = 0.5,
        max_concurrency: int = 16,
        cache_url: str | None = None,
        user_agent: str = DEFAULT_USER_AGENT,
    ) -> None:
        policy = as_policy(policy)
        super().__init__(
            policy=policy,
            cache_url=cache_url,
            timeout_s=policy.timeout_s,
            max_attempts=max_attempts,
            backoff_s=backoff_s,
            max_concurrency=max_concurrency,
        )
        self.user_agent = user_agent

    def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=PinnedTransport(self.policy),
            timeout=self.timeout_s,
            headers={
                "User-Agent": self.user_agent,
                "Accept": "text/html,text/plain;q=0.9,*/*;q=0.1",
            },
        )

    async def _read_fresh(self, url: str) -> Page:
        final_url, body, content_type = await self._call(
            f"GET {url}", lambda client: fetch(client, url, self.policy)
        )
        return page_from_body(final_url, body, content_type)


class _JinaData(msgspec.Struct):
    title: str | None = None
    url: str | None = None
    content: str | None = None


class _JinaResponse(msgspec.Struct):
    data: _JinaData | None = None


class JinaReader(_CachingReader):
    """Reads pages through the Jina Reader API (`GET {base_url}/{url}`, JSON with Markdown).

    The key (optional) comes from the `api_key_env` variable. `policy` applies to the page URL
    the model wrote, since a self-hosted reader inside the network would fetch it for us; the
    service itself is trusted configuration. `policy.max_bytes` caps the service's response.
    """

    def __init__(
        self,
        *,
        base_url: str = "https://r.jina.ai",
        api_key_env: str = "JINA_API_KEY",
        timeout_s: float = 30.0,
        max_attempts: int = 3,
        backoff_s: float = 0.5,
        max_concurrency: int = 8,
        cache_url: str | None = None,
        policy: UrlPolicy | dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            policy=policy,
            cache_url=cache_url,
            timeout_s=timeout_s,
            max_attempts=max_attempts,
            backoff_s=backoff_s,
            max_concurrency=max_concurrency,
        )
        self.base_url = base_url.rstrip("/")
        self._key = os.environ.get(api_key_env, "").strip()
        self._headers = {"Accept": "application/json"}
        if self._key:
            self._headers["Authorization"] = f"Bearer {self._key}"

    async def _read_fresh(self, url: str) -> Page:
        target = f"reader service for {url}"

        async def attempt(client: httpx.AsyncClient) -> bytes:
            request = client.build_request("GET", f"{self.base_url}/{url}", headers=self._headers)
            return await _call_api(
                client,
                request,
                target=target,
                timeout_s=self.timeout_s,
                max_bytes=self.policy.max_bytes,
                secret=self._key,
            )

        body = await self._call(f"read {url} via {self.base_url}", attempt)
        try:
            data = msgspec.json.decode(body, type=_JinaResponse).data
        except msgspec.DecodeError as exc:
            raise ToolError(f"reader service returned malformed JSON for {url}") from exc
        if data is None or not data.content:
            raise ToolError(f"reader service returned no content for {url}")
        return Page(url=data.url or url, title=data.title or "", markdown=data.content)


class _SerperHit(msgspec.Struct):
    title: str = ""
    link: str = ""
    snippet: str = ""


class _SerperResponse(msgspec.Struct):
    organic: list[_SerperHit] = []


class SerperSearch(_HttpBackend):
    """Google results through Serper (`POST {base_url}/search`), key from `api_key_env`."""

    def __init__(
        self,
        *,
        base_url: str = "https://google.serper.dev",
        api_key_env: str = "SERPER_API_KEY",
        timeout_s: float = 15.0,
        max_attempts: int = 3,
        backoff_s: float = 0.5,
        max_concurrency: int = 8,
        max_bytes: int = 2_000_000,
    ) -> None:
        super().__init__(
            timeout_s=timeout_s,
            max_attempts=max_attempts,
            backoff_s=backoff_s,
            max_concurrency=max_concurrency,
        )
        self._key = os.environ.get(api_key_env, "").strip()
        if not self._key:
            raise ValueError(f"SerperSearch needs an API key in the {api_key_env} variable")
        self.base_url = base_url.rstrip("/")
        self.max_bytes = max_bytes

    async def search(self, query: str, k: int) -> list[SearchHit]:
        """The top `k` (1..100) organic results for `query`; raises `ToolError`."""
        query = " ".join(query.split())
        if not query:
            raise ToolError("refused: empty search query")
        k = min(max(k, 1), 100)

        async def attempt(client: httpx.AsyncClient) -> bytes:
            request = client.build_request(
                "POST",
                f"{self.base_url}/search",
                headers={"X-API-KEY": self._key},
                json={"q": query, "num": k},
            )
            return await _call_api(
                client,
                request,
                target="search backend",
                timeout_s=self.timeout_s,
                max_bytes=self.max_bytes,
                secret=self._key,
            )

        body = await self._call(f"search {query!r}", attempt)
        try:
            organic = msgspec.json.decode(body, type=_SerperResponse).organic
        except msgspec.DecodeError as exc:
            raise ToolError("search backend returned malformed JSON") from exc
        hits = [SearchHit(url=h.link, title=h.title, snippet=h.snippet) for h in organic if h.link]
        return hits[:k]
