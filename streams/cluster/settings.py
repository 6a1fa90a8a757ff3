"""Where things are: the state directory, the Kafka cluster, the claim-check store.

Every command resolves its settings here, from flags first, then environment variables, then the
embedded defaults (the local broker recorded in the state directory, `file://` storage).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import msgspec
import platformdirs

from asearcher.streams.storage.claimcheck import (
    DEFAULT_THRESHOLD_BYTES,
    ClaimCheckStore,
    ClaimCheckStores,
)

ENV_HOME = "ASEARCHER_HOME"
ENV_BOOTSTRAP = "ASEARCHER_BOOTSTRAP_SERVERS"
ENV_CLAIMS_URL = "ASEARCHER_CLAIMS_URL"
# ASEARCHER_KAFKA_SECURITY_PROTOCOL=SASL_SSL becomes the client setting security.protocol=SASL_SSL.
ENV_KAFKA_PREFIX = "ASEARCHER_KAFKA_"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BROKER_FILE = "broker.json"


class SettingsError(ValueError):
    """A setting has a value that cannot work; the message names the setting."""


class KafkaSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How clients reach the cluster. `client_config` may hold secrets: never log it."""

    bootstrap_servers: str
    client_config: dict[str, str] = {}
    external: bool = False

    def client(self, **overrides: str | int | bool) -> dict[str, str | int | bool]:
        """A librdkafka configuration for one client."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.client_config, **overrides}


def state_dir(override: str | Path | None = None) -> Path:
    """The directory holding the local broker's data, logs and the default claim-check store."""
    chosen = override or os.environ.get(ENV_HOME)
    return Path(chosen).expanduser() if chosen else platformdirs.user_data_path("asearcher")


def parse_client_options(pairs: list[str]) -> dict[str, str]:
    """`key=value` strings (from `--kafka-config`) as a dict, with a clear error otherwise."""
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SettingsError(f"--kafka-config expects key=value, got {pair!r}")
        options[key.strip()] = value.strip()
    return options


def client_options_from_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Client settings passed through from `ASEARCHER_KAFKA_*` variables."""
    environ = dict(os.environ) if environ is None else environ
    return {
        name[len(ENV_KAFKA_PREFIX) :].lower().replace("_", "."): value
        for name, value in environ.items()
        if name.startswith(ENV_KAFKA_PREFIX) and len(name) > len(ENV_KAFKA_PREFIX)
    }


def kafka_settings(
    bootstrap_servers: str | None = None,
    client_options: list[str] | None = None,
    home: str | Path | None = None,
) -> KafkaSettings:
    """Settings for an external cluster if one is named, else for the local broker.

    A service's own credentials file (`$ASEARCHER_CREDENTIALS_FILE`), else the admin's of a
    secure local broker, come first; explicit client settings override them.
    """
    from asearcher.streams.cluster.acl import credential_options  # acl builds on this module

    explicit = {**client_options_from_env(), **parse_client_options(client_options or [])}
    external = bootstrap_servers or os.environ.get(ENV_BOOTSTRAP)
    root = None if external else state_dir(home)
    config = {**credential_options(root), **explicit}
    if external:
        return KafkaSettings(bootstrap_servers=external, client_config=config, external=True)
    return KafkaSettings(bootstrap_servers=local_bootstrap(root), client_config=config)


def bootstrap_origin(bootstrap_servers: str | None = None, home: str | Path | None = None) -> str:
    """Where `kafka_settings` takes the bootstrap servers from, for error messages."""
    environ = os.environ.get(ENV_BOOTSTRAP)
    # The CLI fills the flag from the variable, so an equal value most likely came from there.
    if environ and bootstrap_servers in (None, "", environ):
        return ENV_BOOTSTRAP
    if bootstrap_servers:
        return "--bootstrap-servers"
    record = state_dir(home) / BROKER_FILE
    if record.exists():
        return f"the local broker recorded in {record}"
    return f"the default; no local broker is recorded in {record}: `asearcher stream up` starts one"


def local_bootstrap(home: Path) -> str:
    """The address the local broker in `home` listens on (recorded by `stream up`)."""
    record = home / BROKER_FILE
    if record.exists():
        return json.loads(record.read_text())["bootstrap_servers"]
    return DEFAULT_BOOTSTRAP


def reading_claim_store(
    url: str | None = None, home: str | Path | None = None, also: Iterable[str] = ()
) -> ClaimCheckStore | ClaimCheckStores:
    """`claim_store`, also reading the claims store of every run under the state dir
    (`<home>/runs/<name>/claims`, where a run's services write theirs) and the stores `also`
    names (runs whose config names a shared one, e.g. on S3): for commands that read what runs
    wrote (replay, audit, sft, evaluation), whichever store a run used."""
    primary = claim_store(url, home)
    runs = state_dir(home) / "runs"
    local = [
        claims.as_uri()
        for claims in (sorted(runs.glob("*/claims")) if runs.is_dir() else [])
        if claims.is_dir()
    ]
    urls = list(dict.fromkeys(u for u in (*local, *also) if u != primary.base_url))
    stores = [claim_store(other, home) for other in urls]
    return ClaimCheckStores(primary, stores) if stores else primary


def claim_store(
    url: str | None = None,
    home: str | Path | None = None,
    threshold_bytes: int = DEFAULT_THRESHOLD_BYTES,
) -> ClaimCheckStore:
    """The claim-check store: `url`, `$ASEARCHER_CLAIMS_URL`, or `file://` in the state dir."""
    chosen = url or os.environ.get(ENV_CLAIMS_URL) or (state_dir(home) / "claims").as_uri()
    try:
        return ClaimCheckStore(chosen, threshold_bytes=threshold_bytes)
    except (ImportError, ValueError) as exc:
        raise SettingsError(f"claims URL {chosen!r} cannot be used: {exc}") from exc
