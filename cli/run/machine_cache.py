"""What a run makes once per machine and later runs copy: kept under a digest of its inputs.

The policy (`policy_cache`) and the warm start's clone (`clone_cache`) take minutes to make and
are functions of their inputs, so each is kept under `$ASEARCHER_CACHE` (or the user cache
directory) in a folder named by a digest of everything that makes it. A copy is written aside
and renamed into place: a run reading the cache never sees half of one, and of two runs making
the same one at once the second finds it there and drops its own.
"""

from __future__ import annotations

import ast
import hashlib
import shutil
import uuid
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from asearcher.streams.cluster.local_broker import cache_dir
from asearcher.streams.service.log import get_logger

log = get_logger(__name__)


def kept_dir(kind: str) -> Path:
    """Where this machine keeps what runs made of `kind` ("policies", "clones"), by key."""
    return cache_dir() / kind


def keep(kept: Path, write: Callable[[Path], object], what: str) -> bool:
    """`write` a new folder, then rename it to `kept`; False (with a warning naming `what`) when
    the cache cannot be written and no other run kept one meanwhile."""
    partial = kept.with_name(f".{kept.name}-{uuid.uuid4().hex[:8]}")
    try:
        partial.parent.mkdir(parents=True, exist_ok=True)
        write(partial)
        partial.rename(kept)
    except OSError as exc:  # kept by another run meanwhile, or a cache we cannot write
        shutil.rmtree(partial, ignore_errors=True)
        if not kept.is_dir():
            log.warning("%s was not kept for later runs in %s: %s", what, kept.parent, exc)
            return False
    return True


def library_versions(*libraries: str) -> bytes:
    """The installed versions of `libraries`: the same code can train otherwise under others."""
    # Written as the policy cache always wrote them: its keys, and the policies kept, stay valid.
    return "".join(f"{name}={metadata.version(name)}" for name in libraries).encode()


def files_digest(
    digest: hashlib._Hash,
    root: Path,
    pattern: str = "*",
    read: Callable[[Path], bytes] = Path.read_bytes,
) -> None:
    """Feed `digest` the relative path and `read` (the bytes, by default) of every file under
    `root` matching `pattern`, in sorted order."""
    for path in sorted(p for p in root.rglob(pattern) if p.is_file()):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(read(path))


def code_digest(digest: hashlib._Hash, root: Path) -> None:
    """Feed `digest` what the Python modules under `root` do: each one's relative path and
    syntax tree without its docstrings, so that an edit to prose (a docstring, a comment, the
    layout) keeps what was kept, while any edit to code makes anew."""
    files_digest(digest, root, "*.py", _syntax)


def _syntax(path: Path) -> bytes:
    tree = ast.parse(path.read_bytes())
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = node.body[0] if node.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            if isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree).encode()
