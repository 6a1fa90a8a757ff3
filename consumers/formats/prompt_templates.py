"""Prompts from files: a user's own wording for a checkpoint trained on other prompts.

A template is a text file rendered with `str.format`: `{question}` (and, in the training prompt,
`{instruction}`: the "invalid question" or "most likely answer" instruction drawn per question)
are filled in; a literal brace is written `{{` or `}}`. The files are read once per process and
checked when the config that names them is loaded, so a missing file or an unknown placeholder is
a one-line error naming the setting, not a crash in every rollout.
"""

from __future__ import annotations

import functools
import string
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta

# The placeholders each template may use; the first is required.
TEMPLATE_FIELDS: dict[str, tuple[str, ...]] = {
    "training": ("question", "instruction"),
    "evaluation": ("question",),
    # The judge: the predicted answer, the question and the gold answers (a JSON list).
    "judge": ("prediction", "question", "golds"),
}


class PromptTemplates(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Files whose text replaces the project's wording of the agent's prompts ("" keeps it)."""

    training: Annotated[
        str, Meta(description="the training prompt: {question}, optionally {instruction}")
    ] = ""
    evaluation: Annotated[str, Meta(description="the evaluation prompt: {question}")] = ""
    think_priming: Annotated[
        str,
        Meta(
            description=(
                "What follows every observation, verbatim (the project's: a newline, <think>,"
                " a newline)."
            )
        ),
    ] = ""

    def __post_init__(self) -> None:
        for name in ("training", "evaluation"):
            path = getattr(self, name)
            if path:
                check_template(path, TEMPLATE_FIELDS[name], f"templates.{name}")
        if self.think_priming:
            template_text(self.think_priming, "templates.think_priming")


def template_text(path: str, setting: str) -> str:
    """The text of template file `path`; ValueError naming `setting` if it cannot be read."""
    try:
        return _read(str(Path(path).expanduser()))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{setting}: cannot read template {path} ({exc})") from exc


def check_template(
    path: str, fields: tuple[str, ...], setting: str, required: tuple[str, ...] | None = None
) -> str:
    """The template at `path` after checking its placeholders: each one of `fields`, and every
    one of `required` (default: the first of `fields`) placed."""
    text = template_text(path, setting)
    try:
        used = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
    except ValueError as exc:  # a lone brace
        raise ValueError(f"{setting}: {path} is not a template ({exc}; write {{{{ for {{)") from exc
    unknown = sorted(used - set(fields))
    if unknown:
        allowed = ", ".join(f"{{{name}}}" for name in fields)
        raise ValueError(f"{setting}: {path} uses {{{unknown[0]}}}; it may use {allowed}")
    missing = [name for name in (fields[:1] if required is None else required) if name not in used]
    if missing:
        raise ValueError(f"{setting}: {path} never places {{{missing[0]}}}")
    return text


def placeholders(template: str) -> tuple[str, ...]:
    """The placeholders of `template`, in order of first use."""
    names = [name for _, name, _, _ in string.Formatter().parse(template) if name]
    return tuple(dict.fromkeys(names))


def render(path: str, name: str, setting: str = "", **values: str) -> str:
    """Template `path` of prompt `name` filled with `values` (checked when its config loaded)."""
    return check_template(path, TEMPLATE_FIELDS[name], setting or f"templates.{name}").format(
        **values
    )


@functools.lru_cache(maxsize=32)
def _read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")
