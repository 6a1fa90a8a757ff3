"""Versioned policy weights in object storage: the trainer publishes, inference engines load.

Inputs: a state dict (or raw files) per policy version, from the trainer.
Outputs: one directory per version, `<root>/v000042/`, holding `model.safetensors`, tokenizer files
and a `manifest.json` with the SHA-256 and size of every other file. Kafka events carry only the
version's URI and the manifest's SHA-256: a reader verifies everything it loads from that hash.

The manifest is written last and deleted first: a directory without one is a publish still in
progress (or one that crashed) and is invisible to readers. Works on any fsspec filesystem
(`file://`, `s3://` with s3fs, ...); torch and safetensors are imported only where tensors are.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import fsspec
import msgspec
from fsspec.implementations.local import LocalFileSystem

if TYPE_CHECKING:
    import torch

ENV_WEIGHT_STORE = "ASEARCHER_WEIGHT_STORE"
MANIFEST = "manifest.json"
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
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
_VERSION_DIR = re.compile(r"v(\d+)")
_CHUNK = 8 * 1024 * 1024


class WeightStoreError(Exception):
    """A version is missing, a file does not match its checksum, or a manifest is unusable."""


class WeightManifest(msgspec.Struct, kw_only=True):
    """What one published version holds; its own SHA-256 is the version's identity."""

    version: int
    step: int
    parent_version: int | None
    model: str = "policy"
    created_at: float
    files: dict[str, str]
    sizes: dict[str, int]
    config: dict[str, Any]
    tokenizer_files: list[str] = []
    trained_ids: list[str] = []


class PublishedVersion(msgspec.Struct, frozen=True):
    """A version as readers address it: where it is and the hash of its manifest."""

    version: int
    uri: str
    sha256: str
    manifest: WeightManifest


def resolve_store_url(url: str | None = None, home: str | Path | None = None) -> str:
    """The store URL: `url`, else $ASEARCHER_WEIGHT_STORE, else `file://` under the state dir."""
    from asearcher.streams.settings import state_dir

    return url or os.environ.get(ENV_WEIGHT_STORE) or (state_dir(home) / "weights").as_uri()


class WeightStore:
    """Publishes, lists, reads and prunes policy versions under `root_url`."""

    def __init__(self, root_url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.storage_options = dict(storage_options or {})
        self._fs, root = fsspec.core.url_to_fs(root_url.rstrip("/"), **self.storage_options)
        self._root = root.rstrip("/")
        self.root_url = self._fs.unstrip_protocol(self._root)

    def uri_of(self, version: int) -> str:
        """The full URL of `version`'s directory."""
        return self._fs.unstrip_protocol(self._dir(version))

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
    ) -> PublishedVersion:
        """Write `files` as `version`, then its manifest; an identical retry returns the original.

        Raises WeightStoreError if the version already exists with different files.
        """
        if version < 0:
            raise WeightStoreError(f"version must be >= 0, not {version}")
        for name in files:
            _check_name(name)
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
        )
        raw = msgspec.json.encode(manifest, order="deterministic")
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
        )

    def versions(self) -> list[int]:
        """Every published version (one with a manifest), ascending."""
        published, _ = self._scan()
        return sorted(published)

    def latest(self) -> PublishedVersion | None:
        """The newest published version, or None when the store is empty."""
        published = self.versions()
        return self.get(published[-1]) if published else None

    def get(self, version: int) -> PublishedVersion:
        """The published `version`; WeightStoreError if it has no (valid) manifest."""
        uri = self.uri_of(version)
        raw, manifest = _fetch_manifest(self._fs, self._dir(version), uri, None)
        if manifest.version != version:
            raise WeightStoreError(f"manifest of {uri} claims version {manifest.version}")
        return PublishedVersion(
            version=version, uri=uri, sha256=hashlib.sha256(raw).hexdigest(), manifest=manifest
        )

    def read_file(self, version: int, name: str) -> bytes:
        """One file of `version`, verified against the manifest's SHA-256 and size."""
        published = self.get(version)
        return _read_verified(self._fs, self._dir(version), published.uri, published.manifest, name)

    def prune(self, keep_last: int, keep_every: int = 0, dry_run: bool = False) -> list[int]:
        """Delete old versions, keeping the newest `keep_last` and multiples of `keep_every`.

        Also deletes manifest-less directories older than the latest version (crashed publishes);
        newer ones may be publishes in progress and stay. Returns the removed versions, ascending.
        """
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, not {keep_last}")
        published, directories = self._scan()
        ordered = sorted(published)
        keep = set(ordered[-keep_last:])
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
        published, directories = self._scan()
        for version in versions:
            directory = self._dir(version)
            if version in published:
                # Manifest first: a reader never sees a version whose files are half gone.
                self._fs.rm_file(f"{directory}/{MANIFEST}")
            if version in directories:
                self._fs.rm(directory, recursive=True)
        self._fs.invalidate_cache(self._root)

    def _dir(self, version: int) -> str:
        return f"{self._root}/v{version:06d}"

    def _existing(self, version: int) -> PublishedVersion | None:
        self._fs.invalidate_cache(self._dir(version))
        if not self._fs.exists(f"{self._dir(version)}/{MANIFEST}"):
            return None
        return self.get(version)

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

    def _scan(self) -> tuple[set[int], set[int]]:
        """(versions with a manifest, versions with a directory), from a single listing."""
        # Other processes publish and prune: a cached listing would hide their versions.
        self._fs.invalidate_cache(self._root)
        try:
            paths = self._fs.find(self._root, withdirs=True, detail=False)
        except FileNotFoundError:
            return set(), set()
        published: set[int] = set()
        directories: set[int] = set()
        prefix = self._root + "/"
        for path in paths:
            if not path.startswith(prefix):
                continue  # the root itself
            parts = path.removeprefix(prefix).split("/")
            match = _VERSION_DIR.fullmatch(parts[0])
            if match is None:
                continue
            directories.add(int(match.group(1)))
            if parts[1:] == [MANIFEST]:
                published.add(int(match.group(1)))
        return published, directories


def read_manifest(
    uri: str, sha256: str | None = None, storage_options: dict[str, Any] | None = None
) -> WeightManifest:
    """The manifest of the version directory `uri`, verified against `sha256` when given."""
    fs, path = fsspec.core.url_to_fs(uri.rstrip("/"), **(storage_options or {}))
    return _fetch_manifest(fs, path.rstrip("/"), uri, sha256)[1]


def load_state_dict(
    uri: str, sha256: str, storage_options: dict[str, Any] | None = None
) -> tuple[WeightManifest, dict[str, torch.Tensor]]:
    """The verified manifest and tensors (on CPU) of the version directory `uri`."""
    from safetensors.torch import load

    fs, path = fsspec.core.url_to_fs(uri.rstrip("/"), **(storage_options or {}))
    _, manifest = _fetch_manifest(fs, path.rstrip("/"), uri, sha256)
    return manifest, load(_read_verified(fs, path.rstrip("/"), uri, manifest, MODEL_FILE))


def download_version(
    uri: str, sha256: str, dest: str | Path, storage_options: dict[str, Any] | None = None
) -> WeightManifest:
    """Copy every verified file of `uri` into the local directory `dest` (for vLLM & co).

    Also writes `config.json` from the manifest when it has one, and the manifest itself.
    A file is renamed into place only once verified, so `dest` never holds a corrupt file.
    """
    fs, path = fsspec.core.url_to_fs(uri.rstrip("/"), **(storage_options or {}))
    path = path.rstrip("/")
    raw, manifest = _fetch_manifest(fs, path, uri, sha256)
    target = Path(dest)
    for name in manifest.files:
        _download_verified(fs, path, uri, manifest, name, target / name)
    if manifest.config and CONFIG_FILE not in manifest.files:
        _write_local(
            target / CONFIG_FILE, msgspec.json.format(msgspec.json.encode(manifest.config))
        )
    _write_local(target / MANIFEST, raw)
    return manifest


def _fetch_manifest(
    fs: fsspec.AbstractFileSystem, directory: str, uri: str, sha256: str | None
) -> tuple[bytes, WeightManifest]:
    try:
        raw = fs.cat_file(f"{directory}/{MANIFEST}")
    except FileNotFoundError as exc:
        raise WeightStoreError(f"no published version at {uri} (no {MANIFEST})") from exc
    if sha256 is not None and hashlib.sha256(raw).hexdigest() != sha256:
        raise WeightStoreError(f"{MANIFEST} of {uri} does not match sha256 {sha256}")
    try:
        manifest = msgspec.json.decode(raw, type=WeightManifest)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise WeightStoreError(f"bad {MANIFEST} at {uri}: {exc}") from exc
    _check_manifest(manifest, uri)
    return raw, manifest


def _check_manifest(manifest: WeightManifest, uri: str) -> None:
    if set(manifest.files) != set(manifest.sizes):
        raise WeightStoreError(f"bad {MANIFEST} at {uri}: files and sizes list different names")
    if not set(manifest.tokenizer_files) <= set(manifest.files):
        raise WeightStoreError(f"bad {MANIFEST} at {uri}: tokenizer files not among the files")
    for name in manifest.files:
        try:
            _check_name(name)
        except WeightStoreError as exc:
            # A name like ../../x would make download_version write outside its directory.
            raise WeightStoreError(f"bad {MANIFEST} at {uri}: {exc}") from exc


def _check_name(name: str) -> None:
    parts = PurePosixPath(name).parts
    if (
        not name
        or name.startswith("/")
        or "\\" in name
        or any(p in ("..", ".") for p in parts)
        or name != "/".join(parts)
        or name == MANIFEST
    ):
        raise WeightStoreError(f"not a usable file name in a version: {name!r}")


def _read_verified(
    fs: fsspec.AbstractFileSystem, directory: str, uri: str, manifest: WeightManifest, name: str
) -> bytes:
    if name not in manifest.files:
        raise WeightStoreError(f"{name} is not a file of {uri}")
    try:
        data = fs.cat_file(f"{directory}/{name}")
    except FileNotFoundError as exc:
        raise WeightStoreError(f"{name} of {uri} is missing") from exc
    _verify(name, uri, manifest, len(data), hashlib.sha256(data).hexdigest())
    return data


def _download_verified(
    fs: fsspec.AbstractFileSystem,
    directory: str,
    uri: str,
    manifest: WeightManifest,
    name: str,
    target: Path,
) -> None:
    # Streamed in chunks: a model file can be larger than the memory we want to spend on it.
    if name not in manifest.files:
        raise WeightStoreError(f"{name} is not a file of {uri}")
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    digest, size = hashlib.sha256(), 0
    try:
        with fs.open(f"{directory}/{name}", "rb") as src, open(temporary, "wb") as out:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
        _verify(name, uri, manifest, size, digest.hexdigest())
        os.replace(temporary, target)
    except FileNotFoundError as exc:
        raise WeightStoreError(f"{name} of {uri} is missing") from exc
    finally:
        temporary.unlink(missing_ok=True)


def _verify(name: str, uri: str, manifest: WeightManifest, size: int, sha256: str) -> None:
    if size != manifest.sizes[name] or sha256 != manifest.files[name]:
        raise WeightStoreError(
            f"{name} of {uri} does not match its manifest "
            f"(size {size} vs {manifest.sizes[name]}, sha256 {sha256[:12]} vs "
            f"{manifest.files[name][:12]})"
        )


def _write_local(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


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
