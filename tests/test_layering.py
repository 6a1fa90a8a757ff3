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


def _cli_imports(path: Path) -> set[str]:
    """The cli modules (by dotted name below `cli`) and top-level libraries `path` imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "asearcher.cli":
                found |= {alias.name for alias in node.names}
            elif node.module.startswith("asearcher.cli."):
                found.add(node.module.removeprefix("asearcher.cli."))
            else:
                found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
    return found


def _command_modules() -> set[str]:
    """The modules `asearcher` mounts as command groups or commands (what cli/app.py imports)."""
    app = ast.parse((ROOT / "cli" / "app.py").read_text())
    return {
        alias.name
        for node in ast.walk(app)
        if isinstance(node, ast.ImportFrom) and node.module == "asearcher.cli"
        for alias in node.names
    }


def test_no_command_module_imports_another() -> None:
    commands = _command_modules()
    assert {"stream", "eval", "learn"} <= commands
    offenders = {
        name: sorted((_cli_imports(ROOT / "cli" / f"{name}.py") & commands) - {name})
        for name in sorted(commands)
    }
    assert not {k: v for k, v in offenders.items() if v}, offenders


@pytest.mark.parametrize("folder", ["run", "jobs", "deployment"])
def test_runs_and_jobs_import_no_typer_and_no_command(folder: str) -> None:
    commands = _command_modules()
    offenders = {
        str(path.relative_to(ROOT)): sorted(_cli_imports(path) & (commands | {"typer"}))
        for path in sorted((ROOT / "cli" / folder).glob("*.py"))
    }
    assert not {k: v for k, v in offenders.items() if v}, offenders


def test_the_command_line_starts_without_loading_the_heavy_libraries() -> None:
    """Every `asearcher` call (each service, `--help`, every test that runs the CLI) pays for
    what importing the CLI loads; torch alone took 1.6 of its 2.4 s. Commands load them when
    they run."""
    import subprocess
    import sys

    heavy = ("torch", "transformers", "deepspeed", "vllm")
    probe = f"import sys, asearcher.cli.app; print([m for m in {heavy!r} if m in sys.modules])"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"
