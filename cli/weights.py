"""`asearcher weights ...`: the versioned policy-weight store (list, show, prune, sign).

With $ASEARCHER_WEIGHTS_KEY (or $ASEARCHER_WEIGHTS_KEY_FILE) set, the trainer signs every
version's manifest and readers refuse versions not signed with that key; `sign` vouches for
versions published before the key was set. Without a key, versions are unauthenticated.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from asearcher.cli.errors import CliError
from asearcher.cli.options import Home, StoreUrl
from asearcher.cli.wiring import as_cli_error

if TYPE_CHECKING:
    from asearcher.trainer.runtime.weight_publisher import WeightStore

app = typer.Typer(help="Inspect and prune the versioned policy weights the trainer publishes.")
console = Console()


def _store(url: str | None, home: str | None) -> WeightStore:
    from asearcher.streams.storage.weight_reader import WeightStoreError, resolve_store_url
    from asearcher.trainer.runtime.weight_publisher import WeightStore

    with as_cli_error(WeightStoreError):  # an unreadable key file, named
        return WeightStore(resolve_store_url(url, home))


def _size(n: int) -> str:
    if n < 1024:
        return f"{n:,} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:,.1f} {unit}"


def _time(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@app.command("list")
def list_versions(store: StoreUrl = None, home: Home = None) -> None:
    """List every published version: step, parent, files, total size and when it was published."""
    from asearcher.streams.storage.weight_reader import WeightStoreError

    weights = _store(store, home)
    versions = weights.versions()
    if not versions:
        console.print(f"no published versions in {weights.root_url}", highlight=False)
        return
    table = Table(title=f"Policy weights in {weights.root_url}")
    columns = ("version", "step", "parent", "files", "total size", "created", "announced", "signed")
    for column in columns:
        table.add_column(column, justify="left" if column == "created" else "right")
    announced = set(weights.announced())
    for version in versions:
        try:
            manifest = weights.get(version).manifest
        except WeightStoreError:
            # One unreadable (or, with a key, unsigned) manifest should not hide the rest.
            signed = "bad" if weights.has_signature(version) else "no"
            cells = ["[red]refused[/red]", *[""] * (len(columns) - 3), signed]
            table.add_row(str(version), *cells)
            continue
        parent = "-" if manifest.parent_version is None else str(manifest.parent_version)
        table.add_row(
            str(version),
            str(manifest.step),
            parent,
            str(len(manifest.files)),
            _size(sum(manifest.sizes.values())),
            _time(manifest.created_at),
            "yes" if version in announced else "-",
            _signed(weights, version),
        )
    console.print(table)


def _signed(weights: WeightStore, version: int) -> str:
    if not weights.has_signature(version):
        return "-"
    return "yes" if weights.signed else "not checked (no key)"


@app.command()
def show(
    version: Annotated[str, typer.Argument(help="The version to show (a number, e.g. 3).")],
    store: StoreUrl = None,
    home: Home = None,
) -> None:
    """Show one version's manifest, then each file as `sha256  size  name` lines."""
    from asearcher.streams.storage.weight_reader import WeightStoreError

    number = _version_number(version)
    weights = _store(store, home)
    with as_cli_error(WeightStoreError):
        published = weights.get(number)
    manifest = published.manifest
    config = manifest.config
    described = ", ".join(
        f"{key}={config[key]}" for key in ("model_type", "architectures") if key in config
    )
    fields = {
        "version": manifest.version,
        "uri": published.uri,
        "manifest sha256": published.sha256,
        "model": manifest.model,
        "step": manifest.step,
        "parent version": "-" if manifest.parent_version is None else manifest.parent_version,
        "created": _time(manifest.created_at),
        "total size": _size(sum(manifest.sizes.values())),
        "config": f"{len(config)} keys" + (f" ({described})" if described else ""),
        "tokenizer files": ", ".join(manifest.tokenizer_files) or "-",
        "trained trajectories": f"{len(manifest.trained_ids):,}",
        "recipe": ", ".join(f"{k}={v}" for k, v in manifest.recipe.items()) or "an RL step",
        "announced": "yes" if weights.is_announced(number) else "no (not yet, or never)",
        "signed": _signed(weights, number),
    }
    for key, value in fields.items():
        console.print(f"{key + ':':<22}{value}", highlight=False, soft_wrap=True)
    console.print("files:", highlight=False)
    # The sha256sum layout, so a line can be checked against a downloaded copy.
    for name, sha256 in sorted(manifest.files.items()):
        size = manifest.sizes[name]
        console.print(f"  {sha256}  {size:>14,}  {name}", highlight=False, soft_wrap=True)


def _version_number(text: str) -> int:
    # Parsed here rather than by typer, so the error can quote what was typed.
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()):
        raise CliError(f"a version is a whole number such as 3, not {text!r}")
    return int(digits)


@app.command()
def prune(
    keep_last: Annotated[
        int, typer.Option("--keep-last", min=1, help="Keep this many newest versions.")
    ],
    keep_every: Annotated[
        int,
        typer.Option("--keep-every", min=0, help="Also keep versions divisible by this (0: none)."),
    ] = 0,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only say which versions would be removed.")
    ] = False,
    store: StoreUrl = None,
    home: Home = None,
) -> None:
    """Delete old versions (and debris of crashed publishes), keeping the newest, milestones
    and the oldest (the one training started from: `asearcher retrain` starts there).

    Each version's manifest goes first, so a reader never loads a half-deleted version.
    """
    from asearcher.streams.storage.weight_reader import WeightStoreError

    weights = _store(store, home)
    with as_cli_error(WeightStoreError, ValueError):
        removed = weights.prune(keep_last, keep_every=keep_every, dry_run=dry_run)
    if not removed:
        console.print("nothing to prune", highlight=False)
        return
    listed = ", ".join(str(v) for v in removed)
    verb = "would remove" if dry_run else "removed"
    noun = "version" if len(removed) == 1 else "versions"
    console.print(f"{verb} {len(removed)} {noun}: {listed}", highlight=False, soft_wrap=True)
    kept = [str(v) for v in weights.versions() if v not in removed]
    console.print(f"kept: {', '.join(kept) or '-'}", highlight=False)


@app.command()
def sign(
    versions: Annotated[
        list[int] | None, typer.Argument(help="Versions to sign (default: every unsigned one).")
    ] = None,
    store: StoreUrl = None,
    home: Home = None,
) -> None:
    """Sign versions published before a key was set, with $ASEARCHER_WEIGHTS_KEY(_FILE).

    Readers with the key refuse unsigned versions; signing one vouches for it, so sign only
    versions you know the trainer wrote.
    """
    from asearcher.streams.storage.weight_reader import WeightStoreError

    with as_cli_error(WeightStoreError):
        weights = _store(store, home)
        chosen = versions or [v for v in weights.versions() if not weights.has_signature(v)]
        for version in chosen:
            weights.sign(version)
    listed = ", ".join(str(v) for v in chosen) or "none"
    console.print(f"signed {len(chosen)} versions: {listed}", highlight=False, soft_wrap=True)
