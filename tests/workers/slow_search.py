"""A search backend plug-in that is slow on purpose, to kill a worker while a call runs."""

from __future__ import annotations

import asyncio

from asearcher.consumers.tools.backends import SearchHit


class SlowSearch:
    def __init__(self, seconds: float = 30.0) -> None:
        self.seconds = seconds

    async def search(self, query: str, k: int) -> list[SearchHit]:
        await asyncio.sleep(self.seconds)
        return [SearchHit(url="https://slow.example/1", title="Slow", snippet=query)]
