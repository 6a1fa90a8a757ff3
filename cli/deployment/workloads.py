"""The run's services as Kubernetes workloads, one per kind, and the trainer's ranks.

A kind whose replicas are told apart by number (tool workers, producers, evaluators, synthesis
processors: instance names, a producer's share of the staleness bound) is a StatefulSet, its
pods' ordinals being those numbers; the others run once each, as a Deployment replaced on
update (never two feeders at once). The trainer's data-parallel ranks are a StatefulSet too:
one rank per pod, rank = ordinal, rank 0 the rendezvous, as DeepSpeed's launcher numbers them
on one machine. Every pod logs in to Kafka as its kind's principal, with the password Strimzi
keeps in the user's Secret; no secret value appears in a manifest.
"""

from __future__ import annotations

import math
from typing import Any

from asearcher.cli.deployment.documents import Document
from asearcher.cli.deployment.services import INDEX_VARIABLE, RunServices, Service
from asearcher.cli.deployment.target import POD_HOME, Target
from asearcher.cli.run.service_kinds import SERVICE_KINDS
from asearcher.streams.cluster import acl
from asearcher.streams.cluster.settings import (
    ENV_BOOTSTRAP,
    ENV_CLAIMS_URL,
    ENV_HOME,
    ENV_KAFKA_PREFIX,
)
from asearcher.streams.storage.weight_reader import ENV_WEIGHTS_KEY

HOME_VOLUME_SIZE = "100Gi"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"  # set by Kubernetes 1.28 and later
GPU = "nvidia.com/gpu"
# Scheduling floors, not measurements: raise them for large models and corpora.
REQUESTS = {
    "tools": {"cpu": "1", "memory": "2Gi"},
    "rollout": {"cpu": "2", "memory": "8Gi"},
    "trainer": {"cpu": "4", "memory": "16Gi"},
    "evaluator": {"cpu": "2", "memory": "8Gi"},
}
SMALL = {"cpu": "500m", "memory": "1Gi"}
# Where `stream up`'s service environment comes from: the object store's credentials.
S3_KEYS = {
    "AWS_ACCESS_KEY_ID": ("access-key-id", False),
    "AWS_SECRET_ACCESS_KEY": ("secret-access-key", False),
    "AWS_ENDPOINT_URL": ("endpoint-url", True),  # optional: S3-compatible stores
    "AWS_DEFAULT_REGION": ("region", True),
}
_COMPONENT = "app.kubernetes.io/component"


def home_volume(target: Target) -> Document:
    """The run's shared volume, every pod's ASEARCHER_HOME (ReadWriteMany)."""
    about = (
        "Every pod's ASEARCHER_HOME: the world, index and initial policy `stream up` builds "
        "(build or copy them here before the services start), tool results, TensorBoard files. "
        "Its storage class must offer ReadWriteMany."
    )
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": target.metadata(f"{target.base}-home"),
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": HOME_VOLUME_SIZE}},
        },
    }
    return Document(claim, about)


def config_map(target: Target, run: RunServices) -> Document:
    """The services' config files as `stream up` writes them, mounted where it writes them."""
    about = f"The services' resolved configs, as `stream up` writes them to {run.where.configs}."
    files = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": target.metadata(f"{target.base}-config"),
        "data": {name: content.decode() for name, content in run.config_files.items()},
    }
    return Document(files, about)


def workloads(target: Target, run: RunServices) -> list[Document]:
    """One workload per service kind; a StatefulSet comes with its headless Service."""
    documents = []
    for service in run.services:
        if service.kind == "trainer":
            ranks = target.config.trainer.processes
            world = _distributed_world(target, ranks) if ranks > 1 else []
            workload = _stateful_set(target, run, service, ranks, world)
        elif service.numbered:
            workload = _stateful_set(target, run, service, service.replicas)
        else:
            workload = _deployment(target, run, service)
        documents.append(Document(workload, _about(service)))
        if workload["kind"] == "StatefulSet":
            documents.append(Document(_headless(target, service)))
    return documents


def name_of(target: Target, kind: str) -> str:
    """The workload of service kind `kind`."""
    return f"{target.base}-{kind}"


def _about(service: Service) -> str:
    """What a reader of the workload must know: its login, or that it has none."""
    what = SERVICE_KINDS[service.kind].description
    if service.principal is None:
        return (
            f"The {what}. No principal of streams/cluster/acl.py covers it (`stream up --secure` "
            "refuses it as well): on this cluster, which checks every request against ACLs, it "
            "is refused until acl.role_grants grants it rights."
        )
    return f"The {what}, logged in to Kafka as {service.principal}."


def _distributed_world(target: Target, ranks: int) -> list[dict[str, Any]]:
    """What DeepSpeed's launcher sets for each rank (`--no_local_rank`: from the environment
    only), one rank per pod: RANK is the pod's ordinal, rank 0 hosts the rendezvous."""
    name = name_of(target, "trainer")
    return [
        _from_label("RANK", POD_INDEX_LABEL),
        _value("LOCAL_RANK", "0"),
        _value("WORLD_SIZE", str(ranks)),
        _value("MASTER_ADDR", f"{name}-0.{name}"),
        _value("MASTER_PORT", str(target.config.trainer.master_port)),
    ]


def _deployment(target: Target, run: RunServices, service: Service) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": target.metadata(name_of(target, service.kind), _labels(target, service)),
        "spec": {
            "replicas": service.replicas,
            # The old pod is gone before the new one starts: one feeder, one processor.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": _selector(target, service)},
            "template": _pod(target, run, service, []),
        },
    }


def _stateful_set(
    target: Target, run: RunServices, service: Service, replicas: int,
    extra_env: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    name = name_of(target, service.kind)
    index = [_from_label(INDEX_VARIABLE, POD_INDEX_LABEL)]
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": target.metadata(name, _labels(target, service)),
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            # Replicas are peers (and ranks must meet): all start at once, not one by one.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": _selector(target, service)},
            "template": _pod(target, run, service, [*index, *(extra_env or [])]),
        },
    }


def _headless(target: Target, service: Service) -> dict[str, Any]:
    """The Service that gives a StatefulSet's pods their names (`<pod>.<service>`)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": target.metadata(name_of(target, service.kind), _labels(target, service)),
        "spec": {
            "clusterIP": "None",
            # Rank 0's name must resolve while the ranks wait for one another.
            "publishNotReadyAddresses": True,
            "selector": _selector(target, service),
        },
    }


def _pod(
    target: Target, run: RunServices, service: Service, extra_env: list[dict[str, Any]]
) -> dict[str, Any]:
    gpus = gpus_of(target, service.kind)
    volumes = [
        {"name": "home", "persistentVolumeClaim": {"claimName": f"{target.base}-home"}},
        {"name": "config", "configMap": {"name": f"{target.base}-config"}},
    ]
    mounts = [
        {"name": "home", "mountPath": str(POD_HOME)},
        {"name": "config", "mountPath": str(run.where.configs), "readOnly": True},
    ]
    if gpus:
        # NCCL and vLLM share memory through /dev/shm, which a container gets 64 MiB of.
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    container = {
        "name": service.kind,
        "image": target.image,
        "command": service.command,
        "env": [*extra_env, *service_env(target, service.principal)],
        "envFrom": [{"secretRef": {"name": target.env_secret, "optional": True}}],
        "resources": _resources(service.kind, gpus),
        "volumeMounts": mounts,
    }
    return {
        "metadata": {"labels": _labels(target, service)},
        "spec": {
            "terminationGracePeriodSeconds": math.ceil(service.stop_wait_s),
            "containers": [container],
            "volumes": volumes,
        },
    }


def service_env(target: Target, principal: str | None) -> list[dict[str, Any]]:
    """The environment `stream up` gives its services (`topology.service_env`), on the
    cluster: where Kafka and the stores are, and the kind's own login, secrets by reference."""
    env = [
        _value(ENV_HOME, str(POD_HOME)),
        _value(ENV_BOOTSTRAP, target.bootstrap),
        _value(ENV_CLAIMS_URL, target.claims),
        _value("PYTHONUNBUFFERED", "1"),
        _value("COLUMNS", "160"),  # whole log lines
    ]
    if principal is not None:
        env += kafka_login(principal)
    env += [_secret(name, target.s3_secret, key, optional)
            for name, (key, optional) in S3_KEYS.items()]  # fmt: skip
    env.append(_secret(ENV_WEIGHTS_KEY, target.weights_key_secret, "key", optional=True))
    return env


def kafka_login(principal: str) -> list[dict[str, Any]]:
    """`principal`'s client settings (`acl.client_options`) as ASEARCHER_KAFKA_* variables;
    the password from the Secret Strimzi's user operator writes for the KafkaUser."""
    env = []
    for key, value in acl.client_options(principal, "").items():
        name = ENV_KAFKA_PREFIX + key.upper().replace(".", "_")
        if key == "sasl.password":
            env.append(_secret(name, principal, "password", optional=False))
        else:
            env.append(_value(name, value))
    return env


def gpus_of(target: Target, kind: str) -> int:
    """GPUs a pod of `kind` asks for: one where a vLLM engine runs (producers, evaluators),
    and one per trainer rank in a run that has one (a run on GPUs)."""
    config = target.config
    engines = {
        "rollout": config.rollout.engine,
        "evaluator": config.eval.engine or config.rollout.engine,
    }
    if kind == "trainer":
        return int("vllm" in engines.values())
    return int(engines.get(kind) == "vllm")


def _resources(kind: str, gpus: int) -> dict[str, Any]:
    requests: dict[str, Any] = dict(REQUESTS.get(kind, SMALL))
    if not gpus:
        return {"requests": requests}
    # An extended resource is asked for in limits; requests must then equal them.
    return {"requests": {**requests, GPU: gpus}, "limits": {GPU: gpus}}


def _labels(target: Target, service: Service) -> dict[str, str]:
    return {**_selector(target, service), "app.kubernetes.io/name": "asearcher"}


def _selector(target: Target, service: Service) -> dict[str, str]:
    return {"app.kubernetes.io/instance": target.base, _COMPONENT: service.kind}


def _value(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _from_label(name: str, label: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}


def _secret(name: str, secret: str, key: str, optional: bool) -> dict[str, Any]:
    reference = {"name": secret, "key": key, "optional": optional}
    return {"name": name, "valueFrom": {"secretKeyRef": reference}}
