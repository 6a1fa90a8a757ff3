"""Pages read whole: the browse tool returns every chunk of the cut page, the agent feeds them."""

from __future__ import annotations

import asyncio

from asearcher.consumers.tools.backends import Page
from asearcher.consumers.tools.toolbox import (
    Toolbox,
    ToolConfig,
    page_chunks,
    page_text,
    split_page_chunks,
)
from asearcher.producers.agents.agent import AgentConfig, run_trajectory
from asearcher.producers.agents.prompt import NO_PAGE, SHORT_CHUNK_CHARS
from asearcher.producers.engines.base import ScriptedEngine
from asearcher.producers.rollout.tool_router import InProcessToolClient
from asearcher.streams.wire.events import RolloutRequested, SamplingSettings

URL = "https://pages.local/long"


def long_markdown(chars: int) -> str:
    lines, size, i = [], 0, 0
    while size < chars:
        line = f"line {i}: " + "lorem ipsum " * (i % 9 + 1) + "\n"
        lines.append(line)
        size, i = size + len(line), i + 1
    return "".join(lines)


class OnePage:
    """A reader with one page at URL (and none elsewhere)."""

    def __init__(self, markdown: str, title: str = "A Long Page") -> None:
        self.page = Page(url=URL, title=title, markdown=markdown)

    async def read(self, url: str) -> Page:
        return self.page


class NoSearch:
    async def search(self, query: str, k: int) -> list:
        return []


def browse(box: Toolbox, **arguments: str) -> str:
    text, error = asyncio.run(box.call("browse", {"url": URL, **arguments}))
    assert error is None, error
    return text


def test_every_chunk_of_a_long_page_comes_back_and_they_make_up_the_cut_page() -> None:
    config = ToolConfig()  # 10 chunks of 25,000 characters: a 250,000-character page at most
    reader = OnePage(long_markdown(400_000))
    box = Toolbox(NoSearch(), reader, config)
    output = browse(box)
    chunks = split_page_chunks(output)
    assert [number for number, _ in chunks] == list(range(1, config.max_chunks + 1))
    assert all(0 < len(chunk) <= config.chunk_chars for _, chunk in chunks)
    whole = "".join(chunk for _, chunk in chunks)
    text = page_text(reader.page)
    limit = config.chunk_chars * config.max_chunks
    assert whole == text[: len(whole)] and limit * 0.9 < len(whole) <= limit
    assert "chunk=" not in output and "more part" not in output  # nothing the parser rejects
    for number, chunk in chunks:  # each one can also be asked for alone
        assert split_page_chunks(browse(box, chunk=str(number))) == [(number, chunk)]


def test_a_short_page_is_one_chunk_and_an_empty_page_none() -> None:
    box = Toolbox(NoSearch(), OnePage("Just one line.\n"), ToolConfig())
    assert split_page_chunks(browse(box)) == [(1, "# A Long Page\n\nJust one line.\n")]
    empty = Toolbox(NoSearch(), OnePage("  \n"), ToolConfig())
    assert browse(empty) == "" and page_chunks("", 10, 3) == []


class Recorder:
    """A scripted model that opens URL, reads, then answers; it records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def engine(self) -> ScriptedEngine:
        recorder = self

        class Recording(ScriptedEngine):
            async def generate(self, prompt_ids, params):
                recorder.calls.append((self.tokenizer.decode(prompt_ids), params.stop))
                return await super().generate(prompt_ids, params)

        return Recording(self.script)

    @staticmethod
    def script(context: str) -> str:
        conversation = context.partition("\n\nAssistant:")[2]  # after the prompt
        if conversation.endswith("</think>"):
            return "\n<answer>read it all</answer>"
        if "<information>" not in conversation:
            return f"I will open it.</think>\n<access>{URL}</access>"
        return "Noted.</think>"


def test_the_agent_feeds_one_chunk_per_think_call_and_shows_read_chunks_short() -> None:
    config = ToolConfig(chunk_chars=300, max_chunks=5)
    reader = OnePage(long_markdown(5_000))
    box = Toolbox(NoSearch(), reader, config)
    recorder = Recorder()
    request = RolloutRequested(
        question_id="q", group_id="g", question="What is on the page?",
        gold_answers=["read it all"], sampling=SamplingSettings(max_turns=20), group_size=1,
    )  # fmt: skip
    steps = []
    finished = asyncio.run(
        run_trajectory(
            request, 0, recorder.engine(), InProcessToolClient(box), _Sink(steps), AgentConfig()
        )
    )
    chunks = [c for _, c in split_page_chunks(browse(box))]
    assert len(chunks) == config.max_chunks
    # The first call acts; then one think call per chunk; then the action call answers.
    stops = [stop for _, stop in recorder.calls]
    action = ("</search>", "</access>", "</answer>")
    assert stops == [action] + [("</think>",)] * len(chunks) + [action]
    assert finished.finish_reason == "answer" and finished.num_turns == len(chunks) + 2
    for k, chunk in enumerate(chunks, 1):
        reading = recorder.calls[k][0]
        assert reading.endswith(f">>>> Page {k} >>>>\n\n{chunk}\n</information>\n<think>\n")
        for later, _ in recorder.calls[k + 1 :]:
            assert chunk not in later
            assert f">>>> Page {k} >>>>\n\n{chunk[:SHORT_CHUNK_CHARS]}\n</information>" in later
    read = "".join(chunks)
    assert read == page_text(reader.page)[: len(read)]
    assert finished.sequence_starts  # short forms break the prefix: new training sequences
    assert any(step.new_sequence for step in steps)


def test_a_single_call_reads_every_chunk_at_once_and_acts() -> None:
    box = Toolbox(NoSearch(), OnePage(long_markdown(2_000)), ToolConfig(chunk_chars=300))
    recorder = Recorder()
    request = RolloutRequested(question_id="q", group_id="g", question="?", group_size=1)
    config = AgentConfig(turns="single_call")
    finished = asyncio.run(
        run_trajectory(request, 0, recorder.engine(), InProcessToolClient(box), _Sink([]), config)
    )
    chunks = split_page_chunks(browse(box))
    reading, stop = recorder.calls[1]
    assert len(chunks) > 3 and stop == ("</search>", "</access>", "</answer>")
    assert all(f">>>> Page {k} >>>>\n\n{chunk}\n</information>" in reading for k, chunk in chunks)
    assert reading.count("<think>\n") == 1 + 1  # the prompt's priming, and one after the page
    assert finished.num_turns == 2  # this script writes no action there: its output ends


def test_an_empty_page_reads_as_no_information() -> None:
    box = Toolbox(NoSearch(), OnePage(""), ToolConfig())
    recorder = Recorder()
    request = RolloutRequested(question_id="q", group_id="g", question="?", group_size=1)
    asyncio.run(
        run_trajectory(
            request, 0, recorder.engine(), InProcessToolClient(box), _Sink([]), AgentConfig()
        )
    )
    assert recorder.calls[1][0].endswith(f"<information>\n{NO_PAGE}\n</information>\n<think>\n")


class _Sink:
    def __init__(self, events: list) -> None:
        self.events = events

    def emit(self, event) -> None:
        self.events.append(event)
