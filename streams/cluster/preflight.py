"""Checks a command makes before it starts: the cluster answers, the topics it names exist.

Without them a service pointed at a wrong address waits forever while librdkafka logs every
reconnect attempt; with them it stops within `reach_timeout_s()` (20 s by default) with one
line saying why.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata

from asearcher.streams.cluster.settings import KafkaSettings, SettingsError

# Short enough that a service says so well within 30 s of starting, long enough for a slow
# SASL/TLS handshake to a remote cluster.
REACH_TIMEOUT_S = 20.0
ENV_REACH_TIMEOUT = "ASEARCHER_REACH_TIMEOUT_S"

# librdkafka logs each failed connect (several a second); the check reports the cause once.
_SILENT = logging.getLogger("asearcher.preflight.librdkafka")
_SILENT.addHandler(logging.NullHandler())
_SILENT.propagate = False

# "127.0.0.1:1/bootstrap: Connect to ... failed: ... (after 0ms in state CONNECT)"
_BROKER_PREFIX = re.compile(r"^\S+/(bootstrap|\d+): ")
_STATE_SUFFIX = re.compile(r"\s*\(after \d+ms in state \w+\)$")


def reach_timeout_s() -> float:
    """How long a command waits for the cluster: `$ASEARCHER_REACH_TIMEOUT_S` or 20 s."""
    raw = os.environ.get(ENV_REACH_TIMEOUT)
    if raw is None:
        return REACH_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise SettingsError(
            f"{ENV_REACH_TIMEOUT} must be a positive number of seconds, got {raw!r}"
        )
    return value


def cluster_metadata(
    settings: KafkaSettings, origin: str = "", timeout_s: float | None = None
) -> ClusterMetadata:
    """The cluster's metadata, or a one-line `SettingsError` naming the address and its origin.

    `origin` says where the bootstrap servers came from, e.g. "--bootstrap-servers";
    `timeout_s` defaults to `reach_timeout_s()`.
    """
    timeout_s = reach_timeout_s() if timeout_s is None else timeout_s
    errors: list[KafkaError] = []
    admin = AdminClient(settings.client(logger=_SILENT, error_cb=errors.append))
    try:
        return admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        admin.poll(0)  # hands the connection errors to `error_cb`
        cause = _cause(errors) or exc.args[0].str()
        where = f" (bootstrap servers from {origin})" if origin else ""
        raise SettingsError(
            f"cannot reach Kafka at {settings.bootstrap_servers} within {timeout_s:g} s: "
            f"{cause}{where}"
        ) from None


def check_reachable(settings: KafkaSettings, origin: str, timeout_s: float | None = None) -> None:
    """Raise a one-line `SettingsError` unless the cluster answers within `timeout_s`."""
    cluster_metadata(settings, origin, timeout_s)


def missing_topics(settings: KafkaSettings, names: Iterable[str]) -> list[str]:
    """Those of `names` the cluster does not have, in the order given."""
    existing = cluster_metadata(settings).topics
    return [name for name in names if name not in existing]


def _cause(errors: list[KafkaError]) -> str:
    """The first error that says why a broker is down ("Connection refused"...), cleaned up."""
    for error in errors:
        if error.code() != KafkaError._ALL_BROKERS_DOWN:
            return _STATE_SUFFIX.sub("", _BROKER_PREFIX.sub("", error.str()))
    return ""
