"""`asearcher deploy ...`: a run handed to a cluster as manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from asearcher.cli.errors import as_cli_error
from asearcher.cli.options import RunFile

app = typer.Typer(help="Hand a run to a cluster: the manifests that run it.", no_args_is_help=True)
console = Console()


@app.callback()
def deploy() -> None:
    """Hand a run to a cluster: the manifests that run it."""
    # A callback keeps `k8s` a sub-command even while it is the only one.


@app.command("k8s")
def k8s(
    out: Annotated[
        Path, typer.Option("--out", help="Directory to write the manifests and Dockerfile into.")
    ],
    config_file: RunFile = None,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            help="Weight store (s3://bucket/<run>/weights) instead of the run config's store; "
            "claim checks go beside it.",
            show_default="the run config's store",
        ),
    ] = None,
    image: Annotated[str, typer.Option("--image", help="The image every pod runs.")] = (
        "asearcher:latest"
    ),
    namespace: Annotated[
        str | None,
        typer.Option(help="Namespace of every object (written too); default: kubectl's."),
    ] = None,
) -> None:
    """Write Kubernetes manifests for a run: the Kafka cluster (Strimzi), the services, the
    trainer's ranks, KEDA scaling, and the image's Dockerfile.

    Everything comes from the run config as `stream up` derives it: the services and their
    counts, commands and configs, the topics, the principals and their ACLs. The stores must be
    shared (s3://): set `store` in the run config or pass --store. Apply the files with
    `kubectl apply --server-side -f OUT` once the Strimzi and KEDA operators run (see
    docs/kubernetes.md).
    """
    from asearcher.cli.deployment.manifests import deploy_k8s
    from asearcher.cli.run.config import load_run_config

    with as_cli_error(ValueError):
        config = load_run_config(config_file)
    with as_cli_error(ValueError, OSError, os_error=f"cannot write the manifests into {out}"):
        written = deploy_k8s(config, out, store, image, namespace)
    table = Table(title=f"Manifests of run {config.name!r} in {out}")
    for column in ("file", "kinds", "objects"):
        table.add_column(column, justify="right" if column == "objects" else "left")
    for manifest in written.files:
        kinds = ", ".join(f"{kind} x{count}" for kind, count in manifest.kinds().items())
        table.add_row(manifest.name, kinds, str(len(manifest.documents)))
    for name in written.other_files:
        table.add_row(name, "", "")
    console.print(table)
    for note in written.notes:
        console.print(f"- {note}", highlight=False)
