"""Benchmarks share the broker fixtures of tests/conftest.py; run them with `-m benchmark`."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
# Spawned children import their roles from these modules by plain name, whatever the import mode.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
