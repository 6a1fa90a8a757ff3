"""The package's layers import downwards only: streams ← consumers ← producers ← trainer ← cli."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
LAYERS = ["streams", "consumers", "producers", "trainer", "cli"]


def imported_layers(path: Path) -> set[str]:
    """The asearcher sub-packages a module imports, at any depth (lazy imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "asearcher" and len(parts) > 1 and parts[1] in LAYERS:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_never_imports_a_higher_one(layer: str) -> None:
    higher = set(LAYERS[LAYERS.index(layer) + 1 :])
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_layers(path) & higher)
        for path in sorted((ROOT / layer).rglob("*.py"))
        if imported_layers(path) & higher
    }
    assert not offenders, offenders


def test_the_check_sees_a_back_arrow(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from asearcher.trainer.policy.step import train_on_batch\n")
    assert imported_layers(module) == {"trainer"}


def test_the_trainer_imports_nothing_of_the_rollout_side() -> None:
    """Shared pieces (weight store readers, state-dict fitting) live in streams/ instead."""
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "trainer").rglob("*.py"))
        if "producers" in imported_layers(path)
    ]
    assert not offenders
