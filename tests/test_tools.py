"""The local knowledge base and the toolbox: retrieval quality, chunked browsing, error texts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from asearcher.consumers.tools.backends import SearchHit, ToolError, load_plugin
from asearcher.consumers.tools.local_index import LocalIndex, build_index, rrf
from asearcher.consumers.tools.toolbox import (
    LocalReader,
    LocalSearch,
    Toolbox,
    ToolConfig,
    load_tool_config,
    split_chunks,
    split_page_chunks,
)


def toolbox(index: LocalIndex, **config) -> Toolbox:
    cfg = ToolConfig(**config)
    return Toolbox(LocalSearch(index, cfg.search_mode), LocalReader(index), cfg)


def recall_at_5(index: LocalIndex, questions, mode: str) -> float:
    found = 0
    for q in questions:
        urls = [hit.url for hit in index.search(q.question, 5, mode)]
        found += q.supporting_urls[0] in urls
    return found / len(questions)


def test_search_finds_the_supporting_page_of_single_hop_questions(world_index) -> None:
    world, index = world_index
    single_hop = [q for q in world.questions if q.hops == 1]
    assert len(single_hop) >= 30
    recall = {mode: recall_at_5(index, single_hop, mode) for mode in ("bm25", "dense", "hybrid")}
    print(f"\nrecall@5 on {len(single_hop)} single-hop questions: {recall}")
    assert recall["hybrid"] >= 0.9
    assert recall["bm25"] > 0.5 and recall["dense"] > 0.3  # both parts retrieve on their own


def test_index_build_resumes_and_rejects_a_bad_corpus(world_index, tmp_path: Path) -> None:
    world, index = world_index
    again = build_index(Path(index.manifest.corpus), index.directory, dense=True)
    assert again.stages == ["pages", "bm25", "dense"] and again.pages == len(world.pages)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"url": "u", "title": "t", "contents": "c"}\n{"url": 3}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        build_index(bad, tmp_path / "out")


def test_browse_returns_the_page_and_chunks_cover_it_exactly_once(world_index) -> None:
    world, index = world_index
    page = max(world.pages, key=lambda p: len(p.contents))
    box = toolbox(index, chunk_chars=400, max_chunks=1000)
    whole, error = asyncio.run(box.call("browse", {"url": page.url}))
    assert error is None and "more part" not in whole and "chunk=" not in whole  # no footer
    chunks = split_page_chunks(whole)
    assert len(chunks) >= 3 and [number for number, _ in chunks] == list(range(1, len(chunks) + 1))
    one_by_one = []
    for number, chunk in chunks:
        text, error = asyncio.run(box.call("browse", {"url": page.url, "chunk": str(number)}))
        assert error is None and split_page_chunks(text) == [(number, chunk)]
        one_by_one.append(chunk)
    assert page.contents in "".join(one_by_one)


def test_split_chunks_concatenate_back_and_respect_the_size() -> None:
    text = "".join(f"line {i} " * (i % 7 + 1) + "\n" for i in range(500))
    for size in (50, 333, 10_000):
        chunks = split_chunks(text, size)
        assert "".join(chunks) == text
        assert all(0 < len(c) <= size for c in chunks)
    assert split_chunks("", 10) == [""]


def test_search_results_show_title_url_and_a_snippet_within_limits(world_index) -> None:
    world, index = world_index
    question = next(q for q in world.questions if q.hops == 1)
    text, error = asyncio.run(
        toolbox(index, doc_chars=120).call("search", {"query": question.question})
    )
    assert error is None
    entries = text.split("\n\n")
    assert len(entries) == 5 and entries[0].startswith("[1] ")
    assert all(e.splitlines()[1].startswith("URL: https://") for e in entries)
    assert all(len(e.splitlines()[2]) <= 120 for e in entries)


def test_search_results_without_text_list_titles_and_urls_only(world_index) -> None:
    world, index = world_index
    question = next(q for q in world.questions if q.hops == 1)
    query = {"query": question.question}
    text, error = asyncio.run(toolbox(index, doc_chars=0).call("search", query))
    with_text, _ = asyncio.run(toolbox(index, doc_chars=120).call("search", query))
    assert error is None
    entries = text.split("\n\n")
    assert len(entries) == 5 and all(len(e.splitlines()) == 2 for e in entries)
    # The same hits, in the same order, less their text.
    assert entries == ["\n".join(e.splitlines()[:2]) for e in with_text.split("\n\n")]
    with pytest.raises(ValueError, match="doc_chars must be at least 0, got -1"):
        ToolConfig(doc_chars=-1)


class SlowSearch:
    """A user's plug-in backend that hangs."""

    def __init__(self, seconds: float = 5.0) -> None:
        self.seconds = seconds

    async def search(self, query: str, k: int) -> list[SearchHit]:
        await asyncio.sleep(self.seconds)
        return []


def test_every_failure_is_an_error_observation_not_an_exception(world_index) -> None:
    _, index = world_index
    box = toolbox(index)
    calls = {
        ("fly", ()): "unknown tool 'fly'",
        ("search", ()): "search needs a non-empty 'query'",
        ("browse", ()): "browse needs a 'url'",
        ("browse", (("url", "https://nowhere.local/x"),)): "no page at https://nowhere.local/x",
        ("browse", (("url", "u"), ("chunk", "zero"))): "chunk must be a positive integer",
    }
    for (tool, args), expected in calls.items():
        text, error = asyncio.run(box.call(tool, dict(args)))
        assert text == "" and expected in error
    slow = Toolbox(
        load_plugin("tests.test_tools:SlowSearch", seconds=2.0), LocalReader(index),
        ToolConfig(call_timeout_s=0.2),
    )  # fmt: skip
    assert asyncio.run(slow.call("search", {"query": "x"})) == ("", "search timed out after 0s")


def test_plugins_and_configs_fail_with_a_clear_message(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must look like package.module:ClassName"):
        load_plugin("nonsense")
    with pytest.raises(ValueError, match="cannot be loaded"):
        load_plugin("asearcher.nothing:Here")
    config = tmp_path / "tools.toml"
    config.write_text('search = "local"\ntop_k = "five"\n')
    with pytest.raises(ValueError, match="top_k"):
        load_tool_config(config)
    config.write_text('search_mode = "bm25"\ntop_k = 3\n')
    assert load_tool_config(config, top_k=7).top_k == 7
    with pytest.raises(ToolError):
        raise ToolError("observations are exceptions only inside the toolbox")


def test_reciprocal_rank_fusion_prefers_documents_ranked_well_by_both() -> None:
    assert rrf([[1, 2, 3], [3, 1, 4]], 3) == [1, 3, 2]
