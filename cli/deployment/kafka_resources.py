"""The run's Kafka cluster as Strimzi resources: the cluster, its topics, its users and ACLs.

Topics come from `streams/wire/topics.py: TOPICS` laid out for three brokers; users are the
service principals of `streams/cluster/acl.py`, each with exactly the ACLs `acl.provision`
creates for the run's consumer groups (`topology.run_groups`), as `stream up --secure` does.
"""

from __future__ import annotations

from typing import Any

from asearcher.cli.deployment.documents import Document
from asearcher.cli.deployment.target import LISTENER_NAME, LISTENER_PORT, Target
from asearcher.cli.run.topology import run_groups
from asearcher.streams.cluster import acl
from asearcher.streams.wire.topics import TOPICS, TopicSpec

STRIMZI_API = "kafka.strimzi.io/v1beta2"  # served by Strimzi up to 0.51; 1.0 serves v1 only
NODES = 3  # brokers, each a KRaft controller too
NODE_POOL = "nodes"
NODE_STORAGE = "100Gi"  # each node's volume: the event log, trajectories included
# Kafka's own topics (offsets, transactions) as the project's topics are laid out: three
# copies, and writes need two of them, so one node can fail.
INTERNAL_REPLICAS = min(3, NODES)
INTERNAL_MIN_INSYNC = max(1, min(2, INTERNAL_REPLICAS - 1))
# The ACL vocabulary of `acl.Grant` in Strimzi's words.
_RESOURCE_TYPES = {"topic": "topic", "group": "group", "transactional_id": "transactionalId"}
_OPERATIONS = {"read": "Read", "write": "Write", "describe": "Describe", "create": "Create"}


def cluster(target: Target) -> list[Document]:
    """The `Kafka` (KRaft, SCRAM logins, ACLs) and its one node pool."""
    kafka = {
        "apiVersion": STRIMZI_API,
        "kind": "Kafka",
        "metadata": {
            **target.metadata(target.cluster),
            "annotations": {"strimzi.io/kraft": "enabled", "strimzi.io/node-pools": "enabled"},
        },
        "spec": {
            "kafka": {
                "listeners": [
                    {
                        "name": LISTENER_NAME,
                        "port": LISTENER_PORT,
                        "type": "internal",
                        "tls": False,
                        "authentication": {"type": "scram-sha-512"},
                    }
                ],
                "authorization": {"type": "simple"},
                "config": _broker_config(),
            },
            # The topic operator applies the KafkaTopics, the user operator the KafkaUsers
            # (it also writes each user's password into a Secret named after the user).
            "entityOperator": {"topicOperator": {}, "userOperator": {}},
        },
    }
    about = (
        f"The run's Kafka cluster, for the Strimzi operator ({STRIMZI_API}: Strimzi up to "
        f"0.51). {NODES} KRaft nodes; clients log in with SCRAM-SHA-512 on port "
        f"{LISTENER_PORT} (no TLS: the faust apps' client speaks SASL_PLAINTEXT at most), and "
        "every request is checked against the users' ACLs."
    )
    return [Document(kafka, about), Document(_node_pool(target))]


def _broker_config() -> dict[str, Any]:
    """Broker settings: the local broker's (`streams/cluster/local_broker.py`) for 3 nodes."""
    return {
        "default.replication.factor": INTERNAL_REPLICAS,
        "min.insync.replicas": INTERNAL_MIN_INSYNC,
        "offsets.topic.replication.factor": INTERNAL_REPLICAS,
        "transaction.state.log.replication.factor": INTERNAL_REPLICAS,
        "transaction.state.log.min.isr": INTERNAL_MIN_INSYNC,
        # Topics are declared (KafkaTopic), never made by a client's typo.
        "auto.create.topics.enable": False,
    }


def _node_pool(target: Target) -> dict[str, Any]:
    labels = {"strimzi.io/cluster": target.cluster}
    return {
        "apiVersion": STRIMZI_API,
        "kind": "KafkaNodePool",
        "metadata": target.metadata(f"{target.cluster}-{NODE_POOL}", labels),
        "spec": {
            "replicas": NODES,
            "roles": ["controller", "broker"],
            "storage": {
                "type": "jbod",
                "volumes": [
                    {
                        "id": 0,
                        "type": "persistent-claim",
                        "size": NODE_STORAGE,
                        "deleteClaim": False,
                        "kraftMetadata": "shared",
                    }
                ],
            },
        },
    }


def topics(target: Target, specs: tuple[TopicSpec, ...] = TOPICS) -> list[Document]:
    """One `KafkaTopic` per declared topic, laid out for the cluster's nodes."""
    return [Document(_topic(target, spec), spec.description) for spec in specs]


def _topic(target: Target, spec: TopicSpec) -> dict[str, Any]:
    return {
        "apiVersion": STRIMZI_API,
        "kind": "KafkaTopic",
        # A topic's name (dots) need not be an object's name: the object says which topic.
        "metadata": target.metadata(
            f"{target.base}-{spec.name.replace('.', '-')}", {"strimzi.io/cluster": target.cluster}
        ),
        "spec": {
            "topicName": spec.name,
            "partitions": spec.partitions,
            "replicas": spec.replicas_on(NODES),
            "config": spec.broker_config(NODES),
        },
    }


def users(target: Target) -> list[Document]:
    """One `KafkaUser` per service principal, with the ACLs `acl.provision` gives it."""
    grants = acl.role_grants(run_groups(target.config.name))
    return [
        Document(
            _user(target, principal, grants[principal]),
            f"Principal {principal}: the ACLs streams/cluster/acl.py grants it for run "
            f"{target.config.name!r}. Strimzi's user operator writes its password into the "
            f"Secret {principal} (key `password`).",
        )
        for principal in acl.SERVICE_PRINCIPALS
    ]


def _user(target: Target, principal: str, grants: list[acl.Grant]) -> dict[str, Any]:
    return {
        "apiVersion": STRIMZI_API,
        "kind": "KafkaUser",
        # The object's name is the principal: Strimzi logs it in as User:<name>.
        "metadata": target.metadata(principal, {"strimzi.io/cluster": target.cluster}),
        "spec": {
            "authentication": {"type": "scram-sha-512"},
            "authorization": {"type": "simple", "acls": [_acl_rule(g) for g in grants]},
        },
    }


def _acl_rule(grant: acl.Grant) -> dict[str, Any]:
    return {
        "type": "allow",
        "resource": {
            "type": _RESOURCE_TYPES[grant.resource],
            "name": grant.name,
            "patternType": "prefix" if grant.prefixed else "literal",
        },
        "operations": [_OPERATIONS[operation] for operation in grant.operations],
        "host": "*",
    }
