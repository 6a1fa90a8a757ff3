"""The result store: the first result of a call id wins, even when workers race."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from asearcher.consumers.tools.result_store import ResultStore
from asearcher.streams.wire.events import ToolResultReady


def result(text: str) -> ToolResultReady:
    return ToolResultReady(call_id="c1", trajectory_id="t", tool="search", text=text)


def test_racing_writers_of_one_call_id_all_get_the_first_stored_result(tmp_path: Path) -> None:
    store = ResultStore((tmp_path / "results").as_uri())
    candidates = [result(f"answer {i}" * 2000) for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        returned = list(pool.map(store.put_first, candidates))
    stored = store.get("c1")
    assert stored in candidates
    assert all(r == stored for r in returned)
    assert not list((tmp_path / "results").rglob("*.tmp"))


def test_an_unknown_call_id_has_no_result(tmp_path: Path) -> None:
    store = ResultStore((tmp_path / "results").as_uri())
    assert store.get("nope") is None
    assert store.put_first(result("x")) == store.get("c1")
