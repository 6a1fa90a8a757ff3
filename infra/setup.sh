#!/usr/bin/env bash
# Set up a fresh machine for asearcher, idempotently: a virtual environment in .venv with the
# package and its dev extras, and the Apache Kafka jars from Maven Central. Downloads are kept
# outside the checkout (wheels and Kafka jars under ~/.cache/asearcher), so a second run or a
# fresh clone on the same machine installs from there and fetches nothing again.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "asearcher needs Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2
  exit 2
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv

# Reinstall only when the dependency declaration changed.
stamp=.venv/.asearcher-installed
wanted=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  wheels="${ASEARCHER_CACHE:-$HOME/.cache/asearcher}/wheels"
  mkdir -p "$wheels"
  # Offline from the wheel cache first; fetch only when something is missing from it.
  if ! .venv/bin/python -m pip install --quiet --no-index --find-links "$wheels" -e ".[dev]" \
      2>/dev/null; then
    .venv/bin/python -m pip download --quiet --dest "$wheels" ".[dev]" "setuptools>=77"
    .venv/bin/python -m pip install --quiet --no-index --find-links "$wheels" -e ".[dev]"
  fi
  echo "$wanted" > "$stamp"
fi

.venv/bin/asearcher stream install
