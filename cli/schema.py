"""`asearcher schema ...`: the event schema for clients in other languages."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from asearcher.cli.wiring import as_cli_error

app = typer.Typer(help="Publish the event schema so any Kafka client can read the topics.")
console = Console()


@app.command()
def export(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the schemas into.")],
) -> None:
    """Write a JSON Schema per event kind (<Kind>.schema.json) and topics.json into OUT_DIR."""
    from asearcher.streams.wire.schema import export_schemas

    with as_cli_error(OSError, os_error=f"cannot write the schemas into {out_dir}"):
        written = export_schemas(out_dir)
    console.print(f"wrote {len(written)} files to {out_dir}")


@app.command("config-reference")
def config_reference(
    out: Annotated[
        Path | None, typer.Option(help="Write it to this file (default: print it).")
    ] = None,
) -> None:
    """The configuration reference (every run config field with its default and description)."""
    from asearcher.cli.jobs.config_reference import reference_markdown

    text = reference_markdown()
    if out is None:
        console.print(text, markup=False, highlight=False)
        return
    with as_cli_error(OSError, os_error=f"cannot write {out}"):
        out.write_text(text)
    console.print(f"wrote {out}")
