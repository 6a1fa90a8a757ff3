"""The reasoning web agent: a large reasoning model searching the web, the reference's agent for
its GAIA, xBench-DeepSearch and Frames numbers (registered as workflow "asearcher-reasoning").

It differs from the ASearcher agent in how the model is asked, not in the tools:
- every call is a fresh prompt (one user message, so a chat model's template applies), built
  from the question and a history window (the last `history_chars` characters of what happened);
- an *act* call writes a thought in `<thought>` tags and one action: `<search>`, `<access>` a
  URL seen so far, or, once the answer phase has begun, `<answer>`;
- a *reading* call follows every tool result: search results, then each chunk of an opened page
  (`chunk_chars` each, at most `max_chunks`), one call per chunk; it writes a thought that keeps
  what matters for the question. Later prompts show a chunk's first `short_chars` characters and
  the thought, so a long page costs context once. A `reader` endpoint (a second, smaller model)
  may do the reading;
- the answer phase begins after `answer_after_searches` search results or `answer_after_acts`
  calls; before it, an answer is not taken. The run ends at an answer or at `max_acts` calls;
  without an answer tag the last output line that mentions an answer is taken, as the reference
  does.
The model is an OpenAI-compatible endpoint (`model`) or, without one, the rollout engine given
plain text. Trajectories carry the text of every call (`transcript`), not token ids: this agent
evaluates; it is not trained here.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from asearcher.consumers.scoring.chat_endpoint import ChatEndpointConfig
from asearcher.consumers.tools.toolbox import split_page_chunks
from asearcher.producers.agents.agent import AgentConfig, StepSink, ToolClient, score_request
from asearcher.producers.agents.reasoning_config import ReasoningConfig
from asearcher.producers.engines.base import InferenceEngine
from asearcher.producers.synthesis.llm_roles import ChatError, ChatModel, EndpointChat, EngineChat
from asearcher.streams.wire.events import (
    RolloutRequested,
    ToolCallRequested,
    TrajectoryFinished,
    new_id,
)

_TAG = {name: re.compile(rf"<{name}>(.*?)</{name}>", re.DOTALL) for name in
        ("thought", "think", "search", "access", "answer")}  # fmt: skip


@dataclass
class _Entry:
    """One item of the history: what it is, its text, and what later prompts show of it."""

    kind: str  # "act", "results", "page"
    text: str
    short: str | None = None

    def shown(self) -> str:
        return self.text if self.short is None else self.short


@dataclass
class _Run:
    """The state of one question while it is played."""

    request: RolloutRequested
    trajectory_id: str
    history: list[_Entry] = field(default_factory=list)
    unread: deque[_Entry] = field(default_factory=deque)  # results or chunks still to read
    outputs: list[str] = field(default_factory=list)  # every call's text
    transcript: list[str] = field(default_factory=list)
    seen_urls: list[str] = field(default_factory=list)
    tool_calls: dict[str, int] = field(default_factory=dict)
    searches: int = 0
    answer: str | None = None


class ReasoningWorkflow:
    """Plays one question with the reasoning web agent (see the module docstring)."""

    def __init__(self, config: AgentConfig) -> None:
        self.agent = config
        self.config = config.reasoning

    async def run(
        self,
        engine: InferenceEngine,
        tools: ToolClient,
        steps: StepSink,
        request: RolloutRequested,
        index: int,
    ) -> TrajectoryFinished:
        """Trajectory `index` of `request`'s group, played to an answer or the call limit."""
        model = self._model(self.config.model, engine)
        reader = self._model(self.config.reader, engine) if self.config.reader else model
        run = _Run(request=request, trajectory_id=new_id())
        finish = "max_turns"
        while len(run.outputs) < self.config.max_acts:
            try:
                if run.unread:
                    await self._read(run, reader, tools)
                elif await self._act(run, model, tools):
                    finish = "answer"
                    break
            except ChatError as exc:
                run.transcript.append(f"[model error: {exc}]")
                finish = "error"
                break
        return await self._finished(run, index, finish)

    def _model(self, endpoint: ChatEndpointConfig | None, engine: InferenceEngine) -> ChatModel:
        if endpoint is not None:
            return EndpointChat(endpoint)
        return EngineChat(engine, self.config.max_new_tokens, self.config.temperature)

    # --- the two kinds of call -----------------------------------------------------------------

    async def _act(self, run: _Run, model: ChatModel, tools: ToolClient) -> bool:
        """One act call and its action; whether it answered."""
        answering = (
            run.searches >= self.config.answer_after_searches
            or len(run.outputs) >= self.config.answer_after_acts
        )
        output = await self._call(run, model, act_prompt(run, self.config, answering))
        thought = _last(output, "thought") or _last(output, "think") or ""
        action = _action(output, answering)
        run.history.append(_Entry("act", _act_text(thought, action)))
        if action is None:
            return False
        kind, argument = action
        if kind == "answer":
            run.answer = argument
            return True
        await self._use_tool(run, tools, kind, argument)
        return False

    async def _read(self, run: _Run, reader: ChatModel, tools: ToolClient) -> None:
        """One reading call on the next unread results or chunk."""
        item = run.unread.popleft()
        output = await self._call(run, reader, reading_prompt(run, self.config, item))
        run.history.append(item)
        thought = _last(output, "thought") or _last(output, "think")
        if not thought:
            run.unread.clear()  # nothing kept of this chunk: the rest of the page is skipped
            return
        run.history.append(_Entry("act", f"<think>{thought.strip()}</think>"))

    async def _call(self, run: _Run, model: ChatModel, prompt: str) -> str:
        output = await model.complete(prompt)
        run.outputs.append(output)
        run.transcript.append(output)
        return output

    # --- tools ---------------------------------------------------------------------------------

    async def _use_tool(self, run: _Run, tools: ToolClient, kind: str, argument: str) -> None:
        tool = "search" if kind == "search" else "browse"
        run.tool_calls[tool] = run.tool_calls.get(tool, 0) + 1
        key = "query" if kind == "search" else "url"
        result = await tools.call(
            ToolCallRequested(
                call_id=f"{run.trajectory_id}.{len(run.outputs)}",
                trajectory_id=run.trajectory_id,
                turn=len(run.outputs),
                tool=tool,
                arguments={key: argument},
                timeout_s=self.agent.tool_timeout_s,
            )
        )
        text = f"Error: {result.error}" if result.error else result.text
        run.transcript.append(text)
        if kind == "search":
            run.searches += 1
            run.seen_urls.extend(re.findall(r"https?://\S+", text))
            run.unread.append(_Entry("results", _information(text or "No results found.")))
        else:
            run.unread.extend(self._chunks(text))

    def _chunks(self, page: str) -> list[_Entry]:
        """A page as the entries read one call each: `chunk_chars` each, `max_chunks` at most."""
        body = "".join(chunk for _, chunk in split_page_chunks(page)) or page
        if not body.strip():
            return [_Entry("page", _information("Nothing could be read at this URL."))]
        size, limit = self.config.chunk_chars, self.config.max_chunks
        pieces = [body[start : start + size] for start in range(0, len(body), size)][:limit]
        short = self.config.short_chars
        return [
            _Entry("page", _information(f"Page {n}\n{piece}"),
                   short=_information(f"Page {n}\n{piece[:short]}..."))
            for n, piece in enumerate(pieces, start=1)
        ]  # fmt: skip

    # --- the end -------------------------------------------------------------------------------

    async def _finished(self, run: _Run, index: int, finish: str) -> TrajectoryFinished:
        answer = run.answer if run.answer is not None else fallback_answer(run.outputs)
        # Scored as the ASearcher agent's trajectories are: the answer inside <answer> tags.
        texts = [f"<answer>{answer}</answer>"] if answer else []
        score = await score_request(run.request, texts, self.agent.reward, True, run.trajectory_id)
        request = run.request
        return TrajectoryFinished(
            trajectory_id=run.trajectory_id, group_id=request.group_id,
            question_id=request.question_id, purpose=request.purpose,
            token_ids=[], logprobs=[], loss_mask=[], token_versions=[],
            answer=answer, reward=score.reward, reward_parts=score.parts,
            num_turns=len(run.outputs), finish_reason=finish, request_id=request.event_id,
            group_size=request.group_size, temperature=self.config.temperature,
            sample_index=index, tool_calls=dict(run.tool_calls),
            metadata=dict(request.metadata), transcript=list(run.transcript),
        )  # fmt: skip


# --- prompts -------------------------------------------------------------------------------------

_ACT = """You are a research agent with a web browser. Work out the answer to the question \
below step by step. Each reply holds your reasoning inside <thought> </thought>, then exactly \
one action:
- <search> query </search> to search the web;
- <access> url </access> to read a page whose URL appeared in the history;{answer_action}
Check facts against more than one source, try other directions when a search finds nothing, \
and write the action after the thought.

Question:
{question}

What happened so far:
{history}

Your reply (<thought> ... </thought> then one action):"""
_ANSWER_ACTION = """
- <answer> answer </answer> to give the final answer, a few words, once you are sure of it."""
_READ = """You are a research agent reading {what} while answering a question. Write inside \
<thought> </thought> every fact here that helps answer the question, and the links worth \
opening next. Keep it short; say so if nothing here helps.

Question:
{question}

What happened so far:
{history}

{what_title}:
{content}

Your reply (<thought> ... </thought>):"""


def act_prompt(run: _Run, config: ReasoningConfig, answering: bool) -> str:
    """The prompt of an act call: the question, the history window, the actions open now."""
    return _ACT.format(
        answer_action=_ANSWER_ACTION if answering else "",
        question=run.request.question.strip(),
        history=_history(run.history, config.history_chars),
    )


def reading_prompt(run: _Run, config: ReasoningConfig, item: _Entry) -> str:
    """The prompt of a reading call on search results or one page chunk."""
    results = item.kind == "results"
    return _READ.format(
        what="search results" if results else "a web page",
        what_title="Search results" if results else "Page",
        question=run.request.question.strip(),
        history=_history(run.history, config.history_chars),
        content=item.text,
    )


def _history(entries: list[_Entry], limit: int) -> str:
    text = "\n".join(entry.shown() for entry in entries)
    return text[-limit:] if text else "(nothing yet)"


def _information(body: str) -> str:
    return f"<information>\n{body}\n</information>"


# --- parsing -------------------------------------------------------------------------------------


def _last(text: str, tag: str) -> str | None:
    found = _TAG[tag].findall(text)
    return found[-1].strip() if found else None


def _action(output: str, answering: bool) -> tuple[str, str] | None:
    """The call's action: the first of search, access, answer present (answer only when open)."""
    for kind in ("search", "access", "answer"):
        argument = _last(output, kind)
        if argument and (kind != "answer" or answering):
            return kind, argument
    return None


def _act_text(thought: str, action: tuple[str, str] | None) -> str:
    text = f"<think>{thought}</think>"
    if action is not None:
        text += f"\n<{action[0]}>{action[1]}</{action[0]}>"
    return text


def fallback_answer(outputs: list[str]) -> str | None:
    """The answer of a run that ended without one, as the reference recovers one: the last
    output line that mentions an answer (an answer tag's content, if it holds one), else what
    the last output says after its thought, else None."""
    lines = [line for output in outputs for line in output.splitlines()]
    mentioned = [line.strip() for line in lines if "answer" in line.lower() and line.strip()]
    if mentioned:
        return _last(mentioned[-1], "answer") or mentioned[-1]
    # The reference reads <thought> as <think>: what follows the last closing tag of either.
    tail = re.split(r"</think>|</thought>", outputs[-1])[-1].strip() if outputs else ""
    return tail or None
