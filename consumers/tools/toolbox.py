"""The agent's two tools over pluggable backends: argument checks, chunked pages, observations.

`browse` returns the whole page, cut to `max_chunks` × `chunk_chars` characters, as numbered
chunks (`join_page_chunks`): the agent splits them (`split_page_chunks`) and feeds them to the
model one per call, as ASearcher does. With a `chunk` argument it returns that chunk alone.

`Toolbox.call(tool, arguments)` never raises for anything the agent caused or a backend did:
bad arguments, unknown tools, refused URLs, missing pages, timeouts and backend failures all
come back as an error text the agent reads.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from asearcher.consumers.tools.backends import (
    Page,
    PageReader,
    SearchBackend,
    SearchHit,
    ToolError,
    load_plugin,
)
from asearcher.consumers.tools.local_index import LocalIndex, SearchMode
from asearcher.streams.service.config_file import load_config
from asearcher.streams.service.log import get_logger
from asearcher.streams.wire.events import ToolCallRequested, ToolResultReady

log = get_logger(__name__)

# Short names for the backends that ship with asearcher; anything else is `module:Class`.
SEARCH_BACKENDS = {"serper": "asearcher.consumers.tools.web:SerperSearch"}
READERS = {
    "http": "asearcher.consumers.tools.web:HttpReader",
    "jina": "asearcher.consumers.tools.web:JinaReader",
}


class ToolConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How the tools run. Loaded from TOML; every field has a default."""

    search: Annotated[str, Meta(description="local | serper | package.module:Class")] = "local"
    search_options: Annotated[
        dict[str, Any], Meta(description="constructor options of a plugged-in search backend")
    ] = {}
    reader: Annotated[str, Meta(description="local | http | jina | package.module:Class")] = "local"
    reader_options: Annotated[
        dict[str, Any], Meta(description="constructor options of a plugged-in reader backend")
    ] = {}
    index_dir: Annotated[
        str | None, Meta(description="the local knowledge base (`asearcher index build --out`)")
    ] = None
    search_mode: Annotated[
        SearchMode, Meta(description="bm25 | dense | hybrid, for the local backend")
    ] = "hybrid"
    top_k: Annotated[int, Meta(description="search results per call (ASearcher: 5)")] = 5
    doc_chars: Annotated[
        int,
        Meta(
            description=(
                "characters of one search result's text shown to the agent (0: titles and URLs"
                " only, so every fact must be read on its page)"
            )
        ),
    ] = 5_000
    # A page is cut to max_chunks × chunk_chars characters, in chunks the agent reads one per
    # call (ASearcher: 10 × 25,000, a 250,000-character page).
    chunk_chars: Annotated[int, Meta(description="characters per page chunk when browsing")] = (
        25_000
    )
    max_chunks: Annotated[int, Meta(description="chunks of one page at most")] = 10
    call_timeout_s: Annotated[
        float, Meta(description="a call slower than this returns a timeout error")
    ] = 60.0
    max_concurrency: Annotated[int, Meta(description="calls executed at once by one worker")] = 16
    pool: Annotated[
        str, Meta(description="answer only the calls addressed to this pool (a run's name)")
    ] = ""

    def __post_init__(self) -> None:
        # Zero workers or results would not fail: the worker would wait forever or answer nothing.
        for name in ("top_k", "chunk_chars", "max_chunks", "max_concurrency"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if self.doc_chars < 0:
            raise ValueError(f"doc_chars must be at least 0, got {self.doc_chars}")
        if not 0 < self.call_timeout_s < math.inf:
            raise ValueError(
                f"call_timeout_s must be a positive, finite number of seconds, "
                f"got {self.call_timeout_s}"
            )


def load_tool_config(path: Path | None, **overrides: Any) -> ToolConfig:
    """The tool config in TOML file `path` (or the defaults), with non-None `overrides`."""
    return load_config(ToolConfig, "tool config", path, **overrides)


class LocalSearch:
    """The local knowledge base as a search backend."""

    def __init__(self, index: LocalIndex, mode: SearchMode = "hybrid") -> None:
        self.index, self.mode = index, mode

    async def search(self, query: str, k: int) -> list[SearchHit]:
        return await asyncio.to_thread(self.index.search, query, k, self.mode)


class LocalReader:
    """The local knowledge base as a page reader."""

    def __init__(self, index: LocalIndex) -> None:
        self.index = index

    async def read(self, url: str) -> Page:
        return await asyncio.to_thread(self.index.read, url)


def build_backends(config: ToolConfig) -> tuple[SearchBackend, PageReader]:
    """The search backend and page reader `config` names."""
    index = None
    if "local" in (config.search, config.reader):
        if not config.index_dir:
            raise ValueError("index_dir must name a built index for the local backends")
        index = LocalIndex(Path(config.index_dir))
    search = (
        LocalSearch(index, config.search_mode)
        if config.search == "local"
        else load_plugin(SEARCH_BACKENDS.get(config.search, config.search), **config.search_options)
    )
    reader = (
        LocalReader(index)
        if config.reader == "local"
        else load_plugin(READERS.get(config.reader, config.reader), **config.reader_options)
    )
    return search, reader


def split_chunks(text: str, size: int) -> list[str]:
    """`text` in pieces of at most `size` characters, cut at a line break where one is near.

    The pieces concatenate back to `text` exactly.
    """
    chunks, start = [], 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            newline = text.rfind("\n", start + size // 2, end)
            end = newline + 1 if newline >= 0 else end
        chunks.append(text[start:end])
        start = end
    return chunks or [""]


class Toolbox:
    """Executes `search` and `browse` calls, turning every failure into an observation."""

    def __init__(self, search: SearchBackend, reader: PageReader, config: ToolConfig) -> None:
        self.search_backend, self.reader, self.config = search, reader, config

    async def call(
        self, tool: str, arguments: dict[str, str], timeout_s: float | None = None
    ) -> tuple[str, str | None]:
        """(text, None) on success, ("", error) otherwise.

        The call may ask for a shorter time limit than the config's, never a longer one.
        """
        handler = {"search": self._search, "browse": self._browse}.get(tool)
        if handler is None:
            return "", f"unknown tool {tool!r}: the tools are search and browse"
        limit = min(timeout_s or self.config.call_timeout_s, self.config.call_timeout_s)
        try:
            text = await asyncio.wait_for(handler(arguments), limit)
        except ToolError as exc:
            return "", str(exc)
        except TimeoutError:
            return "", f"{tool} timed out after {limit:.0f}s"
        except Exception as exc:  # a backend bug must not kill the worker or the trajectory
            log.exception("%s failed", tool)
            return "", f"{tool} failed: {type(exc).__name__}: {exc}"
        return text, None

    async def _search(self, arguments: dict[str, str]) -> str:
        query = arguments.get("query", "").strip()
        if not query:
            raise ToolError("search needs a non-empty 'query'")
        hits = await self.search_backend.search(query, self.config.top_k)
        if not hits:
            return f"No results for {query!r}."
        return "\n\n".join(self._format_hit(i, hit) for i, hit in enumerate(hits, 1))

    def _format_hit(self, number: int, hit: SearchHit) -> str:
        listed = f"[{number}] {hit.title}\nURL: {hit.url}"
        chars = self.config.doc_chars
        return f"{listed}\n{hit.snippet[:chars]}" if chars else listed

    async def _browse(self, arguments: dict[str, str]) -> str:
        url = arguments.get("url", "").strip()
        if not url:
            raise ToolError("browse needs a 'url'")
        part = _chunk_number(arguments["chunk"]) if "chunk" in arguments else None
        page = await self.reader.read(url)
        chunks = page_chunks(page_text(page), self.config.chunk_chars, self.config.max_chunks)
        if part is None:
            return join_page_chunks(chunks)
        if part > len(chunks):
            raise ToolError(f"{url} has {len(chunks)} part(s); chunk {part} does not exist")
        return join_page_chunks(chunks[part - 1 : part], first=part)


def page_text(page: Page) -> str:
    """What browsing shows of `page`: its title as a heading, then its Markdown; "" if empty."""
    if not page.markdown.strip():
        return ""
    return f"# {page.title}\n\n{page.markdown}" if page.title.strip() else page.markdown


def page_chunks(text: str, chunk_chars: int, max_chunks: int) -> list[str]:
    """`text` cut to at most `max_chunks` × `chunk_chars` characters, in at most `max_chunks`
    chunks of at most `chunk_chars` (no chunk for an empty page).

    The chunks concatenate back to the start of `text`: that prefix is the page the agent reads.
    """
    if not text.strip():
        return []
    return split_chunks(text[: chunk_chars * max_chunks], chunk_chars)[:max_chunks]


def _page_marker(number: int) -> str:
    return f">>>> Page {number} >>>>\n\n"


def join_page_chunks(chunks: list[str], first: int = 1) -> str:
    """The browse output: each chunk after its marker `>>>> Page k >>>>`; no footer and no
    count, so the output never asks the model for anything. `split_page_chunks` inverts it."""
    return "".join(_page_marker(first + i) + chunk for i, chunk in enumerate(chunks))


def split_page_chunks(text: str) -> list[tuple[int, str]]:
    """The (number, chunk) pairs of a browse output; [] for text that does not start with a
    marker (an empty page, or output of some other tool).

    Markers are looked for in order (k + 1 after k), so only a page that itself contains the
    next marker's exact text can make a chunk end early; no text can add commands.
    """
    opening = re.match(r">>>> Page (\d+) >>>>\n\n", text)
    if opening is None:
        return []
    number, start, chunks = int(opening.group(1)), opening.end(), []
    while True:
        marker = _page_marker(number + 1)
        end = text.find(marker, start)
        if end < 0:
            chunks.append((number, text[start:]))
            return chunks
        chunks.append((number, text[start:end]))
        number, start = number + 1, end + len(marker)


def _chunk_number(value: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ToolError(f"chunk must be a positive integer, not {value!r}") from None
    if number < 1:
        raise ToolError(f"chunk must be a positive integer, not {value!r}")
    return number


async def answer_call(toolbox: Toolbox, call: ToolCallRequested, worker: str) -> ToolResultReady:
    """Run `call` on `toolbox` and wrap its text or error as the result event `worker` sends."""
    started = time.perf_counter()
    text, error = await toolbox.call(call.tool, call.arguments, call.timeout_s)
    return ToolResultReady(
        call_id=call.call_id,
        trajectory_id=call.trajectory_id,
        turn=call.turn,
        tool=call.tool,
        text=text,
        error=error,
        latency_s=time.perf_counter() - started,
        worker=worker,
    )
