"""A scripted policy for the synthetic world: searches the first page, follows the chain, answers.

It stands in for a trained model where agent logic must be deterministic (tests, the demo,
benchmarks of the bus): paired with `ScriptedEngine`, it reads the context the agent built and
writes what a model following ASearcher's turn structure would:
- a call whose context ends with the think priming (the first call, or one that reads an
  observation) gets a note on what the observation shows, `</think>`, then the next action
  (the engine cuts a think call at `</think>`, an action call at the action's closing tag);
- a call whose context ends with `</think>` (an action call) gets the action its notes since
  the last action lead to. Page chunks already read are shown short, so, like a model, it acts
  on its notes rather than on the page.
It only follows a link that an observation really showed, so it answers correctly only when the
tools work.

What it writes repeats what it read token for token, as a policy that copies would: a query is
written as the question writes the name (` Name` after a space, as the reference's
`<search> query </search>`), a URL as the results and pages write it, and an answer as the page
writes it: a linked name keeps its `[` in the note and is written right after `<answer>`, where
the tokenizer splits it the same way; plain text keeps its leading space.
"""

from __future__ import annotations

import random
import re
from urllib.parse import unquote

from asearcher.consumers.formats.action_format import THINK_CLOSE
from asearcher.consumers.world.stable_draw import stable_unit
from asearcher.consumers.world.world import WorldQuestion
from asearcher.producers.agents.prompt import question_of

_ASSISTANT = "\n\nAssistant:"  # where the prompt ends and the model's conversation begins
_INFORMATION = re.compile(r"<information>\n(.*?)\n</information>", re.DOTALL)
_ACTION_END = re.compile(r"</(?:search|access)>")
_LINK_NOTE = re.compile(r"The page links to (\S+)\.")
_ANSWER_NOTE = re.compile(r"The answer is (.+?)\.\n")
_LINKED = re.compile(r"\[(.+)\]")  # a name the page links, as the note quotes it
# A full stop then a new sentence (a capital, a link or a heading, which search results show
# on the same line); URLs and numbers have no space after their dots.
_SENTENCE_END = re.compile(r"(?<=\.)\s+(?=[A-Z\[#])|\s*#+\s")


def title_of(url: str) -> str:
    """The page title a synthetic-world URL names."""
    return unquote(url.rsplit("/", 1)[-1]).replace("_", " ")


class ExpertScript:
    """Maps a context to the next output: search, then access each hop, then answer.

    With `mistake_rate` > 0 it answers "unknown" instead of the answer it found that often, at
    random, so the trajectories of one group get mixed rewards (a stand-in for a policy that is
    sometimes right: groups carry a learning signal and the trainer takes steps).

    With `shortcut_rate` > 0 it stops reading too early that often, at each page it would open:
    instead of opening the page it answers with the page's name, the name in view (after the
    search, the question's own subject; on a 2-hop question, the bridge entity). Whether it
    stops at a page is drawn from the seed, the question and the page alone, so a question's
    demonstration is the same in every run, whatever order concurrent plays finish in. A policy
    cloned from it inherits the habit of answering before it has read what the question needs,
    a habit that RL, which pays only right answers, can unlearn by reading on.

    With `quote`, its note on a page is the page's sentence that holds what it acts on (the
    link it follows next, or the answer), copied as the page writes it, instead of a note
    naming the link or answer alone: a clone then learns to find the sentence that matches the
    question's relation ("lies on the ... River" for "On which river ...") and to act on what
    it has just copied, rather than to pick one name among all those the page links.

    With `cue`, its note is the shortest run of words of what it read that leads to what it
    acts on and to nothing else, followed by that thing as written (`cue_span`): "[1] Drekaugu
    University\nURL: https://…" for the page to open after a search, "headquartered in
    [Bauzeneil](https://…)" for the link a question's relation asks for, "lies on the Peshas
    River" for the answer. A clone then has one choice to learn, the cue words the question's
    relation calls for, and copying does the rest: what follows those words on the page is the
    answer, where a note that opens with the page's subject (`quote`) leaves it to choose among
    every sentence about that subject.
    """

    def __init__(
        self,
        questions: list[WorldQuestion],
        think: str = "Let me look this up.",
        *,
        mistake_rate: float = 0.0,
        shortcut_rate: float = 0.0,
        quote: bool = False,
        cue: bool = False,
        seed: int | None = None,
    ) -> None:
        for name, rate in (("mistake_rate", mistake_rate), ("shortcut_rate", shortcut_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {rate}")
        self.by_text = {q.question: q for q in questions}
        self.think = think
        self.mistake_rate = mistake_rate
        self.shortcut_rate = shortcut_rate
        self.quote = quote
        self.cue = cue
        self.seed = seed
        self._random = random.Random(seed)

    def __call__(self, context: str) -> str:
        asked = question_of(context)
        question = self.by_text.get(asked.strip()) if asked else None
        _, _, conversation = context.partition(_ASSISTANT)
        if conversation.endswith(THINK_CLOSE):  # an action call: act on the notes
            return "\n" + self._action(question, conversation, "")
        if question is None:
            note = "I do not know this question."
        else:
            note = self._note(question, conversation)
        return f"{note}{THINK_CLOSE}\n{self._action(question, conversation, note)}"

    def _note(self, question: WorldQuestion, conversation: str) -> str:
        """What the observation this call reads shows, in a form `_action` reads back."""
        target = self._target(question, conversation)
        if target is None:
            return self.think
        # Everything shown since the last action: chunks read earlier are shown short, and a
        # single call (turns = "single_call") reads all chunks of a page at once.
        seen = "\n".join(_INFORMATION.findall(_after_last_action(conversation)))
        if self.cue:
            evidence = cue_span(seen, _as_written(seen, question.answers[0], target))
            return f"{evidence}\n" if evidence else "Nothing here.\n"
        if self.quote:
            needle = question.answers[0] if target == "answer" else target
            evidence = sentence_with(seen, needle)
            return f"{evidence}\n" if evidence else "Nothing here.\n"
        if target == "answer":
            answer = question.answers[0]
            if f"[{answer}](" in seen:
                return f"The answer is [{answer}].\n"
            return f"The answer is {answer}.\n" if answer in seen else "Nothing here.\n"
        if target in seen or title_of(target) in seen:
            return f"The page links to {target}.\n"
        return "Nothing here.\n"

    def _action(self, question: WorldQuestion | None, conversation: str, note: str) -> str:
        """The next action, from the notes written since the last action plus `note`."""
        if question is None:
            return "<answer>unknown</answer>"
        target = self._target(question, conversation)
        if target is None:
            return f"<search> {title_of(question.supporting_urls[0])} </search>"
        notes = self._notes(conversation) + note
        if target == "answer" and (self.quote or self.cue):
            return self._quoted_answer(question.answers[0], notes)
        if target == "answer":
            found = _ANSWER_NOTE.search(notes)
            if found is None or self._random.random() < self.mistake_rate:
                return "<answer>unknown</answer>"
            linked = _LINKED.fullmatch(found.group(1))
            answer = linked.group(1) if linked else f" {found.group(1)}"
            return f"<answer>{answer}</answer>"
        quoted = (self.quote or self.cue) and target in notes
        links = [target] if quoted else _LINK_NOTE.findall(notes)
        if target not in links:
            return "<answer>unknown</answer>"
        if self.shortcut_rate and self._stops_before(question, target):
            return f"<answer>{title_of(target)}</answer>"
        return f"<access> {target} </access>"

    def _stops_before(self, question: WorldQuestion, page: str) -> bool:
        """Whether the question's play answers instead of opening `page`, at `shortcut_rate`."""
        return stable_unit(f"{self.seed}|{question.question}|{page}") < self.shortcut_rate

    def _quoted_answer(self, answer: str, notes: str) -> str:
        """The answer the quoted sentence holds, written as the page writes it."""
        if answer not in notes or self._random.random() < self.mistake_rate:
            return "<answer>unknown</answer>"
        linked = f"[{answer}](" in notes
        return f"<answer>{answer}</answer>" if linked else f"<answer> {answer}</answer>"

    def _target(self, question: WorldQuestion, conversation: str) -> str | None:
        """None before any action, then the next supporting URL to open, then "answer"."""
        taken = len(_ACTION_END.findall(_INFORMATION.sub("", conversation)))
        urls = question.supporting_urls
        if taken == 0:
            return None
        return urls[taken - 1] if taken <= len(urls) else "answer"

    @staticmethod
    def _notes(conversation: str) -> str:
        """What the model wrote since the last tool action: the notes of the calls that read
        its observations (the observations themselves left out)."""
        return _INFORMATION.sub("", _after_last_action(conversation))


def sentence_with(text: str, needle: str) -> str | None:
    """The shortest sentence of `text` that contains `needle`, as written (links included):
    after a search, the hit's own URL line rather than another page's text that links it."""
    found = [
        sentence.strip()
        for line in text.splitlines()
        for sentence in _SENTENCE_END.split(line)
        if needle in sentence
    ]
    return min(found, key=len, default=None)


def _as_written(seen: str, answer: str, target: str) -> str:
    """What the note quotes of `target` ("answer" or a URL), as the observation writes it: a
    search result's title and URL lines, else a linked name with its link, else as is."""
    if target != "answer":
        result = re.search(rf"\[\d+\] ([^\n]+)\nURL: {re.escape(target)}", seen)
        if result is not None:
            return f"{result.group(1)}\nURL: {target}"
    pattern = (
        rf"\[{re.escape(answer)}\]\([^)\s]+\)"
        if target == "answer"
        else rf"\[[^\]\n]+\]\({re.escape(target)}\)"
    )
    linked = re.search(pattern, seen)
    if linked is not None:
        return linked.group(0)
    return answer if target == "answer" else target


MAX_CUE_WORDS = 12


def cue_span(text: str, target: str) -> str | None:
    """The shortest run of whole words of `text` ending with its first `target` whose words
    before `target` are followed by `target` wherever they occur in `text` (None if `target`
    is not in `text`): what a reader copies from, once it has written those words."""
    at = text.find(target)
    if at < 0:
        return None
    starts = [m.start() for m in re.finditer(r"(?<!\S)\S", text[:at])][-MAX_CUE_WORDS:]
    for start in reversed(starts):
        cue = text[start:at]
        places = [m.start() for m in re.finditer(re.escape(cue), text)]
        if all(text.startswith(target, place + len(cue)) for place in places):
            return text[start : at + len(target)]
    return text[starts[0] if starts else at : at + len(target)]


def _after_last_action(conversation: str) -> str:
    """The conversation after the model's last tool action (observations cannot end one)."""
    written = _INFORMATION.sub(lambda block: "_" * len(block.group(0)), conversation)
    ends = list(_ACTION_END.finditer(written))
    return conversation[ends[-1].end() :] if ends else conversation
