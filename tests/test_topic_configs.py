"""Topics are created with the broker configs their specs declare."""

from __future__ import annotations

from confluent_kafka.admin import ConfigResource

from asearcher.streams.cluster.admin import admin_client
from asearcher.streams.wire.topics import SERVICE_STATUS, WEIGHTS


def topic_configs(settings, name: str) -> dict[str, str]:
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    admin = admin_client(settings)  # held: the future fails if its client is collected first
    described = admin.describe_configs([resource])[resource].result(timeout=30)
    return {key: entry.value for key, entry in described.items()}


def test_heartbeats_roll_segments_so_compaction_keeps_status_reads_short(
    settings, make_topic
) -> None:
    status = topic_configs(settings, make_topic(like=SERVICE_STATUS))
    assert status["cleanup.policy"] == "compact" and status["segment.ms"] == "600000"
    # Weight announcements are a run's history (the ledger checks versions have no gaps): they
    # keep the broker's default roll of a week.
    weights = topic_configs(settings, make_topic(like=WEIGHTS))
    assert weights["cleanup.policy"] == "compact" and weights["segment.ms"] == "604800000"
