"""The configuration reference, generated from the config structs themselves.

Every run config section is a `msgspec.Struct` whose fields carry their description
(`Annotated[T, Meta(description=...)]`); this module walks the embedded run config
(`RunConfig()`, so each section shows the defaults the run actually uses) and writes one table
per section: field, type, default, description. `docs/configuration-reference.md` is its output,
and a test fails when that file is stale.
"""

from __future__ import annotations

import types
import typing
from typing import Any

import msgspec

from asearcher.cli.run.config import RunConfig
from asearcher.streams.service.config_file import meta_description

MAX_DEFAULT_CHARS = 60
HEADER = """# Configuration reference

Every setting of a run config (`asearcher stream up -c run.toml`, `asearcher learn -c
run.toml`), section by section, with the embedded run's defaults. Generated from the config
structs by `asearcher schema config-reference --out docs/configuration-reference.md`; do not
edit by hand. How settings combine (flags, environment, files) is in
[configuration.md](configuration.md).
"""


def reference_markdown() -> str:
    """The whole reference as Markdown."""
    sections: list[str] = [HEADER]
    _section(RunConfig(), "", sections)
    return "\n".join(sections)


def _section(config: msgspec.Struct, path: str, out: list[str]) -> None:
    """One table for `config` at `path`, then a section for each struct-valued field."""
    cls = type(config)
    doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
    title = f"`[{path}]`" if path else "top level"
    out.append(f"## {title}\n\n{doc} (`{cls.__name__}`)\n")
    out.append("| field | type | default | description |\n| --- | --- | --- | --- |")
    nested = []
    for field in msgspec.structs.fields(cls):
        value = getattr(config, field.name)
        if isinstance(value, msgspec.Struct):
            nested.append((value, f"{path}.{field.name}" if path else field.name))
            continue
        if (named := _struct_per_name(field.type)) is not None:  # [hosts.NAME]-like tables
            nested.append((named(), f"{path}.{field.name}.NAME" if path else f"{field.name}.NAME"))
        out.append(
            f"| `{field.encode_name}` | `{type_name(field.type)}` | {default_text(value)} "
            f"| {description(field.type)} |"
        )
    out.append("")
    for value, child in nested:
        _section(value, child, out)


def _struct_per_name(annotation: Any) -> type[msgspec.Struct] | None:
    """The struct of a `dict[str, Struct]` field (tables named by the user), else None."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _struct_per_name(typing.get_args(annotation)[0])
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is dict and len(args) == 2:
        value = args[1]
        if isinstance(value, type) and issubclass(value, msgspec.Struct):
            return value
    return None


def description(annotation: Any) -> str:
    """The field's description from its `Meta`, escaped for a table cell."""
    return meta_description(annotation).replace("|", "\\|")


def type_name(annotation: Any) -> str:
    """A short, readable name of a field's type."""
    if typing.get_origin(annotation) is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_name(arg) for arg in typing.get_args(annotation))
    if origin is typing.Literal:
        return " \\| ".join(repr(arg) for arg in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(type_name(arg) for arg in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def default_text(value: Any) -> str:
    """The default as JSON, shortened when long."""
    text = msgspec.json.encode(value).decode()
    if len(text) > MAX_DEFAULT_CHARS:
        text = text[: MAX_DEFAULT_CHARS - 1] + "…"
    return f"`{text}`".replace("|", "\\|")
