"""The agent's prompt: how a question is put to the model.

One template for every engine, so a trajectory's prompt tokens are reproducible from the question
alone. The wording follows ASearcher's search-agent prompt: think, then act with exactly one tag.
"""

from __future__ import annotations

AGENT_TEMPLATE = """\
A conversation between User and Assistant. The user asks a question and the assistant answers it \
by searching a knowledge base and reading its pages.
The assistant first thinks inside <think> </think>, then takes exactly one action:
- <search>query</search> searches the knowledge base and returns titles, URLs and snippets;
- <access>url</access> reads one page;
- <answer>text</answer> gives the final answer, as short as possible.
Search and page results come back inside <information> </information>.
User: {question}
Assistant:"""


def agent_prompt(question: str) -> str:
    """The prompt text for `question`; every turn then opens with <think>."""
    return AGENT_TEMPLATE.format(question=question.strip())
