"""The two tool backends the agent uses, as small interfaces anyone can implement.

A search backend turns a query into hits (url, title, snippet); a page reader turns a URL into
Markdown. To plug in another engine, write one class with the async method and name it in the
tool config as `package.module:ClassName` (constructor options come from the same config).
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, runtime_checkable

import msgspec


class SearchHit(msgspec.Struct, frozen=True):
    """One search result."""

    url: str
    title: str
    snippet: str


class Page(msgspec.Struct, frozen=True):
    """A page as the agent reads it."""

    url: str
    title: str
    markdown: str


class ToolError(Exception):
    """A failure the agent should read as an observation (bad URL, page missing, backend down)."""


@runtime_checkable
class SearchBackend(Protocol):
    """Finds pages for a query."""

    async def search(self, query: str, k: int) -> list[SearchHit]: ...


@runtime_checkable
class PageReader(Protocol):
    """Fetches one page as Markdown; raises `ToolError` when it cannot."""

    async def read(self, url: str) -> Page: ...


def load_plugin(spec: str, **options: Any) -> Any:
    """Instantiate `package.module:ClassName` with `options` (a one-line error if impossible)."""
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise ValueError(f"backend {spec!r} must look like package.module:ClassName")
    try:
        factory = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"backend {spec!r} cannot be loaded: {exc}") from exc
    try:
        return factory(**options)
    except TypeError as exc:  # an unknown or missing constructor option
        raise ValueError(f"backend {spec!r} cannot be built from {sorted(options)}: {exc}") from exc
