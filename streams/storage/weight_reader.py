"""Versioned policy weights in object storage: the trainer publishes, inference engines load.

Inputs: a state dict (or raw files) per policy version, from the trainer.
Outputs: one directory per version, `<root>/v000042/`, holding `model.safetensors`, tokenizer files
and a `manifest.json` with the SHA-256 and size of every other file. Kafka events carry only the
version's URI and the manifest's SHA-256: a reader verifies everything it loads from that hash.

The manifest is written last and deleted first: a directory without one is a publish still in
progress (or one that crashed) and is invisible to readers. Works on any fsspec filesystem
(`file://`, `s3://` with s3fs, ...); torch and safetensors are imported only where tensors are.

Announcements on the `weights` topic are untrusted: `VersionChain` believes one only if it names
this store's own directory for the version, the manifest there has the announced hash, version,
parent and step, and the version follows the ones already believed. Two more files help:
- `announced`, written by the trainer once a version's announcement committed: the store's own
  record of what was announced, so a wiped or compacted topic never makes versions look orphaned;
- `manifest.sig`, an HMAC-SHA256 of the manifest under the key in $ASEARCHER_WEIGHTS_KEY (or the
  file $ASEARCHER_WEIGHTS_KEY_FILE names). With a key, versions are signed when published and a
  reader refuses an unsigned or wrongly signed one, so whoever can write the topic (or even the
  store) but lacks the key cannot make a reader load weights. Without a key, versions are
  unauthenticated: checksums catch corruption, not forgery.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import uuid
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import fsspec
import msgspec

if TYPE_CHECKING:
    import torch

ENV_WEIGHT_STORE = "ASEARCHER_WEIGHT_STORE"
ENV_WEIGHTS_KEY = "ASEARCHER_WEIGHTS_KEY"
ENV_WEIGHTS_KEY_FILE = "ASEARCHER_WEIGHTS_KEY_FILE"
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"  # hex HMAC-SHA256 of the manifest's bytes
ANNOUNCED = "announced"  # the manifest's SHA-256, written once the version was announced
# Names a version's own files may not take: they would pass for the store's bookkeeping.
_RESERVED = (MANIFEST, SIGNATURE, ANNOUNCED)
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
_VERSION_DIR = re.compile(r"v(\d+)")
_CHUNK = 8 * 1024 * 1024


class WeightStoreError(Exception):
    """A version is missing, a file does not match its checksum, or a manifest is unusable."""


class VersionNotFound(WeightStoreError):
    """No published version (no manifest) where one was expected."""


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
    # How a version not made by an RL step was made, e.g. {"kind": "sft", "topic": ...}.
    recipe: dict[str, Any] = {}


class PublishedVersion(msgspec.Struct, frozen=True):
    """A version as readers address it: where it is and the hash of its manifest."""

    version: int
    uri: str
    sha256: str
    manifest: WeightManifest


def resolve_store_url(url: str | None = None, home: str | Path | None = None) -> str:
    """The store URL: `url`, else $ASEARCHER_WEIGHT_STORE, else `file://` under the state dir."""
    from asearcher.streams.cluster.settings import state_dir

    return url or os.environ.get(ENV_WEIGHT_STORE) or (state_dir(home) / "weights").as_uri()


def signing_key() -> bytes | None:
    """The manifest-signing key from $ASEARCHER_WEIGHTS_KEY or the file named by
    $ASEARCHER_WEIGHTS_KEY_FILE; None when neither is set (versions are then unauthenticated)."""
    key = os.environ.get(ENV_WEIGHTS_KEY, "")
    path = os.environ.get(ENV_WEIGHTS_KEY_FILE, "")
    if key and path:
        raise WeightStoreError(f"set {ENV_WEIGHTS_KEY} or {ENV_WEIGHTS_KEY_FILE}, not both")
    if not path:
        return key.encode() if key else None
    try:
        # A key file usually ends with a newline that is not part of the key.
        secret = Path(path).read_bytes().strip()
    except OSError as exc:
        raise WeightStoreError(f"{ENV_WEIGHTS_KEY_FILE}: cannot read {path}: {exc}") from exc
    if not secret:
        raise WeightStoreError(f"{ENV_WEIGHTS_KEY_FILE}: {path} is empty")
    return secret


def sign_manifest(raw: bytes, key: bytes) -> bytes:
    """The signature file's content for the manifest bytes `raw`."""
    return hmac.new(key, raw, hashlib.sha256).hexdigest().encode()


class WeightStoreReader:
    """Lists, reads and verifies the policy versions under `root_url`; the trainer's
    `asearcher.trainer.runtime.weight_publisher.WeightStore` also writes them."""

    def __init__(self, root_url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.storage_options = dict(storage_options or {})
        self._fs, root = fsspec.core.url_to_fs(root_url.rstrip("/"), **self.storage_options)
        self._root = root.rstrip("/")
        self.root_url = self._fs.unstrip_protocol(self._root)
        self._key = signing_key()  # read once: every version this store writes or reads uses it

    @property
    def signed(self) -> bool:
        """Whether versions are signed on publish and their signatures checked on read."""
        return self._key is not None

    def uri_of(self, version: int) -> str:
        """The full URL of `version`'s directory."""
        return self._fs.unstrip_protocol(self._dir(version))

    def versions(self) -> list[int]:
        """Every published version (one with a manifest), ascending."""
        published, _, _ = self._scan()
        return sorted(published)

    def announced(self) -> list[int]:
        """Every published version marked as announced (see `mark_announced`), ascending."""
        published, _, marked = self._scan()
        return sorted(published & marked)

    def is_announced(self, version: int) -> bool:
        """Whether `version` is marked as announced."""
        self._fs.invalidate_cache(self._dir(version))  # the trainer marks from another process
        return self._fs.exists(f"{self._dir(version)}/{ANNOUNCED}")

    def manifest_missing(self, version: int) -> bool:
        """Whether the store holds no manifest of `version` (never published, or pruned)."""
        self._fs.invalidate_cache(self._dir(version))
        return not self._fs.exists(f"{self._dir(version)}/{MANIFEST}")

    def has_signature(self, version: int) -> bool:
        """Whether `version` has a signature file (checked by `get` only when a key is set)."""
        self._fs.invalidate_cache(self._dir(version))
        return self._fs.exists(f"{self._dir(version)}/{SIGNATURE}")

    def check_announcement(
        self, version: int, uri: str, sha256: str, step: int, model: str
    ) -> PublishedVersion:
        """The stored `version` an announcement names, if the announcement matches it exactly.

        Raises VersionNotFound when this store has no `version`, and WeightStoreError when the
        announcement points anywhere but this store's directory for it, or its manifest (or the
        manifest's signature) disagrees with the announcement.
        """
        if version < 1:
            raise WeightStoreError(f"announced version {version}: versions start at 1")
        expected = self.uri_of(version)
        if uri.rstrip("/") != expected:
            # repr and cut: the URI is whatever the record said, newlines included.
            raise WeightStoreError(f"v{version} announced at {uri[:200]!r}, not at {expected}")
        published = self.get(version)
        if published.sha256 != sha256:
            raise WeightStoreError(
                f"manifest of {expected} has sha256 {published.sha256[:12]}, "
                f"announced {sha256[:12]!r}"
            )
        manifest = published.manifest
        wrong = [
            f"{name} {found!r} (announced {wanted!r})"
            for name, found, wanted in (
                ("model", manifest.model, model),
                ("step", manifest.step, step),
                ("parent version", manifest.parent_version, version - 1),
            )
            if found != wanted
        ]
        if wrong:
            raise WeightStoreError(f"manifest of {expected} disagrees: {'; '.join(wrong)}")
        return published

    def latest(self) -> PublishedVersion | None:
        """The newest published version, or None when the store is empty."""
        published = self.versions()
        return self.get(published[-1]) if published else None

    def get(self, version: int) -> PublishedVersion:
        """The published `version`; WeightStoreError if it has no (valid, signed) manifest."""
        uri = self.uri_of(version)
        raw, manifest = fetch_manifest(self._fs, self._dir(version), uri, None, self._key)
        if manifest.version != version:
            raise WeightStoreError(f"manifest of {uri} claims version {manifest.version}")
        return PublishedVersion(
            version=version, uri=uri, sha256=hashlib.sha256(raw).hexdigest(), manifest=manifest
        )

    def read_file(self, version: int, name: str) -> bytes:
        """One file of `version`, verified against the manifest's SHA-256 and size."""
        published = self.get(version)
        return _read_verified(self._fs, self._dir(version), published.uri, published.manifest, name)

    def _dir(self, version: int) -> str:
        return f"{self._root}/v{version:06d}"

    def _existing(self, version: int) -> PublishedVersion | None:
        return None if self.manifest_missing(version) else self.get(version)

    def _scan(self) -> tuple[set[int], set[int], set[int]]:
        """(versions with a manifest, with a directory, with an announced mark), one listing."""
        # Other processes publish and prune: a cached listing would hide their versions.
        self._fs.invalidate_cache(self._root)
        try:
            paths = self._fs.find(self._root, withdirs=True, detail=False)
        except FileNotFoundError:
            return set(), set(), set()
        published: set[int] = set()
        directories: set[int] = set()
        marked: set[int] = set()
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
            elif parts[1:] == [ANNOUNCED]:
                marked.add(int(match.group(1)))
        return published, directories, marked


class VersionChain:
    """Which announced versions of one model to believe, in the order they are announced.

    The first one believed must be a version this store holds exactly as announced (see
    `WeightStore.check_announcement`); after that only the next version is, or a newer one the
    store itself marked as announced (a reader that missed versions rejoins the chain there).
    Older, skipped, foreign and mismatched versions are refused. A version pruned from the store
    since its announcement is passed over quietly: the announcements of newer ones follow.
    """

    def __init__(self, store: WeightStoreReader, model: str) -> None:
        self.store, self.model = store, model
        self.newest: PublishedVersion | None = None
        self._store_newest = -1  # the newest stored version when last listed

    def admit(self, version: int, uri: str, sha256: str, step: int) -> bool:
        """True if the announced version is now the newest believed; False if it is passed over
        (the same announcement again, or a version pruned since). Raises WeightStoreError with
        the reason when the announcement is refused."""
        newest = self.newest
        if newest is not None and version <= newest.version:
            if version == newest.version and sha256 == newest.sha256:
                return False
            raise WeightStoreError(f"v{version} is not newer than v{newest.version}, believed")
        if newest is not None and version != newest.version + 1:
            if not self.store.is_announced(version):
                if self._pruned(version) and self.store.manifest_missing(version):
                    # A reader that restarts reads the topic from the start, past versions the
                    # store kept (the first) and versions it pruned since: passed over, not
                    # refused, or each restart dead-letters every pruned version again.
                    return False
                raise WeightStoreError(
                    f"v{version} does not follow v{newest.version} and the store has no record "
                    f"of announcing it"
                )
        try:
            self.newest = self.store.check_announcement(version, uri, sha256, step, self.model)
        except VersionNotFound:
            if self._pruned(version):
                return False
            raise
        return True

    def _pruned(self, version: int) -> bool:
        """Whether `version` is missing because newer versions replaced it in the store."""
        if version >= self._store_newest:
            # Listed again only when needed: a reader catching up meets many pruned versions.
            self._store_newest = max(self.store.versions(), default=-1)
        return version < self._store_newest


def read_manifest(
    uri: str, sha256: str | None = None, storage_options: dict[str, Any] | None = None
) -> WeightManifest:
    """The manifest of the version directory `uri`, verified against `sha256` when given."""
    fs, path = fsspec.core.url_to_fs(uri.rstrip("/"), **(storage_options or {}))
    return fetch_manifest(fs, path.rstrip("/"), uri, sha256, signing_key())[1]


def load_state_dict(
    uri: str, sha256: str, storage_options: dict[str, Any] | None = None
) -> tuple[WeightManifest, dict[str, torch.Tensor]]:
    """The verified manifest and tensors (on CPU) of the version directory `uri`.

    With a signing key in the environment, an unsigned or wrongly signed version is refused.
    """
    from safetensors.torch import load

    fs, path = fsspec.core.url_to_fs(uri.rstrip("/"), **(storage_options or {}))
    _, manifest = fetch_manifest(fs, path.rstrip("/"), uri, sha256, signing_key())
    return manifest, load(_read_verified(fs, path.rstrip("/"), uri, manifest, MODEL_FILE))


def download_version(
    uri: str, sha256: str, dest: str | Path, storage_options: dict[str, Any] | None = None
) -> WeightManifest:
    """Copy every verified file of `uri` into the local directory `dest` (for vLLM & co).

    Also writes `config.json` from the manifest when it has one, and the manifest itself.
    A file is renamed into place only once verified, so `dest` never holds a corrupt file. With a
    signing key in the environment, an unsigned or wrongly signed version is refused.
    """
    fs, path = fsspec.core.url_to_fs(uri.rstrip("/"), **(storage_options or {}))
    path = path.rstrip("/")
    raw, manifest = fetch_manifest(fs, path, uri, sha256, signing_key())
    target = Path(dest)
    for name in manifest.files:
        _download_verified(fs, path, uri, manifest, name, target / name)
    if manifest.config and CONFIG_FILE not in manifest.files:
        _write_local(
            target / CONFIG_FILE, msgspec.json.format(msgspec.json.encode(manifest.config))
        )
    _write_local(target / MANIFEST, raw)
    return manifest


def fetch_manifest(
    fs: fsspec.AbstractFileSystem, directory: str, uri: str, sha256: str | None, key: bytes | None
) -> tuple[bytes, WeightManifest]:
    try:
        raw = fs.cat_file(f"{directory}/{MANIFEST}")
    except FileNotFoundError as exc:
        raise VersionNotFound(f"no published version at {uri} (no {MANIFEST})") from exc
    if sha256 is not None and hashlib.sha256(raw).hexdigest() != sha256:
        raise WeightStoreError(f"{MANIFEST} of {uri} does not match sha256 {sha256}")
    if key is not None:
        _check_signature(fs, directory, uri, raw, key)
    try:
        manifest = msgspec.json.decode(raw, type=WeightManifest)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise WeightStoreError(f"bad {MANIFEST} at {uri}: {exc}") from exc
    _check_manifest(manifest, uri)
    return raw, manifest


def _check_signature(
    fs: fsspec.AbstractFileSystem, directory: str, uri: str, raw: bytes, key: bytes
) -> None:
    try:
        signature = fs.cat_file(f"{directory}/{SIGNATURE}").strip()
    except FileNotFoundError as exc:
        raise WeightStoreError(f"{uri} is not signed (no {SIGNATURE}) but a key is set") from exc
    # Constant time: a timing difference would tell a forger how much of a guess was right.
    if not hmac.compare_digest(signature, sign_manifest(raw, key)):
        raise WeightStoreError(f"the signature of {uri} does not match its manifest and key")


def _check_manifest(manifest: WeightManifest, uri: str) -> None:
    if set(manifest.files) != set(manifest.sizes):
        raise WeightStoreError(f"bad {MANIFEST} at {uri}: files and sizes list different names")
    if not set(manifest.tokenizer_files) <= set(manifest.files):
        raise WeightStoreError(f"bad {MANIFEST} at {uri}: tokenizer files not among the files")
    for name in manifest.files:
        try:
            check_file_name(name)
        except WeightStoreError as exc:
            # A name like ../../x would make download_version write outside its directory.
            raise WeightStoreError(f"bad {MANIFEST} at {uri}: {exc}") from exc


def check_file_name(name: str) -> None:
    parts = PurePosixPath(name).parts
    if (
        not name
        or name.startswith("/")
        or "\\" in name
        or any(p in ("..", ".") for p in parts)
        or name != "/".join(parts)
        or name in _RESERVED
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
