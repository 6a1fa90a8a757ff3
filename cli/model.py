"""`asearcher model init`: a tiny random policy in Hugging Face format, to run everything on CPU."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from asearcher.cli.errors import CliError
from asearcher.cli.options import Home
from asearcher.cli.wiring import as_cli_error

app = typer.Typer(
    help="Create the small policy model that CPU runs and tests use.", no_args_is_help=True
)
console = Console()


@app.callback()
def model() -> None:
    """Create the small policy model that CPU runs and tests use."""
    # A callback keeps `init` a sub-command even while it is the only one.


@app.command("init")
def init(
    out: Annotated[
        Path | None,
        typer.Option(help="Directory to write the model into.", show_default="<home>/model"),
    ] = None,
    corpus: Annotated[
        Path | None,
        typer.Option(
            help="corpus.jsonl to train the tokenizer on (`asearcher world generate` writes one).",
            show_default="a 300-entity synthetic world",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Same seed and corpus give identical files.")] = 0,
    hidden_size: Annotated[int, typer.Option(help="Width of the transformer.")] = 256,
    layers: Annotated[int, typer.Option(help="Number of transformer layers.")] = 4,
    vocab_size: Annotated[int, typer.Option(help="Most tokens the tokenizer may have.")] = 4096,
    home: Home = None,
) -> None:
    """Train a byte-level BPE tokenizer on CORPUS and write a randomly initialised Qwen2 model.

    The directory is a standard Hugging Face checkpoint (config.json, model.safetensors,
    tokenizer files): the engines load it exactly as they would load a real model.
    """
    from asearcher.streams.settings import state_dir

    target = out or state_dir(home) / "model"
    if corpus is not None and not corpus.is_file():
        raise CliError(f"--corpus {corpus} is not a file")
    if hidden_size % 64 or hidden_size < 64:
        raise CliError(f"--hidden-size must be a positive multiple of 64, not {hidden_size}")
    if layers < 1:
        raise CliError(f"--layers must be at least 1, not {layers}")
    heads = hidden_size // 64  # head size 64, as in Qwen2
    started = time.perf_counter()
    with console.status(f"training a tokenizer and building the model in {target}"):
        from transformers.utils import logging as hf_logging

        from asearcher.producers.model_init import init_model, parameter_count

        hf_logging.disable_progress_bar()  # the spinner already says what is happening

        with as_cli_error(ValueError):
            written = init_model(
                target,
                corpus,
                vocab_size=vocab_size,
                hidden_size=hidden_size,
                layers=layers,
                heads=heads,
                kv_heads=heads // 2 if heads % 2 == 0 else heads,
                intermediate_size=_intermediate_size(hidden_size),
                seed=seed,
            )
    seconds = time.perf_counter() - started
    console.print(
        f"{parameter_count(written):,} parameters written to {written} in {seconds:.1f} s"
    )


def _intermediate_size(hidden_size: int) -> int:
    # Qwen2's MLP ratio (~2.75x), rounded to a multiple of 64: 256 -> 704.
    return round(hidden_size * 2.75 / 64) * 64
