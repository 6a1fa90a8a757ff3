"""Service configs from TOML files: typed, validated, with one-line errors naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import msgspec

Config = TypeVar("Config", bound=msgspec.Struct)


def load_config(kind: type[Config], what: str, path: Path | None, **overrides: Any) -> Config:
    """`kind` from TOML file `path` (or the defaults) with non-None top-level `overrides`.

    Raises ValueError with one line naming the bad field, e.g.
    "rollout config r.toml: Expected `int`, got `str` - at `$.staleness.eta`".
    """
    import tomllib

    raw = tomllib.loads(path.read_text()) if path else {}
    raw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{what}{f' {path}' if path else ''}: {exc}") from exc
