"""What a run needs before its services start: the world, its knowledge base, the policy.

Each step is skipped when its output exists, so a second run (or `asearcher demo` after
`stream up`) reuses what the first one built.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from asearcher.producers.model_init import PolicySpec

if TYPE_CHECKING:
    from asearcher.cli.run_config import DataConfig

console = Console()


def world_and_index(
    directory: Path, data: DataConfig, dense: bool = True
) -> tuple[dict[str, Path], Path]:
    """The synthetic world `data` describes in `directory` and its index in `directory/index`."""
    from asearcher.cli.tools import index_build
    from asearcher.consumers.world import generate_world, write_world

    files = {stem: directory / f"{stem}.jsonl" for stem in ("corpus", "qa_train", "qa_test")}
    if not all(path.is_file() for path in files.values()):
        with console.status(f"generating a {data.world_entities}-entity synthetic world"):
            world = generate_world(
                seed=data.world_seed, entities=data.world_entities,
                questions=data.world_questions, max_hops=data.world_max_hops,
                filler=data.world_filler,
            )  # fmt: skip
            files = write_world(world, directory)
    # Resumable: a finished index is found built and skipped.
    index_build(corpus=files["corpus"], out=directory / "index", dense=dense)
    return files, directory / "index"


def policy(directory: Path, corpus: Path, seed: int, size: PolicySpec | None = None) -> Path:
    """The CPU policy in `directory`, created (tokenizer trained on `corpus`) if missing."""
    from asearcher.producers.model_init import init_model, parameter_count

    if not (directory / "config.json").is_file():
        with console.status("creating the CPU policy (tokenizer trained on the world)"):
            init_model(directory, corpus, seed=seed, **(size or PolicySpec()).init_kwargs())
    console.print(f"policy: {parameter_count(directory):,} parameters in {directory}")
    return directory
