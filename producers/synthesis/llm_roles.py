"""Model-backed roles of the data-synthesis agent: a writer and a checker that ask a chat model.

Inputs are a `ChatModel` per role: `EndpointChat` (any OpenAI-compatible endpoint, vLLM
included, through `consumers/scoring/chat_endpoint.py`) or `EngineChat` (a local `InferenceEngine`).
Outputs are what `asearcher.producers.synthesis.agent` expects of its roles
(`consumers/synthesis/roles.py`):
- `LlmWriter`: the base QA (from a page: one call for its summary and facts, one for a question
  answered by a fact; from a seed pair with a page: one call for the statements that support
  the answer; from a bare seed pair: no call), then FUZZ / INJECT / EXIT choices and edits;
- `LlmChecker`: the quality verdict, answers without tools, and alternative-answer checks.

Every prompt asks for one JSON object with named fields; the reply is read tolerantly
(`load_json_object`; a reasoning model's `<think>` part is dropped first). A failed call, an
empty reply, a refusal, a reply without the fields, and an edit that changes the answer all
raise `RoleFailure("writer.<call>" | "checker.<call>", reason)`, never anything else.

Links: the writer has no entity graph, so it keeps in `Draft.plan` (JSON, `_Plan`) the
Markdown links `[name](url)` of every page it has read; INJECT picks among those not read yet
(the model names one; a URL outside that list is a failure), and is not offered when none is left.
"""

from __future__ import annotations

import re
from typing import Any, Protocol, TypeVar, cast

import httpx
import msgspec

from asearcher.consumers.formats.prompt_templates import check_template, placeholders
from asearcher.consumers.scoring.chat_endpoint import (
    ChatEndpointConfig,
    EndpointError,
    complete,
    load_json_object,
)
from asearcher.consumers.scoring.reward import exact_match
from asearcher.consumers.synthesis.roles import Action, Draft, RoleFailure
from asearcher.producers.engines.base import GenerateParams, InferenceEngine
from asearcher.streams.wire.events import GateVerdict, SynthEdit, SynthesisRequested, SynthFact

S = TypeVar("S", bound=msgspec.Struct)

# --- chat models --------------------------------------------------------------------------------


class ChatError(Exception):
    """The model gave no reply at all (an endpoint that kept failing or refused the request)."""


class ChatModel(Protocol):
    """One prompt in, the model's reply text out; `ChatError` when there is no reply."""

    async def complete(self, prompt: str) -> str: ...


def _any_text(text: str) -> str:
    return text


class EndpointChat:
    """A `ChatModel` on an OpenAI-compatible endpoint. Network errors and 429/5xx are retried per
    `config`; the reply is returned as it is (the roles judge its content). Pass `client` to
    reuse its connections across calls; without one, each call opens its own."""

    def __init__(self, config: ChatEndpointConfig, client: httpx.AsyncClient | None = None) -> None:
        self.config, self.client = config, client

    async def complete(self, prompt: str) -> str:
        """The endpoint's reply to `prompt`, sent as one user message."""
        try:
            return await complete(prompt, self.config, _any_text, self.client)
        except EndpointError as exc:
            raise ChatError(str(exc)) from exc


class EngineChat:
    """A `ChatModel` on a local `InferenceEngine`: the prompt is plain text (no chat template),
    encoded with the engine's tokenizer; the reply is the decoded continuation."""

    def __init__(
        self, engine: InferenceEngine, max_new_tokens: int = 1024, temperature: float = 0.6
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        self.engine = engine
        self.params = GenerateParams(temperature=temperature, max_new_tokens=max_new_tokens)

    async def complete(self, prompt: str) -> str:
        """The engine's continuation of `prompt`, decoded."""
        tokenizer = self.engine.tokenizer
        generation = await self.engine.generate(tokenizer.encode(prompt), self.params)
        return tokenizer.decode(generation.token_ids)


# --- replies ------------------------------------------------------------------------------------

_REFUSAL = re.compile(
    r"^\W*(sorry|i'?m sorry|i am sorry|i'?m unable|i am unable"
    r"|i (can ?not|can'?t|won'?t|must decline))",
    re.I,
)
_SHOWN_CHARS = 60


class _PageFacts(msgspec.Struct):
    summary: str
    facts: list[str]


class _BaseQuestion(msgspec.Struct):
    question: str
    answer: str
    statement: str


class _SeedStatements(msgspec.Struct):
    statements: list[str]


class _Choice(msgspec.Struct):
    action: str
    reason: str = ""


class _Fuzzed(msgspec.Struct):
    question: str
    answer: str
    change: str = ""


class _Picked(msgspec.Struct):
    entity: str
    url: str = ""


class _Injected(msgspec.Struct):
    question: str
    statement: str
    answer: str


class _Quality(msgspec.Struct):
    single_question: bool
    solvable: bool
    answer_correct: bool
    reason: str = ""


class _Answer(msgspec.Struct):
    answer: str


class _Alternative(msgspec.Struct):
    also_correct: bool
    reason: str = ""


def _reply_body(reply: str) -> str:
    # A reasoning model may think aloud first, braces and drafts included: only the end counts.
    return reply.rsplit("</think>", 1)[-1].strip()


def _numbers_as_text(value: dict[str, Any], kind: type[msgspec.Struct]) -> dict[str, Any]:
    # Models write a year or a count as a JSON number where the field is text.
    text_fields = {f.name for f in msgspec.structs.fields(kind) if f.type is str}
    return {
        name: str(item)
        if name in text_fields and isinstance(item, int | float) and not isinstance(item, bool)
        else item
        for name, item in value.items()
    }


def parse_reply(reply: str, kind: type[S], key: str) -> S:
    """The reply's JSON object as `kind`; `RoleFailure(key, …)` for an empty reply, a refusal,
    a reply without a JSON object, or one whose fields are missing or of the wrong type."""
    body = _reply_body(reply)
    if not body:
        raise RoleFailure(key, "empty reply")
    value = load_json_object(body)
    if value is None:
        if _REFUSAL.match(body):
            raise RoleFailure(key, f"refused: {body[:_SHOWN_CHARS]!r}")
        raise RoleFailure(key, f"no JSON object in reply {body[:_SHOWN_CHARS]!r}")
    try:
        return msgspec.convert(_numbers_as_text(value, kind), kind, strict=False)
    except msgspec.ValidationError as exc:
        raise RoleFailure(key, f"bad reply: {exc}") from exc


async def _ask(model: ChatModel, prompt: str, kind: type[S], key: str) -> S:
    try:
        reply = await model.complete(prompt)
    except ChatError as exc:
        raise RoleFailure(key, f"no reply: {exc}") from exc
    return parse_reply(reply, kind, key)


def _required(text: str, field: str, key: str) -> str:
    text = text.strip()
    if not text:
        raise RoleFailure(key, f"empty {field!r}")
    return text


def _same_answer(answer: str, gold: str) -> bool:
    return exact_match(answer, [gold]) == 1.0


def _kept_answer(answer: str, draft: Draft, key: str) -> None:
    if not _same_answer(answer, draft.answer):
        raise RoleFailure(key, f"the answer changed from {draft.answer!r} to {answer!r}")


# --- prompts ------------------------------------------------------------------------------------
# Each prompt's first line names its step and holds no placeholder, so logs (and tests) can
# tell the calls apart.

PAGE_FACTS_PROMPT = """Synthesis step: summarise a page and list its facts.
You help build research questions from web pages. Read the page below. Summarise it in two or \
three sentences, then list the facts it states, each as one standalone sentence that names its \
subject in full (no pronouns) and can be checked against the page.

Page ({url}):
{page}

Reply with one JSON object and nothing else:
{{"summary": "two or three sentences", "facts": ["one fact", "another fact"]}}"""

BASE_QUESTION_PROMPT = """Synthesis step: write a question from a page's facts.
Here are the summary and the facts of a page. Write one question whose answer is a short \
phrase (a name, a date, a number, a place) stated by one of the facts. The question must have \
exactly one correct answer and must not contain that answer.

Summary: {summary}

Facts:
{facts}

Reply with one JSON object and nothing else:
{{"question": "the question", "answer": "the short answer", \
"statement": "the fact that gives the answer, copied from the list"}}"""

SEED_STATEMENTS_PROMPT = """Synthesis step: find the statements behind an answer.
Here are a question, its answer and a page. List the statements of the page that show the \
answer is right, each as one standalone sentence that names its subject in full. Give an \
empty list if the page does not support the answer.

Question: {question}
Answer: {answer}

Page ({url}):
{page}

Reply with one JSON object and nothing else:
{{"statements": ["one statement", "another statement"]}}"""

_ACTION_HELP = {
    "fuzz": '"fuzz": replace one precise detail of the question (a date, a number, a name) with '
    "a vaguer description that still fits only the right answer",
    "inject": '"inject": replace an entity the question names with a description taken from '
    "that entity's own page, so that page must be read too",
    "exit": '"exit": stop here; the question is hard enough',
}

CHOOSE_PROMPT = """Synthesis step: choose the next edit.
You are making a question harder to answer without research while keeping its answer. It has \
been edited {edits} times so far. The possible next steps:
{options}

Question: {question}
Answer: {answer}

Statements it rests on:
{statements}

Reply with one JSON object and nothing else:
{{"action": "one of {names}", "reason": "one sentence"}}"""

FUZZ_PROMPT = """Synthesis step: obscure one detail of a question.
Rewrite the question so that one precise detail becomes vaguer: an exact year becomes a decade \
or a period, a number becomes a range, a name becomes a description. The answer must stay \
exactly the same and remain the only one that fits the statements. Do not put the answer in \
the question.

Question: {question}
Answer: {answer}

Statements it rests on:
{statements}

Reply with one JSON object and nothing else:
{{"question": "the rewritten question", "answer": "the answer, unchanged", \
"change": "what you made vaguer, in a few words"}}"""

PICK_LINK_PROMPT = """Synthesis step: choose an entity to describe indirectly.
The question below names entities, some of which have pages of their own (listed). Pick the \
entity whose page should be read so that the question can refer to it by a fact instead of by \
name. It must be one of the listed pages.

Question: {question}

Statements it rests on:
{statements}

Linked pages:
{links}

Reply with one JSON object and nothing else:
{{"entity": "the entity's name", "url": "its page, copied from the list"}}"""

INJECT_PROMPT = """Synthesis step: add a fact from a linked page.
The question refers to {entity}. Below is the page of {entity}. Take one fact of that page \
which singles {entity} out, and rewrite the question so that it refers to {entity} only \
through that fact (say "the city on the river X" instead of the city's name). Whoever answers \
must then read this page as well. The answer must stay exactly the same.

Question: {question}
Answer: {answer}

Statements it rests on:
{statements}

Page of {entity} ({url}):
{page}

Reply with one JSON object and nothing else:
{{"question": "the rewritten question", \
"statement": "the fact you used, as one standalone sentence", "answer": "the answer, unchanged"}}"""

QUALITY_PROMPT = """Review step: judge a question against its statements.
Check the question and its answer against the statements below:
- single_question: it asks one thing, not several questions joined together;
- solvable: the statements, taken together, lead to the answer without guessing;
- answer_correct: the given answer is what the statements say.

Question: {question}
Answer: {answer}

Statements:
{statements}

Reply with one JSON object and nothing else:
{{"single_question": true, "solvable": true, "answer_correct": true, \
"reason": "one sentence naming any problem"}}"""

ANSWER_PROMPT = """Review step: answer a question from memory.
Answer the question below from what you already know, without searching. If you are not sure, \
give your best guess anyway. Keep the answer short: a name, a date, a number or a place.

Question: {question}

Reply with one JSON object and nothing else:
{{"answer": "your answer"}}"""

ALTERNATIVE_PROMPT = """Review step: check whether a second answer also fits.
The question below has the answer "{answer}". Someone proposed "{other}" instead. Using the \
statements and what you know, decide whether "{other}" also satisfies everything the question \
says, which would give the question two correct answers.

Question: {question}

Statements:
{statements}

Reply with one JSON object and nothing else:
{{"also_correct": false, "reason": "one sentence"}}"""

PROMPTS: dict[str, str] = {
    "page_facts": PAGE_FACTS_PROMPT,
    "base_question": BASE_QUESTION_PROMPT,
    "seed_statements": SEED_STATEMENTS_PROMPT,
    "choose": CHOOSE_PROMPT,
    "fuzz": FUZZ_PROMPT,
    "pick_link": PICK_LINK_PROMPT,
    "inject": INJECT_PROMPT,
    "quality": QUALITY_PROMPT,
    "answer": ANSWER_PROMPT,
    "alternative": ALTERNATIVE_PROMPT,
}


def load_prompts(files: dict[str, str]) -> dict[str, str]:
    """Every prompt by name: the project's, with those `files` names read from the user's files
    (checked: known names, and only the placeholders of the project's prompt)."""
    unknown = sorted(set(files) - set(PROMPTS))
    if unknown:
        raise ValueError(
            f"prompt_files: no synthesis prompt {unknown[0]!r} ({', '.join(sorted(PROMPTS))})"
        )
    prompts = dict(PROMPTS)
    for name, path in files.items():
        fields = placeholders(PROMPTS[name])
        prompts[name] = check_template(path, fields, f"prompt_files.{name}", required=())
    return prompts


def _numbered(lines: list[str]) -> str:
    return "\n".join(f"{number}. {line}" for number, line in enumerate(lines, start=1)) or "(none)"


def _statements(facts: list[SynthFact]) -> str:
    return _numbered([f"{fact.statement} (source: {fact.url})" for fact in facts])


# --- the writer's plan --------------------------------------------------------------------------

_MARKDOWN_LINK = re.compile(r"\[([^\[\]\n]{1,200})\]\((https?://[^)\s]+)\)")


class _Plan(msgspec.Struct, kw_only=True):
    """What the LLM writer keeps in `Draft.plan`: the links of the pages it has read."""

    read: list[str] = []  # pages read, in order
    links: dict[str, str] = {}  # url -> link text, over every page read
    summary: str = ""  # the seed page's summary, when the base came from a page


def _load_plan(text: str) -> _Plan:
    # A draft from another writer (or none) has a plan of its own: start afresh.
    try:
        return msgspec.json.decode(text, type=_Plan) if text else _Plan()
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _Plan()


def _dump_plan(plan: _Plan) -> str:
    return msgspec.json.encode(plan).decode()


def page_links(page: str) -> dict[str, str]:
    """The Markdown links `[text](url)` of `page`, url -> text, first text kept."""
    links: dict[str, str] = {}
    for text, url in _MARKDOWN_LINK.findall(page):
        links.setdefault(url, text.strip())
    return links


def _after_reading(plan: _Plan, url: str, page: str | None) -> _Plan:
    links = {**page_links(page or ""), **plan.links}
    return msgspec.structs.replace(plan, read=[*plan.read, url], links=links)


def _unread_links(draft: Draft, plan: _Plan) -> dict[str, str]:
    done = set(plan.read) | {fact.url for fact in draft.facts}
    unread = {url: text for url, text in plan.links.items() if url not in done}
    # Entities the question names first: those are the ones INJECT can describe away.
    question = draft.question.lower()
    return dict(sorted(unread.items(), key=lambda item: item[1].lower() not in question))


# --- the writer ---------------------------------------------------------------------------------


class LlmWriter:
    """The writer role on a chat model (ASearcher: the reasoning model).

    `choose`: "exit" is only offered when allowed and "inject" only when an unread linked page
    is known; a reply naming an action not offered is read as "fuzz" (the loop would fuzz on a
    premature exit too), one naming no action is a `RoleFailure`.
    """

    def __init__(
        self,
        model: ChatModel,
        max_page_chars: int = 8000,
        max_links: int = 40,
        prompts: dict[str, str] | None = None,
    ) -> None:
        self.model, self.max_page_chars, self.max_links = model, max_page_chars, max_links
        self.prompts = load_prompts(prompts or {})

    async def base(self, seed: SynthesisRequested, page: str | None) -> Draft:
        """The seed pair with the statements of its page, or a QA written from the page."""
        if seed.question and seed.answer:
            return await self._restated(seed, page)
        if page is None or not page.strip():
            raise RoleFailure("writer.base", f"seed page {seed.page_url!r} could not be read")
        return await self._from_page(seed, page)

    async def _restated(self, seed: SynthesisRequested, page: str | None) -> Draft:
        facts: list[SynthFact] = []
        plan = _Plan()
        if seed.page_url and page:
            prompt = self.prompts["seed_statements"].format(
                question=seed.question, answer=seed.answer, url=seed.page_url, page=self._cut(page)
            )
            reply = await _ask(self.model, prompt, _SeedStatements, "writer.base")
            statements = [s.strip() for s in reply.statements if s.strip()]
            if not statements:
                raise RoleFailure("writer.base", "the seed page does not support the answer")
            facts = [SynthFact(statement=s, url=seed.page_url) for s in statements]
            plan = _after_reading(plan, seed.page_url, page)
        edit = SynthEdit(action="base", question=seed.question, detail="the seed pair", facts=facts)
        return Draft(
            question=seed.question,
            answer=seed.answer,
            facts=facts,
            edits=[edit],
            plan=_dump_plan(plan),
        )

    async def _from_page(self, seed: SynthesisRequested, page: str) -> Draft:
        key = "writer.base"
        prompt = self.prompts["page_facts"].format(url=seed.page_url, page=self._cut(page))
        read = await _ask(self.model, prompt, _PageFacts, key)
        listed = [fact.strip() for fact in read.facts if fact.strip()]
        if not listed:
            raise RoleFailure(key, "no facts listed for the page")
        summary, facts = read.summary.strip(), _numbered(listed)
        prompt = self.prompts["base_question"].format(summary=summary, facts=facts)
        written = await _ask(self.model, prompt, _BaseQuestion, key)
        question = _required(written.question, "question", key)
        answer = _required(written.answer, "answer", key)
        fact = SynthFact(
            statement=_required(written.statement, "statement", key), url=seed.page_url
        )
        plan = _after_reading(_Plan(summary=read.summary.strip()), seed.page_url, page)
        edit = SynthEdit(
            action="base", question=question, detail="written from the seed page", facts=[fact]
        )
        return Draft(
            question=question, answer=answer, facts=[fact], edits=[edit], plan=_dump_plan(plan)
        )

    async def choose(self, draft: Draft, may_exit: bool) -> Action:
        """The model's next action among those open to `draft` (see the class docstring)."""
        offered = ["fuzz"]
        if _unread_links(draft, _load_plan(draft.plan)):
            offered.append("inject")
        if may_exit:
            offered.append("exit")
        prompt = self.prompts["choose"].format(
            edits=max(len(draft.edits) - 1, 0),
            options="\n".join(f"- {_ACTION_HELP[name]}" for name in offered),
            question=draft.question,
            answer=draft.answer,
            statements=_statements(draft.facts),
            names=", ".join(offered),
        )
        reply = await _ask(self.model, prompt, _Choice, "writer.choose")
        action = reply.action.strip().strip("\"'.").lower()
        if action not in _ACTION_HELP:
            raise RoleFailure(
                "writer.choose", f"no action in reply: {reply.action[:_SHOWN_CHARS]!r}"
            )
        return cast(Action, action if action in offered else "fuzz")

    async def fuzz(self, draft: Draft) -> Draft:
        """`draft` with one detail made vaguer by the model; the answer checked unchanged."""
        key = "writer.fuzz"
        prompt = self.prompts["fuzz"].format(
            question=draft.question, answer=draft.answer, statements=_statements(draft.facts)
        )
        reply = await _ask(self.model, prompt, _Fuzzed, key)
        question = _required(reply.question, "question", key)
        _kept_answer(reply.answer, draft, key)
        if question == draft.question:
            raise RoleFailure(key, "the question did not change")
        edit = SynthEdit(action="fuzz", question=question, detail=reply.change.strip())
        return msgspec.structs.replace(draft, question=question, edits=[*draft.edits, edit])

    async def pick_link(self, draft: Draft) -> str:
        """The URL, among the unread links of the pages read so far, of the entity the model
        picks; `RoleFailure` when none is known or the model names another."""
        key = "writer.pick_link"
        links = list(_unread_links(draft, _load_plan(draft.plan)).items())[: self.max_links]
        if not links:
            raise RoleFailure(key, "no unread linked page")
        prompt = self.prompts["pick_link"].format(
            question=draft.question,
            statements=_statements(draft.facts),
            links="\n".join(f"- {text}: {url}" for url, text in links),
        )
        reply = await _ask(self.model, prompt, _Picked, key)
        return _match_link(reply, dict(links), key)

    async def inject(self, draft: Draft, url: str, page: str | None) -> Draft:
        """`draft` rewritten by the model to need a fact of `page`; the answer checked unchanged."""
        key = "writer.inject"
        if page is None or not page.strip():
            raise RoleFailure(key, f"page {url!r} could not be read")
        plan = _load_plan(draft.plan)
        entity = plan.links.get(url) or url
        prompt = self.prompts["inject"].format(
            entity=entity,
            question=draft.question,
            answer=draft.answer,
            statements=_statements(draft.facts),
            url=url,
            page=self._cut(page),
        )
        reply = await _ask(self.model, prompt, _Injected, key)
        question = _required(reply.question, "question", key)
        fact = SynthFact(statement=_required(reply.statement, "statement", key), url=url)
        _kept_answer(reply.answer, draft, key)
        edit = SynthEdit(
            action="inject", question=question, detail=f"described {entity}", facts=[fact]
        )
        return msgspec.structs.replace(
            draft,
            question=question,
            facts=[*draft.facts, fact],
            edits=[*draft.edits, edit],
            plan=_dump_plan(_after_reading(plan, url, page)),
        )

    def _cut(self, page: str) -> str:
        return page[: self.max_page_chars]


def _match_link(reply: _Picked, links: dict[str, str], key: str) -> str:
    """The listed URL the reply names, by URL or else by the entity's link text."""
    url = reply.url.strip().strip("<>")
    if url in links:
        return url
    entity = reply.entity.strip().lower()
    for listed, text in links.items():
        if entity and text.lower() == entity:
            return listed
    raise RoleFailure(key, f"{reply.url or reply.entity!r} is not one of the linked pages")


# --- the checker --------------------------------------------------------------------------------


class LlmChecker:
    """The checker role on a chat model (ASearcher: the instruct model)."""

    def __init__(self, model: ChatModel, prompts: dict[str, str] | None = None) -> None:
        self.prompts = load_prompts(prompts or {})
        self.model = model

    async def quality(self, draft: Draft) -> GateVerdict:
        """One question, solvable from its statements, its answer right: the model's verdict."""
        prompt = self.prompts["quality"].format(
            question=draft.question, answer=draft.answer, statements=_statements(draft.facts)
        )
        reply = await _ask(self.model, prompt, _Quality, "checker.quality")
        problems = [
            problem
            for ok, problem in (
                (reply.single_question, "not a single question"),
                (reply.solvable, "not solvable from its statements"),
                (reply.answer_correct, "answer not supported"),
            )
            if not ok
        ]
        reason = "; ".join(problems) + (f": {reply.reason.strip()}" if reply.reason.strip() else "")
        return GateVerdict(gate="quality", passed=not problems, reason=reason if problems else "")

    async def answer_without_tools(self, question: str, attempt: int) -> str:
        """The model's answer from memory. Every attempt gets the same prompt: the variety comes
        from sampling (`attempt` is not shown, so no attempt is nudged to answer differently)."""
        prompt = self.prompts["answer"].format(question=question)
        reply = await _ask(self.model, prompt, _Answer, "checker.answer_without_tools")
        return reply.answer.strip()

    async def alternatives(self, draft: Draft) -> list[str]:
        """None beyond the no-tool answers: the model cannot enumerate its domain."""
        return []

    async def is_alternative(self, draft: Draft, answer: str) -> bool:
        """Whether the model finds `answer` also fits the question and its statements."""
        prompt = self.prompts["alternative"].format(
            answer=draft.answer,
            other=answer,
            question=draft.question,
            statements=_statements(draft.facts),
        )
        reply = await _ask(self.model, prompt, _Alternative, "checker.is_alternative")
        return reply.also_correct
