"""This machine's copies of the policies runs created: pretraining one takes minutes, once.

A policy is a function of its corpus, seed and shape and of the code that trains it, so a run
that needs one already made on this machine (another clone, another home) copies it instead of
pretraining it again. The key is a digest of all of those; a change to any of them makes a new
policy. Kept under the downloads' cache (`$ASEARCHER_CACHE` or the user cache directory).
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import msgspec

from asearcher.cli.run.machine_cache import keep, kept_dir, library_versions
from asearcher.producers.policy import model_init, pretrain, reading
from asearcher.producers.policy.model_init import PolicySpec

# Libraries whose versions can change what the same code trains.
_LIBRARIES = ("torch", "transformers", "tokenizers")


def policies_dir() -> Path:
    """Where this machine keeps the policies it made."""
    return kept_dir("policies")


def policy_key(corpus: Path, seed: int, spec: PolicySpec) -> str:
    """A digest of everything that makes the policy: the corpus's bytes, the seed, the shape
    and pretraining, the modules that build and train it, the versions of their libraries."""
    digest = hashlib.sha256()
    digest.update(corpus.read_bytes())
    digest.update(msgspec.json.encode({"seed": seed, "spec": spec}))
    for module in (model_init, pretrain, reading):
        digest.update(Path(str(module.__file__)).read_bytes())
    digest.update(library_versions(*_LIBRARIES))
    return digest.hexdigest()[:24]


def copy_or_create(directory: Path, key: str, create: Callable[[Path], object]) -> Path | None:
    """Fill `directory` with the policy kept under `key`, or with `create(directory)` and keep a
    copy of it; the kept copy's path when one was used, else None."""
    kept = policies_dir() / key
    if (kept / "config.json").is_file():
        shutil.copytree(kept, directory, dirs_exist_ok=True)
        return kept
    create(directory)
    keep(kept, lambda partial: shutil.copytree(directory, partial), "the policy")
    return None
