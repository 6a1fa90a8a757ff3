"""The kinds of service a run is made of, and the command that serves each.

One table: `stream up` builds its supervised programs from it, and the jobs that start services
of their own for their duration (`eval run --engine`, `synth run`) build those commands from it.
"""

from __future__ import annotations

import sys
from typing import NamedTuple


class ServiceKind(NamedTuple):
    """A kind of service: the `asearcher` command that serves it, and what it is."""

    command: tuple[str, ...]
    description: str


SERVICE_KINDS: dict[str, ServiceKind] = {
    "tools": ServiceKind(("tools", "serve"), "tool worker (search, browse)"),
    "rollout": ServiceKind(("rollout", "serve"), "rollout producer"),
    "trainer": ServiceKind(("train", "serve"), "trainer (DeepSpeed)"),
    "feeder": ServiceKind(("feed", "serve"), "request feeder"),
    "evaluator": ServiceKind(("eval", "serve"), "evaluator"),
    "eval-processor": ServiceKind(("eval", "process"), "evaluation processor (faust)"),
    "synth": ServiceKind(("synth", "process"), "synthesis processor"),
    "metrics": ServiceKind(("metrics", "serve"), "metrics processor (TensorBoard)"),
}
# How the CLI runs as a module: what a launcher (DeepSpeed's) is given instead of a script.
CLI_MODULE = "asearcher.cli.app"


def serve_command(kind: str, *args: str, log_level: str = "INFO") -> list[str]:
    """The command line that runs one service of `kind` with `args`, in this interpreter."""
    return [sys.executable, "-m", CLI_MODULE, "--log-level", log_level,
            *SERVICE_KINDS[kind].command, *args]  # fmt: skip
