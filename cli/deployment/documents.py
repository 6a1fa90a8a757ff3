"""One YAML document of a manifest file: a Kubernetes object and the comment above it."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from typing import Any

import msgspec
import yaml

COMMENT_WIDTH = 98


class Document(msgspec.Struct, frozen=True):
    """An object (plain JSON-like data) and why it is as it is, for whoever reads the file."""

    body: dict[str, Any]
    comment: str = ""

    @property
    def kind(self) -> str:
        return str(self.body["kind"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (the config files in the ConfigMap stay readable)."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def render(documents: Iterable[Document]) -> str:
    """The documents as one YAML stream, each comment as `#` lines above its object."""
    parts = []
    for document in documents:
        lines = textwrap.wrap(document.comment, COMMENT_WIDTH) if document.comment else []
        comment = "".join(f"# {line}\n" for line in lines)
        body = yaml.dump(document.body, Dumper=_Dumper, sort_keys=False, width=100)
        parts.append(f"---\n{comment}{body}")
    return "".join(parts)
