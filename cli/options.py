"""Options shared by every command that talks to the cluster, declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
import typer

from asearcher.streams.cluster.settings import (
    ENV_BOOTSTRAP,
    ENV_CLAIMS_URL,
    ENV_HOME,
    KafkaSettings,
    bootstrap_origin,
    kafka_settings,
)
from asearcher.streams.service.config_file import field_description
from asearcher.streams.storage.weight_reader import ENV_WEIGHT_STORE


def overriding(kind: type[msgspec.Struct], name: str) -> str:
    """The help of a flag that overrides config field `name` of `kind`: the field's own
    description (declared once, on the struct), naming the field."""
    text = field_description(kind, name)
    return f"{text[0].upper()}{text[1:]} (config: {name})."


BootstrapServers = Annotated[
    str | None,
    typer.Option(
        "--bootstrap-servers",
        "-b",
        envvar=ENV_BOOTSTRAP,
        help="An external Kafka cluster (host:port,...). Without it the local broker is used.",
        show_default=False,
    ),
]
KafkaConfig = Annotated[
    list[str] | None,
    typer.Option(
        "--kafka-config",
        "-X",
        help="A librdkafka client setting key=value, e.g. security.protocol=SASL_SSL "
        "(repeatable; ASEARCHER_KAFKA_<KEY> variables work too).",
        show_default=False,
    ),
]
InitialPolicy = Annotated[
    Path | None,
    typer.Option("--model", help="Initial policy (Hugging Face dir).", show_default="<home>/model"),
]

RunFile = Annotated[
    Path | None,
    typer.Option(
        "--config", "-c", help="Run config (TOML, see docs/running.md); default: embedded run."
    ),
]
RunName = Annotated[
    str | None, typer.Option("--run", help="The run's name (default: from -c, else 'default').")
]

SavedRun = Annotated[
    str | None,
    typer.Option("--run", help="A run brought up before, by name (e.g. learn), instead of -c."),
]

Home = Annotated[
    str | None,
    typer.Option(
        "--home",
        envvar=ENV_HOME,
        help="State directory: local broker data and logs, default claim-check store.",
        show_default="the user data dir",
    ),
]
Instance = Annotated[
    str | None,
    typer.Option(
        help="Stable name of this service: a restart under it fences its dead predecessor and "
        "takes its partitions back at once (Kafka static membership).",
        show_default=False,
    ),
]
ClaimsUrl = Annotated[
    str | None,
    typer.Option(
        "--claims-url",
        envvar=ENV_CLAIMS_URL,
        help="fsspec URL for payloads too large for a Kafka message (file://, s3://, ...).",
        show_default="file:// under --home",
    ),
]


def cluster(
    bootstrap: str | None,
    kafka_config: list[str] | None,
    home: str | None,
    *,
    check_local: bool = False,
) -> KafkaSettings:
    """The Kafka settings the shared options describe, once the cluster answered.

    A named cluster is always checked, so a wrong address is one line within seconds instead of
    a hang. The local broker only with `check_local`: `stream up` resolves the settings before it
    starts the broker, and `stream status` says itself that it is down.
    """
    from asearcher.streams.cluster.preflight import check_reachable

    settings = kafka_settings(bootstrap, kafka_config or [], home)
    if settings.external or check_local:
        check_reachable(settings, bootstrap_origin(bootstrap, home))
    return settings


StoreUrl = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar=ENV_WEIGHT_STORE,
        help="fsspec URL of the weight store (file://, s3://, ...; an S3 endpoint comes from "
        "AWS_ENDPOINT_URL).",
        show_default="file:// under --home",
    ),
]
