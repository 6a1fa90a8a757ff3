"""Collect `bench_*.py` as test modules; the broker fixtures come from tests/conftest.py."""

from __future__ import annotations

import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest

HERE = Path(__file__).parent
# Spawned children import their roles from these modules by plain name, whatever the import mode.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if not (file_path.suffix == ".py" and file_path.name.startswith("bench_")):
        return None
    # pytest collects these itself when named on the command line or matched by python_files.
    if parent.session.isinitpath(file_path) or any(
        fnmatch(file_path.name, pattern) for pattern in parent.config.getini("python_files")
    ):
        return None
    return pytest.Module.from_parent(parent, path=file_path)
