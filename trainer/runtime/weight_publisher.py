"""The trainer's side of the versioned weight store: publishing, marking, signing, pruning.

Readers (rollout engines, the CLI) see the store through `WeightStoreReader` in
`asearcher.streams.storage.weight_reader`, which holds the layout and the verification rules; only
the trainer (and `asearcher weights` for a person's pruning and signing) writes.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from fsspec.implementations.local import LocalFileSystem

from asearcher.streams.storage.weight_reader import (
    ANNOUNCED,
    ENV_WEIGHTS_KEY,
    ENV_WEIGHTS_KEY_FILE,
    MANIFEST,
    MODEL_FILE,
    SIGNATURE,
    PublishedVersion,
    WeightManifest,
    WeightStoreError,
    WeightStoreReader,
    check_file_name,
    fetch_manifest,
    sign_manifest,
)

if TYPE_CHECKING:
    import torch

# What an HF tokenizer directory may hold; only the ones present are copied.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)


class WeightStore(WeightStoreReader):
    """Publishes, lists, reads and prunes policy versions under `root_url`."""

    def publish(
        self,
        version: int,
        step: int,
        parent_version: int | None,
        files: dict[str, bytes],
        config: dict[str, Any] | None = None,
        tokenizer_files: Sequence[str] = (),
        trained_ids: Sequence[str] = (),
        model: str = "policy",
        recipe: dict[str, Any] | None = None,
    ) -> PublishedVersion:
        """Write `files` as `version`, then its manifest; an identical retry returns the original.

        Raises WeightStoreError if the version already exists with different files.
        """
        if version < 0:
            raise WeightStoreError(f"version must be >= 0, not {version}")
        for name in files:
            check_file_name(name)
        missing = set(tokenizer_files) - set(files)
        if missing:
            raise WeightStoreError(f"tokenizer files not among the files: {sorted(missing)}")
        hashes = {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())}
        existing = self._existing(version)
        if existing is not None:
            if existing.manifest.files == hashes:
                return existing  # a retry after a lost acknowledgement: nothing to do
            raise WeightStoreError(
                f"version {version} already exists at {existing.uri} with different files"
            )
        directory = self._dir(version)
        for name, data in files.items():
            path = f"{directory}/{name}"
            self._fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            self._fs.pipe_file(path, data)
        manifest = WeightManifest(
            version=version,
            step=step,
            parent_version=parent_version,
            model=model,
            created_at=time.time(),
            files=hashes,
            sizes={name: len(files[name]) for name in hashes},
            config=dict(config or {}),
            tokenizer_files=sorted(tokenizer_files),
            trained_ids=list(trained_ids),
            recipe=dict(recipe or {}),
        )
        raw = msgspec.json.encode(manifest, order="deterministic")
        if self._key is not None:
            # Before the manifest: a version is visible only once its signature is in place.
            self._fs.pipe_file(f"{directory}/{SIGNATURE}", sign_manifest(raw, self._key))
        self._write_manifest(directory, raw)
        return PublishedVersion(
            version=version,
            uri=self.uri_of(version),
            sha256=hashlib.sha256(raw).hexdigest(),
            manifest=manifest,
        )

    def publish_state_dict(
        self,
        version: int,
        step: int,
        parent_version: int | None,
        state_dict: Mapping[str, torch.Tensor],
        config: dict[str, Any] | None = None,
        tokenizer_dir: str | Path | None = None,
        trained_ids: Sequence[str] = (),
        model: str = "policy",
        recipe: dict[str, Any] | None = None,
    ) -> PublishedVersion:
        """Publish `state_dict` as `model.safetensors` plus the tokenizer files of `tokenizer_dir`.

        Tensors are saved contiguous and on CPU; tied weights are stored as separate copies.
        """
        from safetensors.torch import save

        files = {MODEL_FILE: save(_saveable(state_dict))}
        tokenizer = _tokenizer_files(Path(tokenizer_dir)) if tokenizer_dir is not None else {}
        files.update(tokenizer)
        return self.publish(
            version,
            step,
            parent_version,
            files,
            config=config,
            tokenizer_files=sorted(tokenizer),
            trained_ids=trained_ids,
            model=model,
            recipe=recipe,
        )

    def mark_announced(self, version: int) -> None:
        """Record that `version`'s announcement committed; only the trainer should call this.

        The mark holds the manifest's SHA-256, so a person can tell which manifest it was for.
        Bookkeeping, not loading: the signature is not checked here.
        """
        raw, _ = fetch_manifest(self._fs, self._dir(version), self.uri_of(version), None, None)
        sha256 = hashlib.sha256(raw).hexdigest().encode()
        self._fs.pipe_file(f"{self._dir(version)}/{ANNOUNCED}", sha256)
        self._fs.invalidate_cache(self._dir(version))

    def sign(self, version: int) -> None:
        """Sign `version`'s manifest as it stands with the configured key (for a store whose
        versions predate the key): whoever runs this vouches for them."""
        if self._key is None:
            raise WeightStoreError(
                f"no key to sign with: set {ENV_WEIGHTS_KEY} or {ENV_WEIGHTS_KEY_FILE}"
            )
        raw, _ = fetch_manifest(self._fs, self._dir(version), self.uri_of(version), None, None)
        self._fs.pipe_file(f"{self._dir(version)}/{SIGNATURE}", sign_manifest(raw, self._key))
        self._fs.invalidate_cache(self._dir(version))

    def prune(self, keep_last: int, keep_every: int = 0, dry_run: bool = False) -> list[int]:
        """Delete old versions, keeping the newest `keep_last`, multiples of `keep_every` and
        the oldest (the one the run's training started from: re-training from the log starts
        there). Also deletes manifest-less directories older than the latest version (crashed
        publishes); newer ones may be publishes in progress and stay. Returns the removed
        versions, ascending.
        """
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, not {keep_last}")
        published, directories, _ = self._scan()
        ordered = sorted(published)
        keep = set(ordered[-keep_last:]) | set(ordered[:1])
        if keep_every > 0:
            keep |= {v for v in ordered if v % keep_every == 0}
        latest = ordered[-1] if ordered else -1
        debris = {v for v in directories - published if v < latest}
        doomed = sorted((published - keep) | debris)
        if dry_run:
            return doomed
        self.remove(doomed)
        return doomed

    def remove(self, versions: Sequence[int]) -> None:
        """Delete these versions (those that exist), manifest first."""
        published, directories, _ = self._scan()
        for version in versions:
            directory = self._dir(version)
            if version in published:
                # Manifest first: a reader never sees a version whose files are half gone.
                self._fs.rm_file(f"{directory}/{MANIFEST}")
            if version in directories:
                self._fs.rm(directory, recursive=True)
        self._fs.invalidate_cache(self._root)

    def _write_manifest(self, directory: str, raw: bytes) -> None:
        path = f"{directory}/{MANIFEST}"
        if isinstance(self._fs, LocalFileSystem):
            # A local write is not atomic: a crash could leave a truncated, visible manifest.
            temporary = f"{path}.{uuid.uuid4().hex}.tmp"
            self._fs.pipe_file(temporary, raw)
            os.replace(temporary, path)
        else:
            self._fs.pipe_file(path, raw)  # an object-store PUT is atomic
        self._fs.invalidate_cache(directory)


def _saveable(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, no two sharing storage (safetensors refuses shared storage)."""
    seen: set[tuple[str, int]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach().to("cpu").contiguous()
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        if key in seen and storage.nbytes() > 0:
            # A tied weight (embeddings = lm_head) or a view of another tensor: store a copy.
            tensor = tensor.clone()
        else:
            seen.add(key)
        out[name] = tensor
    return out


def _tokenizer_files(tokenizer_dir: Path) -> dict[str, bytes]:
    if not tokenizer_dir.is_dir():
        raise WeightStoreError(f"tokenizer directory {tokenizer_dir} does not exist")
    found = {
        name: (tokenizer_dir / name).read_bytes()
        for name in TOKENIZER_FILES
        if (tokenizer_dir / name).is_file()
    }
    if not found:
        raise WeightStoreError(
            f"no tokenizer files in {tokenizer_dir}: {', '.join(TOKENIZER_FILES)}"
        )
    return found
