"""The warm start's clone, made once per machine: a later run with the same inputs copies it.

Cloning and choosing the best clone take about 8 of a first `learn`'s minutes, and the same
policy, demonstrations and settings make the same clone every time (the demonstrations are
cloned in an order of their content, the shuffles and the scoring are seeded). So the clone
kept is announced again by any later run whose inputs digest alike: the policy's files, every
demonstration's tokens and reward, the cloning and selection settings, the demonstration
worlds' held-out questions and pages, this package's code (its syntax, not its docstrings or
comments), the libraries' versions and the threads torch computes with. A change to any of them
clones afresh.

Each cloning order is kept too, as it is scored (`keep_order`): a warm start cut while cloning
its second order, the next run's warm start clones only that one (a first `learn` spends about
4 minutes on each). Once the clone is chosen and kept, the orders kept for it are dropped.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from msgspec import Meta

from asearcher.cli.run.machine_cache import (
    code_digest,
    files_digest,
    keep,
    kept_dir,
    library_versions,
)

if TYPE_CHECKING:
    import torch

    from asearcher.cli.run.config import Paths, Resolved, RunConfig
    from asearcher.trainer.sft.sft_job import SftConfig, TrainingSet

_LIBRARIES = ("torch", "transformers", "tokenizers", "deepspeed")
# The sub-packages whose code clones, scores and serves: an edit to any clones afresh.
_CODE = ("streams", "producers", "consumers", "trainer", "cli")
_WEIGHTS, _RECORD = "weights.pt", "clone.json"


class KeptClone(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a kept clone was: enough to announce it again without cloning."""

    seed: Annotated[int, Meta(description="the shuffle seed of the order it was cloned in")]
    losses: Annotated[
        list[float], Meta(description="its cloning loss per step, up to the weights kept")
    ]
    notes: Annotated[
        dict[str, Any], Meta(description="how it was chosen, as its version's manifest says")
    ] = {}


def clones_dir() -> Path:
    """Where this machine keeps the clones warm starts made."""
    return kept_dir("clones")


def clone_key(
    config: RunConfig, resolved: Resolved, where: Paths, sft: SftConfig, data: TrainingSet
) -> str:
    """A digest of everything that makes the warm start's clone (module docstring)."""
    import torch

    import asearcher

    digest = hashlib.sha256()
    files_digest(digest, where.model_dir)
    for t in data.trajectories:
        digest.update(msgspec.json.encode((
            t.question_id, t.sample_index, t.token_ids, t.loss_mask, t.logprobs,
            t.prompt_length, t.sequence_starts, t.reward,
        )))  # fmt: skip
    # The run's name reaches the cloning settings and the tool pool, not the clone.
    named = {"model": "", "run": None, "topic": "", "weights_topic": ""}
    tools = msgspec.structs.replace(resolved.tools, index_dir="", pool="")
    digest.update(msgspec.json.encode({
        "sft": msgspec.structs.replace(sft, **named), "warm_start": config.warm_start,
        "agent": resolved.evaluator.agent, "sampling": config.eval.config.sampling,
        "tools": tools, "threads": torch.get_num_threads(),
    }))  # fmt: skip
    for world in where.demonstration_worlds:
        for name in ("qa_test.jsonl", "corpus.jsonl"):
            digest.update((world / name).read_bytes())
    package = Path(str(asearcher.__file__)).parent
    for code in _CODE:
        code_digest(digest, package / code)
    digest.update(library_versions(*_LIBRARIES))
    return digest.hexdigest()[:24]


def kept_clone(key: str) -> tuple[KeptClone, dict[str, torch.Tensor], Path] | None:
    """The clone kept under `key`, its weights and where it is kept; None if none is."""
    import torch

    kept = clones_dir() / key
    if not (kept / _RECORD).is_file():
        return None
    record = msgspec.json.decode((kept / _RECORD).read_bytes(), type=KeptClone)
    return record, torch.load(kept / _WEIGHTS, weights_only=True), kept


def keep_clone(key: str, record: KeptClone, weights: dict[str, torch.Tensor]) -> bool:
    """Keep the clone `weights` under `key` for later runs, and drop the orders kept on the way
    to it; False if the cache is not writable."""
    kept = _keep(clones_dir() / key, record, weights, "the warm start's clone")
    if kept:
        for order in clones_dir().glob(f"{key}-order*"):
            shutil.rmtree(order, ignore_errors=True)
    return kept


def kept_order(key: str, seed: int) -> tuple[KeptClone, dict[str, torch.Tensor]] | None:
    """The cloning order with shuffle `seed` a warm start with inputs `key` kept (its best
    snapshot, with every snapshot's score in its notes); None if none is."""
    found = kept_clone(f"{key}-order{seed}")
    return None if found is None else found[:2]


def keep_order(key: str, record: KeptClone, weights: dict[str, torch.Tensor]) -> bool:
    """Keep a scored cloning order of the warm start with inputs `key` until its clone is
    chosen; False if the cache is not writable."""
    folder = clones_dir() / f"{key}-order{record.seed}"
    return _keep(folder, record, weights, f"cloning order {record.seed}")


def _keep(folder: Path, record: KeptClone, weights: dict[str, torch.Tensor], what: str) -> bool:
    import torch

    def write(partial: Path) -> None:
        partial.mkdir()
        torch.save(weights, partial / _WEIGHTS)
        (partial / _RECORD).write_bytes(msgspec.json.encode(record))

    return keep(folder, write, what)
