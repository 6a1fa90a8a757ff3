"""Files named by the SHA-256 of a key, in 256 shard directories, on any fsspec URL.

The layout is `<root>/<digest[:2]>/<digest><suffix>`: the claim check keys payloads by their own
bytes (content-addressed), the tool result store by call id, the page cache by URL. Two hex
digits of shard keep directories small on local disks and spread object-store prefixes.

Writes are atomic where the filesystem is local (written aside, then renamed or linked into
place), so a reader never sees half a file there; object stores make a PUT visible whole anyway.
Reads take only regular files (never a FIFO or a directory, never through a final symlink) and
can be capped, so a file cannot make a reader block or read without end.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem


class NotARegularFile(OSError):
    """A path of the store holds something other than a regular file (a directory, a FIFO)."""


class ShardedStore:
    """Bytes under `url`, each at the path the SHA-256 of its key gives."""

    def __init__(
        self, url: str, storage_options: dict[str, Any] | None = None, *, suffix: str = ""
    ) -> None:
        self.url = url.rstrip("/")
        self.suffix = suffix
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **(storage_options or {}))
        self.local = isinstance(self.fs, LocalFileSystem)

    @property
    def root_url(self) -> str:
        """The root as a normalised URL (protocol included), what `uri` results start with."""
        return self.fs.unstrip_protocol(self.root)

    @staticmethod
    def digest(key: str | bytes) -> str:
        """The SHA-256 hex digest of `key` (a str as UTF-8)."""
        return hashlib.sha256(key.encode() if isinstance(key, str) else key).hexdigest()

    def path(self, key: str | bytes) -> str:
        """Where the file for `key` lives, whether or not it exists."""
        return self.path_of_digest(self.digest(key))

    def path_of_digest(self, digest: str) -> str:
        """Where the file whose key has `digest` lives."""
        return f"{self.root}/{digest[:2]}/{digest}{self.suffix}"

    def uri(self, path: str) -> str:
        """`path` as a full URL, as a reader elsewhere would name it."""
        return self.fs.unstrip_protocol(path)

    def ensure_root(self) -> None:
        """Create the root now, so an unwritable store fails at start rather than at first use."""
        self.fs.makedirs(self.root, exist_ok=True)

    def exists(self, path: str) -> bool:
        """Whether something is stored at `path`."""
        return self.fs.exists(path)

    def read(self, path: str, max_bytes: int | None = None) -> bytes:
        """The bytes of the regular file at `path`, at most `max_bytes` of them.

        Raises FileNotFoundError when nothing is there and NotARegularFile for anything that is
        not a regular file; other OSErrors pass through.
        """
        if self.local:
            return _read_local(path, max_bytes)
        # Object stores hold only objects and directories; a directory is not a file.
        if self.fs.info(path).get("type") != "file":
            raise NotARegularFile(f"not a regular file: {path}")
        with self.fs.open(path, "rb") as src:
            return src.read() if max_bytes is None else src.read(max_bytes)

    def write(self, path: str, data: bytes, *, replace: bool = True) -> bool:
        """Store `data` at `path`; False (nothing written) if `replace` is off and a file is there.

        Where the filesystem is local the file appears whole or not at all, and without
        `replace` the first of racing writers wins for sure (a hard link never overwrites).
        Elsewhere "not there yet" is checked, then written: racing writers may each write.
        """
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        if self.local:
            return _write_local(path, data, replace)
        if not replace and self.fs.exists(path):
            return False
        with self.fs.open(path, "wb") as out:
            out.write(data)
        return True


def _read_local(path: str, max_bytes: int | None) -> bytes:
    """The regular file at `path`, never following a final symlink.

    Opening non-blocking means a FIFO cannot stall the open; the type is checked on the open
    descriptor, so the file cannot be swapped between the check and the read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARegularFile(f"not a regular file: {path}")
        with os.fdopen(fd, "rb", closefd=False) as src:
            return src.read() if max_bytes is None else src.read(max_bytes)
    finally:
        os.close(fd)


def _write_local(path: str, data: bytes, replace: bool) -> bool:
    directory, name = os.path.split(path)
    # Written aside in the same directory (same filesystem), so the final step is atomic. Not
    # mkstemp: its files are private (0600), while a store is shared (the umask decides).
    staging = os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        if replace:
            os.replace(staging, path)
            return True
        try:
            os.link(staging, path)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging)
