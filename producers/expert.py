"""A scripted policy for the synthetic world: searches the first page, follows the chain, answers.

It stands in for a trained model where agent logic must be deterministic (tests, the demo,
benchmarks of the bus): paired with `ScriptedEngine`, it reads the prompt the agent built, finds
the question, and writes the next action from the tool output so far. It only follows a link
that the last tool output really contains, so it answers correctly only when the tools work.
"""

from __future__ import annotations

import random
import re
from urllib.parse import unquote

from asearcher.consumers.world import WorldQuestion

_QUESTION = re.compile(r"User: (.*)\nAssistant:")
_INFORMATION = re.compile(r"<information>\n(.*?)\n</information>", re.DOTALL)


def title_of(url: str) -> str:
    """The page title a synthetic-world URL names."""
    return unquote(url.rsplit("/", 1)[-1]).replace("_", " ")


class ExpertScript:
    """Maps a prompt to the next output: search, then access each hop, then answer.

    With `mistake_rate` > 0 it answers "unknown" instead of the answer it found that often, at
    random, so the trajectories of one group get mixed rewards (a stand-in for a policy that is
    sometimes right: groups carry a learning signal and the trainer takes steps).
    """

    def __init__(
        self,
        questions: list[WorldQuestion],
        think: str = "Let me look this up.",
        *,
        mistake_rate: float = 0.0,
        seed: int | None = None,
    ) -> None:
        if not 0.0 <= mistake_rate <= 1.0:
            raise ValueError(f"mistake_rate must be within [0, 1], got {mistake_rate}")
        self.by_text = {q.question: q for q in questions}
        self.think = think
        self.mistake_rate = mistake_rate
        self._random = random.Random(seed)

    def __call__(self, prompt: str) -> str:
        found = _QUESTION.search(prompt)
        question = self.by_text.get(found.group(1)) if found else None
        if question is None:
            return "<think>I do not know this question.</think>\n<answer>unknown</answer>"
        observations = _INFORMATION.findall(prompt)
        return f"<think>{self.think}</think>\n{self._action(question, observations)}"

    def _action(self, question: WorldQuestion, observations: list[str]) -> str:
        urls = question.supporting_urls
        step = len(observations)
        if step == 0:
            return f"<search>{title_of(urls[0])}</search>"
        if step <= len(urls):
            # Follow a URL only when the last observation showed it (search hit or page link).
            if (
                urls[step - 1] not in observations[-1]
                and title_of(urls[step - 1]) not in (observations[-1])
            ):
                return "<answer>unknown</answer>"
            return f"<access>{urls[step - 1]}</access>"
        answer = question.answers[0]
        if answer not in observations[-1] or self._random.random() < self.mistake_rate:
            answer = "unknown"
        return f"<answer>{answer}</answer>"
