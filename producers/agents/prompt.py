"""What the model reads: the prompt of a question and the text of every observation.

One module for training and evaluation, so both put questions and tool output to the model in
the same words. The layout follows ASearcher's plain-text (no chat template) search agent:
- the training prompt describes the tools (search and access, or search only), asks for
  reasoning in `<think> </think>` and an `<answer>`, carries either the instruction allowing
  "the question is invalid" or the one asking for the most likely answer, and ends with the
  think priming `<think>\\n`;
- the evaluation prompt says the question is valid, has no invalid instruction, and ends with
  `<think>`;
- every observation is `\\n\\n<information>\\n…\\n</information>` followed by the think priming;
  a page comes as numbered chunks, each shown in full once and as its first 100 characters in
  every later context.
"""

from __future__ import annotations

import re
from typing import Literal, get_args

from asearcher.consumers.formats.prompt_templates import PromptTemplates, render, template_text
from asearcher.consumers.world.stable_draw import stable_unit
from asearcher.streams.wire.events import Purpose

ToolSet = Literal["search_access", "search_only"]
TOOL_SETS: tuple[str, ...] = get_args(ToolSet)
# What an evaluation plays: the reference's own evaluation prompt, or the training prompt with
# the "most likely answer" instruction (for a policy too small to bridge a prompt it never saw).
EvalStyle = Literal["reference", "training"]
EVAL_STYLES: tuple[str, ...] = get_args(EvalStyle)

THINK_PRIMING = "\n<think>\n"  # what follows every observation: the model goes on thinking
SHORT_CHUNK_CHARS = 100  # what later contexts keep of a page chunk already read
NO_PAGE = "No More Information is Found for this URL."
NO_RESULTS = "No search results are found."

_INTRO = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "answers it. The Assistant reasons about the question and the information found so far, "
    "keeps the facts that matter, calls a search engine for what it still needs, opens web "
    "pages at given urls, and gives the user the answer. "
)
_TOOLS: dict[str, str] = {
    "search_access": (
        "To search, the Assistant writes <search> query </search>; to open a page, it writes "
        "<access> url </access>; search results and page contents come back between "
        "<information> and </information>. "
    ),
    "search_only": (
        "To search, the Assistant writes <search> query </search>; search results come back "
        "between <information> and </information>. "
    ),
}
_FORMAT = (
    " The Assistant reasons inside <think> </think>. At the end it writes the answer inside "
    "<answer> and </answer>, i.e. <answer> answer here </answer>. When the question asks for "
    "several things, all of them go inside one <answer> </answer>, separated by commas. "
)
INVALID_INSTRUCTION = (
    "If the Assistant finds that the question is invalid, e.g. no answer fits everything the "
    "question says, it replies '<answer> the question is invalid. </answer>'."
)
VALID_INSTRUCTION = "You should try to find the most likely answer. "
EVAL_NOTE = (
    " \n\nNote: the question is a valid question, and the Assistant should try to find a correct "
    "answer. \n\n"
)
_TRAIN_QUESTION = (
    " \n\nUser: \n\n{question}. \n\nAnswer in the same language as the question. "
    "\n\nAssistant: \n<think>\n"
)
_EVAL_QUESTION = "User: {question}\n\nAssistant: \n<think>"
# The training prompt without its instructions (`AgentConfig.brief_prompt`): 34 tokens on the
# learning run's tokenizer against 451, so that a small policy's observations stand where it
# copies from them (docs/learning.md); the expert and `question_of` read it as the eval form.
BRIEF_QUESTION = "User: {question}\n\nAssistant: \n<think>\n"
# Where the question sits in either prompt; non-greedy, so text after the prompt never matches.
_QUESTION = re.compile(
    r"User: \n\n(?P<train>.*?)\. \n\nAnswer in the same language|User: (?P<eval>.*?)\n\nAssistant:",
    re.DOTALL,
)


def project_template(name: str, tools: ToolSet = "search_access") -> str:
    """The project's own wording of prompt `name` ("training" or "evaluation") as a template,
    the starting point of a user's own (see `producers/prompt_templates.py`)."""
    if name == "training":
        return _INTRO + _TOOLS[tools] + _FORMAT + "{instruction}" + _TRAIN_QUESTION
    if name == "evaluation":
        head = _INTRO + _TOOLS["search_access"] + _FORMAT.rstrip(" ")
        return head + EVAL_NOTE + _EVAL_QUESTION
    raise ValueError(f"no prompt named {name!r}: training or evaluation")


def training_prompt(
    question: str,
    *,
    valid_instruction: bool,
    tools: ToolSet,
    templates: PromptTemplates | None = None,
    brief: bool = False,
) -> str:
    """The training prompt of `question` (in the user's template when `templates` names one).

    `valid_instruction` replaces the instruction that allows answering "the question is
    invalid" with the one asking for the most likely answer; `brief` leaves out every
    instruction (`BRIEF_QUESTION`).
    """
    instruction = VALID_INSTRUCTION if valid_instruction else INVALID_INSTRUCTION
    values = {"question": question.strip(), "instruction": instruction}
    if templates is not None and templates.training:
        return render(templates.training, "training", **values)
    if brief:
        return BRIEF_QUESTION.format(question=values["question"])
    return project_template("training", tools).format(**values)


def eval_prompt(question: str, templates: PromptTemplates | None = None) -> str:
    """The evaluation prompt of `question`: search and access, the question said to be valid."""
    if templates is not None and templates.evaluation:
        return render(templates.evaluation, "evaluation", question=question.strip())
    return project_template("evaluation").format(question=question.strip())


def think_priming(templates: PromptTemplates | None = None) -> str:
    """What follows every observation: the user's file's text, or the project's priming."""
    if templates is not None and templates.think_priming:
        return template_text(templates.think_priming, "templates.think_priming")
    return THINK_PRIMING


def agent_prompt(
    question: str,
    *,
    purpose: Purpose = "train",
    valid_instruction: bool = False,
    tools: ToolSet = "search_access",
    eval_style: EvalStyle = "reference",
    templates: PromptTemplates | None = None,
    brief: bool = False,
) -> str:
    """The prompt for a request of `purpose`: for "eval" the evaluation prompt (or, in the
    "training" style, the training prompt asking for the most likely answer), else training."""
    if purpose == "eval" and eval_style == "reference":
        return eval_prompt(question, templates)
    if purpose == "eval":
        valid_instruction = True
    return training_prompt(
        question, valid_instruction=valid_instruction, tools=tools, templates=templates, brief=brief
    )


def question_of(text: str) -> str | None:
    """The question in a context that starts with any of this module's prompts, else None."""
    found = _QUESTION.search(text)
    if found is None:
        return None
    return found.group("train") if found.group("train") is not None else found.group("eval")


def valid_instruction_for(group_id: str, ratio: float) -> bool:
    """Whether the question of group `group_id` gets the "most likely answer" instruction.

    Drawn with probability `ratio` per question as in ASearcher, but from a hash of the group
    id rather than a random generator: every trajectory of a group, on whichever producer,
    and a replay of the request all get the same prompt.
    """
    return stable_unit(group_id) < ratio


def information(body: str) -> str:
    """A tool output block as it enters the context."""
    return f"\n\n<information>\n{body}\n</information>"


def observation(body: str) -> str:
    """The text appended after an action: the tool output block, then the think priming."""
    return information(body) + THINK_PRIMING


def page_information(number: int, chunk: str) -> tuple[str, str]:
    """(full, short) block of chunk `number` (1-based) of a page; short keeps 100 characters."""
    head = f">>>> Page {number} >>>>\n\n"
    return information(head + chunk), information(head + chunk[:SHORT_CHUNK_CHARS])
