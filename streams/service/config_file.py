"""Service configs from TOML files: typed, validated, with one-line errors naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import msgspec

Config = TypeVar("Config", bound=msgspec.Struct)


def load_config(kind: type[Config], what: str, path: Path | None, **overrides: Any) -> Config:
    """`kind` from TOML file `path` (or the defaults) with non-None top-level `overrides`.

    A `.json` file is read as JSON (what `stream up` writes for the services it starts).
    Raises ValueError with one line naming the bad field, e.g.
    "rollout config r.toml: Expected `int`, got `str` - at `$.staleness.eta`".
    """
    raw = read_config_file(path, what) if path else {}
    raw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{what}{f' {path}' if path else ''}: {exc}") from exc


def read_config_file(path: Path, what: str) -> dict[str, Any]:
    """The table in TOML (or JSON) file `path`; a missing file or a syntax error is one line."""
    import tomllib

    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{what} {path}: cannot be read ({exc.strerror or exc})") from exc
    try:
        if path.suffix == ".json":
            raw = msgspec.json.decode(text)
        else:
            raw = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, msgspec.DecodeError) as exc:
        raise ValueError(f"{what} {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{what} {path}: expected a table at the top")
    return raw


def meta_description(annotation: Any) -> str:
    """The description an `Annotated[T, Meta(description=...)]` field type carries, or ""."""
    for meta in getattr(annotation, "__metadata__", ()):
        if isinstance(meta, msgspec.Meta) and meta.description:
            return meta.description
    return ""


def field_description(kind: type[msgspec.Struct], name: str) -> str:
    """The description of config field `name` of `kind` (what a flag overriding it shows)."""
    import typing

    text = meta_description(typing.get_type_hints(kind, include_extras=True)[name])
    if not text:
        raise ValueError(f"{kind.__name__}.{name} has no description")
    return text
