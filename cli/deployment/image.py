"""The image every pod runs: the package with its GPU and S3 extras on a CUDA base.

Built from the repository's root (`docker build -f <out>/Dockerfile <repository>`); BuildKit
reads `<out>/Dockerfile.dockerignore` beside it, so the local virtualenv and build outputs stay
out of the build context.
"""

from __future__ import annotations

# The CUDA toolkit (a devel image): DeepSpeed compiles its ops against it on first use.
BASE_IMAGE = "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"
GPU_EXTRA = "vllm"  # pyproject.toml's optional dependencies: the vLLM engine
STORE_EXTRA = "s3"  # s3fs: the weight and claim-check stores
VENV = "/opt/asearcher"
IGNORED = (".git", ".venv", "build", "*.egg-info", "**/__pycache__", "tests")


def dockerfile(base: str = BASE_IMAGE) -> str:
    """The Dockerfile's text."""
    extras = f"{GPU_EXTRA},{STORE_EXTRA}"
    return f"""\
# The asearcher image for `asearcher deploy k8s`: build it from the repository's root,
#   docker build -f <this directory>/Dockerfile -t asearcher:latest <repository>
FROM {base}

RUN apt-get update \\
    && apt-get install -y --no-install-recommends \\
        python3 python3-venv python3-dev build-essential \\
    && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV={VENV} PATH={VENV}/bin:$PATH PYTHONUNBUFFERED=1
RUN python3 -m venv {VENV}

# The repository's root is the package `asearcher` (pyproject.toml maps it).
COPY . /src/asearcher
RUN pip install --no-cache-dir "/src/asearcher[{extras}]"

WORKDIR /var/lib/asearcher
CMD ["asearcher", "--help"]
"""


def dockerignore() -> str:
    """What stays out of the build context."""
    return "".join(f"{pattern}\n" for pattern in IGNORED)
