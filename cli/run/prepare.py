"""What a run needs before its services start: the world, its knowledge base, the policy.

Each step is skipped when its output exists, so a second run (or `asearcher demo` after
`stream up`) reuses what the first one built.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from asearcher.cli.progress import LoggedProgress
from asearcher.producers.policy.model_init import PolicySpec

if TYPE_CHECKING:
    from asearcher.cli.run.config import DataConfig

console = Console()


def world_and_index(
    directory: Path, data: DataConfig, dense: bool = True
) -> tuple[dict[str, Path], Path]:
    """The synthetic world `data` describes in `directory` and its index in `directory/index`."""
    from asearcher.cli.jobs.indexing import build_index_with_progress
    from asearcher.consumers.world.world import generate_world, write_world

    stems = ("corpus", "qa_train", "qa_test") + (("qa_valid",) if data.world_valid_share else ())
    files = {stem: directory / f"{stem}.jsonl" for stem in stems}
    if not all(path.is_file() for path in files.values()):
        with console.status(f"generating a {data.world_entities}-entity synthetic world"):
            world = generate_world(
                seed=data.world_seed, entities=data.world_entities,
                questions=data.world_questions, max_hops=data.world_max_hops,
                filler=data.world_filler, names_from=data.world_names_from,
                max_answer_share=data.world_max_answer_share,
                valid_share=data.world_valid_share, test_share=data.world_test_share,
            )  # fmt: skip
            files = write_world(world, directory)
    # Resumable: a finished index is found built and skipped.
    build_index_with_progress(files["corpus"], directory / "index", dense)
    return files, directory / "index"


def demonstration_corpus(model_dir: Path, corpora: list[Path]) -> Path:
    """One corpus of the demonstration worlds' pages, beside the policy made from it."""
    combined = model_dir.with_name(f"{model_dir.name}-corpus.jsonl")
    if not combined.is_file():
        partial = combined.with_suffix(".partial")
        with partial.open("wb") as out:
            for corpus in corpora:
                out.write(corpus.read_bytes())
        partial.rename(combined)
    return combined


def policy(directory: Path, corpus: Path, seed: int, size: PolicySpec | None = None) -> Path:
    """The CPU policy in `directory`: if missing, copied from this machine's cache of policies
    (`policy_cache`) or created (tokenizer trained on `corpus`) and kept there."""
    from asearcher.cli.run.policy_cache import copy_or_create, policy_key
    from asearcher.producers.policy.model_init import parameter_count

    if not (directory / "config.json").is_file():
        spec = size or PolicySpec()
        key = policy_key(corpus, seed, spec)
        kept = copy_or_create(directory, key, lambda d: create_policy(d, corpus, seed, spec))
        if kept is not None:
            console.print(f"policy: made before on this machine, copied from {kept}")
    console.print(f"policy: {parameter_count(directory):,} parameters in {directory}")
    pretraining_line(directory)
    return directory


def create_policy(directory: Path, corpus: Path | None, seed: int, size: PolicySpec) -> Path:
    """`init_model` with a bar over its pretraining steps (the tokenizer takes seconds, the
    pretraining minutes)."""
    from transformers.utils import logging as hf_logging

    from asearcher.producers.policy.model_init import init_model

    hf_logging.disable_progress_bar()  # ours says what is happening
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn())  # fmt: skip
    with LoggedProgress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("training the tokenizer, building the policy", total=None, loss="-")

        def advance(step: int, steps: int, loss: float) -> None:
            phase = "to copy from its context" if step <= size.pretrain_steps else "to read"
            bar.update(task, description=f"pretraining it {phase}",
                       completed=step, total=steps, loss=f"{loss:.3f}")  # fmt: skip

        return init_model(directory, corpus, seed=seed, progress=advance, **size.init_kwargs())


def pretraining_line(directory: Path) -> None:
    """Say how well the policy in `directory` copies from its context and reads, if it was
    pretrained."""
    from asearcher.producers.policy.model_init import read_pretraining
    from asearcher.producers.policy.pretrain import FAR_LEAD

    report = read_pretraining(directory)
    if report is None:
        return
    reading = f" and {report.reading_steps} to read" if report.reading_steps else ""
    console.print(
        # The report travels with the policy: a copied one was made earlier, maybe elsewhere.
        f"pretrained {report.steps} steps to copy{reading} ({report.seconds:.0f} s when it was "
        f"made): copies {report.copy_after:.0%} of repeated random spans "
        f"({report.copy_before:.0%} before)"
    )
    if report.copy_far is not None:
        # The agent copies names from pages that start hundreds of tokens into its context.
        console.print(
            f"copies {report.copy_far:.0%} of them {FAR_LEAD} tokens into a sequence (where an "
            "agent's pages start)"
        )
    if report.reading_after is not None:
        console.print(
            f"reads: answers {report.reading_after:.0%} of questions about an unseen world's "
            f"pages ({report.reading_before:.0%} before)"
        )
    if report.reading_far is not None:
        console.print(
            f"reads {report.reading_far:.0%} of them {FAR_LEAD} tokens into a sequence"
            + (f" (read after up to {report.reading_lead} tokens of text)" if report.reading_lead
               else " (read at the start of a sequence only)")
        )  # fmt: skip
