"""Options shared by every command that talks to the cluster, declared once."""

from __future__ import annotations

from typing import Annotated

import typer

from asearcher.streams.settings import (
    ENV_BOOTSTRAP,
    ENV_CLAIMS_URL,
    ENV_HOME,
    KafkaSettings,
    kafka_settings,
)

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
Home = Annotated[
    str | None,
    typer.Option(
        "--home",
        envvar=ENV_HOME,
        help="State directory: local broker data and logs, default claim-check store.",
        show_default="the user data dir",
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
    bootstrap: str | None, kafka_config: list[str] | None, home: str | None
) -> KafkaSettings:
    """The Kafka settings the shared options describe."""
    return kafka_settings(bootstrap, kafka_config or [], home)
