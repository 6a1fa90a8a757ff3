"""KEDA scaling of the services that read a consumer group: tool workers, producers, evaluators.

Each scales on its own group's lag on the topic the group reads, as the group's members see it
(the same group id and topic their configs name). KEDA reads the lag as the `reader`
principal, whose ACLs describe every group and read every topic and nothing more.

Producers are the exception to scaling freely. Each one's staleness capacity is its share of
the trainer's batch, divided by `rollout.replicas` (`staleness.StalenessConfig.share`): more
producers than that would together start more than the trainer's bound allows (and a pod past
the last share has no config to run with), fewer would leave shares unclaimed, and the trainer,
which waits for whole batches, would stall within about η versions. So KEDA runs either all of
them, while their group has requests waiting or in flight, or none, once it has none.
"""

from __future__ import annotations

from typing import Any

import msgspec

from asearcher.cli.deployment.documents import Document
from asearcher.cli.deployment.services import RunServices
from asearcher.cli.deployment.target import Target
from asearcher.cli.deployment.workloads import name_of
from asearcher.cli.run.config import groups
from asearcher.streams.cluster import acl
from asearcher.streams.wire.topics import TOOL_CALLS, TOPICS_BY_NAME

KEDA_API = "keda.sh/v1alpha1"
LAG_READER = acl.READER
MECHANISM = "scram_sha512"  # acl.MECHANISM in the words of KEDA's kafka scaler


class Scaling(msgspec.Struct, frozen=True, kw_only=True):
    """How one kind scales: its group, the topic it reads, its bounds, its lag per replica."""

    kind: str
    group: str
    topic: str
    lag: int  # KEDA's lagThreshold: waiting records per replica
    minimum: int
    maximum: int
    idle: int | None = None  # replicas while the group has no lag at all


def scalings(target: Target, run: RunServices) -> list[Scaling]:
    """The kinds the run has that KEDA scales, and how."""
    resolved = run.resolved
    counts = {service.kind: service.replicas for service in run.services}
    found = []
    if "tools" in counts:
        found.append(_up_to_partitions(
            "tools", groups(target.config.name)["tools"], TOOL_CALLS,
            resolved.tools.max_concurrency, counts["tools"],
        ))  # fmt: skip
    if "rollout" in counts:
        producer, replicas = resolved.rollout[0], counts["rollout"]
        found.append(Scaling(
            kind="rollout", group=producer.group_id, topic=producer.topics.requests,
            lag=producer.concurrency, minimum=replicas, maximum=replicas, idle=0,
        ))  # fmt: skip
    if "evaluator" in counts:
        evaluator = resolved.evaluator
        found.append(_up_to_partitions(
            "evaluator", evaluator.group_id, evaluator.topics.requests, evaluator.concurrency,
            counts["evaluator"],
        ))  # fmt: skip
    return found


def _up_to_partitions(kind: str, group: str, topic: str, lag: int, replicas: int) -> Scaling:
    """From the run's count up to one member per partition (more would sit idle)."""
    maximum = max(replicas, TOPICS_BY_NAME[topic].partitions)
    return Scaling(kind=kind, group=group, topic=topic, lag=lag, minimum=replicas, maximum=maximum)


def scaling_objects(target: Target, run: RunServices) -> list[Document]:
    """The ScaledObjects, and the login KEDA reads the lag with (if anything scales)."""
    found = scalings(target, run)
    if not found:
        return []
    objects = [_scaled_object(target, scaling) for scaling in found]
    return [*objects, *_lag_login(target)]


def _scaled_object(target: Target, scaling: Scaling) -> Document:
    spec: dict[str, Any] = {
        "scaleTargetRef": {
            "apiVersion": "apps/v1", "kind": "StatefulSet", "name": name_of(target, scaling.kind),
        },
        **({} if scaling.idle is None else {"idleReplicaCount": scaling.idle}),
        "minReplicaCount": scaling.minimum,
        "maxReplicaCount": scaling.maximum,
        "triggers": [
            {
                "type": "kafka",
                "metadata": {
                    "bootstrapServers": target.bootstrap,
                    "consumerGroup": scaling.group,
                    "topic": scaling.topic,
                    "lagThreshold": str(scaling.lag),
                    # The groups' members start from the earliest offset: so does their lag.
                    "offsetResetPolicy": "earliest",
                },
                "authenticationRef": {"name": _lag_login_name(target)},
            }
        ],
    }  # fmt: skip
    body = {
        "apiVersion": KEDA_API,
        "kind": "ScaledObject",
        "metadata": target.metadata(name_of(target, scaling.kind)),
        "spec": spec,
    }
    return Document(body, _why(scaling))


def _why(scaling: Scaling) -> str:
    if scaling.kind == "rollout":
        return (
            f"Rollout producers: {scaling.minimum} (rollout.replicas) while {scaling.group} has "
            f"requests on {scaling.topic}, none when it has none; never another count. Each "
            "producer's staleness capacity is its share of the trainer's batch divided by "
            "rollout.replicas: more producers would exceed the trainer's staleness bound (and "
            "have no config), fewer would leave shares unclaimed and stall the trainer."
        )
    return (
        f"{scaling.kind}: {scaling.minimum} to {scaling.maximum} replicas on the lag of "
        f"{scaling.group} on {scaling.topic}, {scaling.lag} waiting records per replica."
    )


def _lag_login_name(target: Target) -> str:
    return f"{target.base}-kafka-lag"


def _lag_login(target: Target) -> list[Document]:
    """KEDA's login: the reader's name and mechanism (not secret) in a ConfigMap, its
    password from the Secret Strimzi writes for the KafkaUser."""
    name = _lag_login_name(target)
    settings = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": target.metadata(name),
        "data": {"username": LAG_READER, "sasl": MECHANISM},
    }
    authentication = {
        "apiVersion": KEDA_API,
        "kind": "TriggerAuthentication",
        "metadata": target.metadata(name),
        "spec": {
            "configMapTargetRef": [
                {"parameter": "username", "name": name, "key": "username"},
                {"parameter": "sasl", "name": name, "key": "sasl"},
            ],
            "secretTargetRef": [{"parameter": "password", "name": LAG_READER, "key": "password"}],
        },
    }
    about = f"KEDA reads consumer lag as {LAG_READER} (describe groups, read topics, no more)."
    return [Document(settings), Document(authentication, about)]
