"""Model-backed synthesis roles against a real local OpenAI-shaped HTTP server: a whole
`synthesize` run from a page with scripted replies (an inject and a fuzz accepted; a malformed
reply, a refusal, an HTTP 500 and an answer-changing edit each handled), the difficulty and
uniqueness gates, reply parsing, and `EngineChat` on the scripted engine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from asearcher.consumers.scoring.chat_endpoint import ChatEndpointConfig, load_json_object
from asearcher.consumers.synthesis.roles import Draft, RoleFailure
from asearcher.producers.engines.base import ScriptedEngine
from asearcher.producers.synthesis.agent import SynthConfig, synthesize
from asearcher.producers.synthesis.llm_roles import (
    ANSWER_PROMPT,
    PROMPTS,
    EndpointChat,
    EngineChat,
    LlmChecker,
    LlmWriter,
)
from asearcher.streams.wire.events import (
    QuestionSynthesized,
    SynthesisCandidate,
    SynthesisRequested,
    SynthFact,
    ToolCallRequested,
    ToolResultReady,
)
from tests.chat_server import ChatServer, Script, Step, chat_servers

ADA_URL, LONDON_URL, BABBAGE_URL = (
    "https://wiki.test/ada",
    "https://wiki.test/london",
    "https://wiki.test/babbage",
)
PAGES = {
    ADA_URL: "# Ada Lovelace\n\nAda Lovelace was born in [London](https://wiki.test/london) in "
    "1815. She worked with [Charles Babbage](https://wiki.test/babbage) on the Analytical Engine.",
    LONDON_URL: "# London\n\nLondon is the capital of [England](https://wiki.test/england). "
    "The River Thames flows through it.",
}
BASE_Q = "In which year was Ada Lovelace, the mathematician from London, born?"
INJECT_Q = "In which year was Ada Lovelace, the mathematician from the city on the Thames, born?"
FUZZ_Q = [
    "In which year was the mathematician from the city on the Thames who wrote on Babbage's "
    "engine born?",
    "In which year was a 19th-century mathematician from the city on the Thames born?",
    "In which year was a mathematician from the city on the Thames born?",
]


def ok(value: dict[str, Any]) -> Step:
    return (200, json.dumps(value))


class Router:
    """A server script: each prompt is told apart by its first line (`llm_roles.PROMPTS`) and
    gets the next step of that call's queue; the last step of a queue repeats."""

    def __init__(self, queues: dict[str, list[Step]]) -> None:
        self.queues, self.served = queues, {kind: 0 for kind in queues}
        self.firsts = {template.split("\n", 1)[0]: kind for kind, template in PROMPTS.items()}

    def kind(self, prompt: str) -> str:
        return self.firsts[prompt.split("\n", 1)[0]]

    def __call__(self, prompt: str) -> Step:
        kind = self.kind(prompt)
        queue, index = self.queues[kind], self.served[kind]
        self.served[kind] += 1
        return queue[min(index, len(queue) - 1)]


class PageTools:
    """A `ToolClient` double serving fixed pages to `browse`; any other URL is an error."""

    def __init__(self, pages: dict[str, str]) -> None:
        self.pages, self.browsed = pages, []

    async def call(self, request: ToolCallRequested) -> ToolResultReady:
        url = request.arguments["url"]
        self.browsed.append(url)
        text = self.pages.get(url)
        return ToolResultReady(call_id=request.call_id, trajectory_id=request.trajectory_id,
                               tool=request.tool, text=text or "",
                               error=None if text else "404 not found")  # fmt: skip


@pytest.fixture
def chat_server() -> Iterator[Callable[[Script], ChatServer]]:
    with chat_servers() as start:
        yield start


def endpoint(url: str, **overrides: Any) -> EndpointChat:
    settings: dict[str, Any] = {"backoff_s": 0.0, "timeout_s": 5.0, "max_attempts": 2, **overrides}
    return EndpointChat(ChatEndpointConfig(base_url=url, model="synth", **settings))


ADA_FACT = "Ada Lovelace was born in London in 1815."
THAMES_FACT = "The River Thames flows through London."
QUALITY_OK = ok({"single_question": True, "solvable": True, "answer_correct": True, "reason": ""})
REFUSAL: Step = (200, "I'm sorry, I can't help with that.")
MALFORMED: Step = (200, "{action: fuzz")
SERVER_ERROR: Step = (500, "boom")


def answers(*texts: str) -> list[Step]:
    return [ok({"answer": text}) for text in texts]


def whole_run_script() -> dict[str, list[Step]]:
    """Turn by turn (max_edits 6): 1 a malformed choice; 2 an inject that changes the answer;
    3 an inject, accepted (one no-tool answer after an HTTP 500, the other refused); 4 a fuzz,
    accepted; 5 a fuzz answered right without tools (too easy); 6 a fuzz with an alternative
    answer (not unique)."""
    inject = {"question": INJECT_Q, "statement": THAMES_FACT, "answer": "1815"}
    summary = {"summary": "Ada Lovelace, a mathematician born in London.", "facts": [ADA_FACT]}
    fuzz = ok({"action": "fuzz", "reason": "r"})
    later_answers = ("1820", "1830", "1815", "1820", "1816", "1816")
    return {
        "page_facts": [ok(summary)],
        "base_question": [ok({"question": BASE_Q, "answer": "1815", "statement": ADA_FACT})],
        "choose": [MALFORMED, ok({"action": "inject"}), ok({"action": "INJECT"}), *[fuzz] * 3],
        "pick_link": [ok({"entity": "London", "url": LONDON_URL})],
        "inject": [ok({**inject, "answer": "1816"}), ok(inject)],
        # A year written as a JSON number is read as text.
        "fuzz": [ok({"question": q, "answer": 1815, "change": "c"}) for q in FUZZ_Q],
        "quality": [QUALITY_OK],
        # Turn 3: an HTTP 500 then "1816", a refusal; turn 4: two wrong; 5: one right; 6: wrong.
        "answer": [SERVER_ERROR, *answers("1816"), REFUSAL, *answers(*later_answers)],
        "alternative": [*[ok({"also_correct": False})] * 3, ok({"also_correct": "true"})],
    }


class WholeRun:
    """One scripted `synthesize` run from the Ada page and what it left behind."""

    def __init__(self, start: Callable[[Script], ChatServer]) -> None:
        self.router = Router(whole_run_script())
        self.server = start(self.router)
        self.tools = PageTools(PAGES)
        self.candidates: list[SynthesisCandidate] = []
        seed = SynthesisRequested(seed_id="ada", page_url=ADA_URL)
        config = SynthConfig(max_edits=6, min_edits=1, no_tool_attempts=2)
        model = endpoint(self.server.url)
        self.outcome: QuestionSynthesized = asyncio.run(
            synthesize(seed, LlmWriter(model), LlmChecker(model), self.tools, config,
                       self.candidates.append)
        )  # fmt: skip

    def prompts(self, kind: str) -> list[str]:
        return [p for p in self.server.prompts() if self.router.kind(p) == kind]


@pytest.fixture(scope="module")
def whole_run() -> Iterator[WholeRun]:
    """One run shared by the tests that read it (none changes it)."""
    with chat_servers() as start:
        yield WholeRun(start)


def test_synthesize_scripted_llm_roles_accepts_inject_then_fuzz(whole_run: WholeRun) -> None:
    outcome = whole_run.outcome
    assert outcome.accepted and outcome.question == FUZZ_Q[0] and outcome.answer == "1815"
    assert [edit.action for edit in outcome.edits] == ["base", "inject", "fuzz"]
    assert outcome.supporting_urls == [ADA_URL, LONDON_URL]
    assert outcome.facts[-1] == SynthFact(statement=THAMES_FACT, url=LONDON_URL)
    assert [v.gate for v in outcome.verdicts] == ["quality", "difficulty", "uniqueness"]
    assert outcome.candidates == 5  # the base, then turns 3 to 6
    assert whole_run.tools.browsed == [ADA_URL, LONDON_URL, LONDON_URL]
    # The base page's links are kept in the plan: London and Babbage to inject from.
    plan = json.loads(whole_run.candidates[0].plan)
    assert plan["links"] == {LONDON_URL: "London", BABBAGE_URL: "Charles Babbage"}


def test_synthesize_scripted_llm_roles_counts_each_role_failure(whole_run: WholeRun) -> None:
    # The malformed choice, the answer-changing inject and the refused answer are counted; the
    # HTTP 500 is retried by the endpoint client, so it costs a request and no failure.
    assert whole_run.outcome.role_failures == {
        "writer.choose": 1, "writer.inject": 1, "checker.answer_without_tools": 1,
    }  # fmt: skip
    assert len(whole_run.prompts("answer")) == 9  # 8 answers asked, one of them twice
    assert [r["model"] for r in whole_run.server.requests] == ["synth"] * len(
        whole_run.server.requests
    )


def test_synthesize_scripted_exit_offered_only_once_allowed(whole_run: WholeRun) -> None:
    choices = whole_run.prompts("choose")
    assert len(choices) == 6
    assert all('"exit"' not in prompt for prompt in choices[:3])  # nothing accepted yet
    assert '"exit"' in choices[3] and '"inject"' in choices[3]  # Babbage and England unread


def test_synthesize_scripted_difficulty_right_no_tool_answer_rejects(whole_run: WholeRun) -> None:
    too_easy = whole_run.candidates[3]
    assert too_easy.question == FUZZ_Q[1] and not too_easy.accepted
    difficulty = too_easy.verdicts[-1]
    assert difficulty.gate == "difficulty" and not difficulty.passed
    assert difficulty.answers == ["1815", "1820"] and difficulty.correct == 1


def test_synthesize_scripted_uniqueness_also_correct_rejects(whole_run: WholeRun) -> None:
    ambiguous = whole_run.candidates[4]
    assert ambiguous.question == FUZZ_Q[2] and not ambiguous.accepted
    uniqueness = ambiguous.verdicts[-1]
    assert uniqueness.gate == "uniqueness" and not uniqueness.passed
    assert "'1816' also answers it" in uniqueness.reason
    # The writer went back: the rejected draft's question is not the outcome's.
    assert whole_run.outcome.question == FUZZ_Q[0]


# --- single calls --------------------------------------------------------------------------------

DRAFT = Draft(
    question=BASE_Q,
    answer="1815",
    facts=[SynthFact(statement=ADA_FACT, url=ADA_URL)],
    plan=json.dumps({"read": [ADA_URL], "links": {LONDON_URL: "London", BABBAGE_URL: "Babbage"}}),
)


def test_endpoint_server_error_without_retries_left_is_role_failure(chat_server) -> None:
    server = chat_server([(500, "boom"), ok({"answer": "1816"})])
    checker = LlmChecker(endpoint(server.url, max_attempts=1))
    with pytest.raises(RoleFailure) as caught:
        asyncio.run(checker.answer_without_tools(BASE_Q, 0))
    assert caught.value.key == "checker.answer_without_tools" and "HTTP 500" in caught.value.reason
    assert asyncio.run(checker.answer_without_tools(BASE_Q, 1)) == "1816"


def test_endpoint_client_error_is_role_failure_without_retry(chat_server) -> None:
    server = chat_server([(401, "bad key")])
    with pytest.raises(RoleFailure, match="checker.quality: no reply: .*HTTP 401"):
        asyncio.run(LlmChecker(endpoint(server.url, max_attempts=3)).quality(DRAFT))
    assert len(server.requests) == 1


def test_quality_failed_checks_are_named_in_the_reason(chat_server) -> None:
    reply = {"single_question": "false", "solvable": True, "answer_correct": 0, "reason": "two"}
    server = chat_server([ok(reply)])
    verdict = asyncio.run(LlmChecker(endpoint(server.url)).quality(DRAFT))
    assert verdict.gate == "quality" and not verdict.passed
    assert verdict.reason == "not a single question; answer not supported: two"


def test_pick_link_url_outside_the_known_links_is_role_failure(chat_server) -> None:
    server = chat_server([ok({"entity": "Paris", "url": "https://evil.test/x"}),
                          ok({"entity": "babbage", "url": ""})])  # fmt: skip
    writer = LlmWriter(endpoint(server.url))
    with pytest.raises(RoleFailure, match="writer.pick_link: .* not one of the linked pages"):
        asyncio.run(writer.pick_link(DRAFT))
    assert asyncio.run(writer.pick_link(DRAFT)) == BABBAGE_URL  # by the entity's link text
    assert "London: " + LONDON_URL in server.prompts()[0]


def test_inject_unreadable_page_fails_without_asking(chat_server) -> None:
    server = chat_server([ok({})])
    with pytest.raises(RoleFailure, match="writer.inject: .* could not be read"):
        asyncio.run(LlmWriter(endpoint(server.url)).inject(DRAFT, LONDON_URL, None))
    assert server.requests == []


def test_base_from_seed_pair_keeps_it_with_the_page_statements(chat_server) -> None:
    server = chat_server([ok({"statements": ["Ada Lovelace was born in 1815."]})])
    seed = SynthesisRequested(seed_id="s", question=BASE_Q, answer="1815", page_url=ADA_URL)
    draft = asyncio.run(LlmWriter(endpoint(server.url)).base(seed, PAGES[ADA_URL]))
    assert (draft.question, draft.answer) == (BASE_Q, "1815")
    assert draft.facts == [SynthFact(statement="Ada Lovelace was born in 1815.", url=ADA_URL)]
    assert [edit.action for edit in draft.edits] == ["base"]


class FixedReply:
    """A `ChatModel` that always replies `reply`."""

    def __init__(self, reply: str) -> None:
        self.reply = reply

    async def complete(self, prompt: str) -> str:
        return self.reply


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("", "empty reply"),
        ("<think>hmm {not json}</think>  ", "empty reply"),
        ("I'm sorry, but I can't help with that.", "refused"),
        ('{"answer": "x"', "no JSON object"),
        ('{"reply": "x"}', "missing required field `answer`"),
        ('{"answer": ["x"]}', "Expected `str`"),
    ],
)
def test_unusable_replies_are_role_failures(reply: str, reason: str) -> None:
    checker = LlmChecker(FixedReply(reply))
    with pytest.raises(RoleFailure, match=reason) as caught:
        asyncio.run(checker.answer_without_tools("Capital?", 0))
    assert caught.value.key == "checker.answer_without_tools"


@pytest.mark.parametrize(
    "text",
    [
        'Sure:\n```json\n{"answer": "Paris"}\n```',
        "{'answer': 'Paris',}",
        'Thinking {draft} ... final: {"answer": "Paris"} done',
        '<think>{"answer": "Rome"}</think>{"answer": "Paris"}',
    ],
)
def test_reply_shapes_give_the_object(text: str) -> None:
    checker = LlmChecker(FixedReply(text))
    assert asyncio.run(checker.answer_without_tools("Capital?", 0)) == "Paris"
    assert load_json_object(text.rsplit("</think>", 1)[-1]) == {"answer": "Paris"}


# --- a local engine -----------------------------------------------------------------------------


def test_engine_chat_on_scripted_engine_answers_and_truncation_fails() -> None:
    prompts: list[str] = []

    def script(prompt: str) -> str:
        prompts.append(prompt)
        return '<think>maybe {"answer": "Rome"}</think>\n{"answer": "Paris"}'

    engine = ScriptedEngine(script)
    answer = asyncio.run(LlmChecker(EngineChat(engine)).answer_without_tools("Capital?", 0))
    assert answer == "Paris" and prompts == [ANSWER_PROMPT.format(question="Capital?")]
    short = LlmChecker(EngineChat(engine, max_new_tokens=20))  # cut inside the thinking
    with pytest.raises(RoleFailure, match="checker.answer_without_tools"):
        asyncio.run(short.answer_without_tools("Capital?", 1))


def test_a_processor_config_builds_engine_and_endpoint_roles(tmp_path) -> None:
    from asearcher.consumers.synthesis.world_roles import WorldWriter
    from asearcher.producers.synthesis.llm_roles import (
        EndpointChat,
        EngineChat,
        LlmChecker,
        LlmWriter,
    )
    from asearcher.producers.synthesis.processor import SynthProcessorConfig, SynthRole, build_roles
    from tests.support.trainer import tiny_model_dir

    model_dir = tiny_model_dir(tmp_path / "policy")
    endpoint = ChatEndpointConfig(base_url="http://127.0.0.1:9/v1", model="checker")
    config = SynthProcessorConfig(
        world_entities=40,
        writer=SynthRole(kind="engine", model_dir=str(model_dir), max_new_tokens=64),
        checker=SynthRole(kind="endpoint", endpoint=endpoint),
    )
    writer, checker = build_roles(config)
    assert isinstance(writer, LlmWriter) and isinstance(writer.model, EngineChat)
    assert isinstance(checker, LlmChecker) and isinstance(checker.model, EndpointChat)
    world_writer, _ = build_roles(SynthProcessorConfig(world_entities=40, checker=config.checker))
    assert isinstance(world_writer, WorldWriter)
    with pytest.raises(ValueError, match="needs model_dir"):
        SynthRole(kind="engine")
    with pytest.raises(ValueError, match="kind must be one of"):
        SynthRole(kind="oracle")


def test_a_synthesis_prompt_from_a_file_is_what_the_model_reads(chat_server, tmp_path) -> None:
    template = tmp_path / "fuzz.txt"
    template.write_text("Blur one detail of: {question} (answer {answer}). JSON {{...}} please.")
    server = chat_server([ok({"question": "In which decade?", "answer": "1815", "change": "c"})])
    writer = LlmWriter(endpoint(server.url), prompts={"fuzz": str(template)})
    fuzzed = asyncio.run(writer.fuzz(DRAFT))
    assert fuzzed.question == "In which decade?"
    assert server.prompts() == [f"Blur one detail of: {BASE_Q} (answer 1815). JSON {{...}} please."]


@pytest.mark.parametrize(("files", "why"), [
    ({"fuzzz": "x"}, "no synthesis prompt 'fuzzz'"),
    ({"answer": "{question} {statements}"}, "prompt_files.answer: .* uses {statements}"),
])  # fmt: skip
def test_bad_synthesis_prompt_files_are_named(tmp_path, files: dict, why: str) -> None:
    from asearcher.producers.synthesis.processor import SynthRole

    paths = {}
    for name, text in files.items():
        (tmp_path / f"{name}.txt").write_text(text)
        paths[name] = str(tmp_path / f"{name}.txt")
    with pytest.raises(ValueError, match=why):
        SynthRole(kind="endpoint", endpoint=ChatEndpointConfig(base_url="http://x/v1", model="m"),
                  prompt_files=paths)  # fmt: skip
