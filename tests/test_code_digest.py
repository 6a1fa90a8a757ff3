"""The clone's key reads the package's code by its syntax: prose edits keep a kept clone."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from asearcher.cli.run.machine_cache import code_digest

MODULE = '''"""A module."""

def step(x: int) -> int:
    """Double it."""
    return 2 * x  # the factor
'''


def _digest(root: Path) -> str:
    digest = hashlib.sha256()
    code_digest(digest, root)
    return digest.hexdigest()


def _with(tmp_path: Path, name: str, text: str) -> Path:
    root = tmp_path / name
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "mod.py").write_text(text)
    return root


@pytest.mark.parametrize(
    "edited",
    [
        MODULE.replace("Double it.", "Twice the input, as the trainer wants."),
        MODULE.replace('"""A module."""\n', ""),
        MODULE.replace("  # the factor", "  # why two: see the docs"),
        MODULE.replace("return 2 * x", "return (\n        2 * x\n    )"),
    ],
    ids=["docstring", "module docstring dropped", "comment", "layout"],
)
def test_prose_and_layout_edits_keep_the_digest(tmp_path: Path, edited: str) -> None:
    assert _digest(_with(tmp_path, "a", MODULE)) == _digest(_with(tmp_path, "b", edited))


@pytest.mark.parametrize(
    "edited",
    [
        MODULE.replace("2 * x", "3 * x"),
        MODULE.replace("def step", "def stride"),
        MODULE + "\nLIMIT = 4\n",
    ],
    ids=["expression", "name", "new statement"],
)
def test_code_edits_change_the_digest(tmp_path: Path, edited: str) -> None:
    assert _digest(_with(tmp_path, "a", MODULE)) != _digest(_with(tmp_path, "b", edited))


def test_a_moved_module_changes_the_digest(tmp_path: Path) -> None:
    root = _with(tmp_path, "a", MODULE)
    moved = tmp_path / "b"
    (moved / "other").mkdir(parents=True)
    (moved / "other" / "mod.py").write_text(MODULE)
    assert _digest(root) != _digest(moved)
