"""The documented fields of the custom resources `deploy k8s` writes, and a check against them.

Transcribed by hand from the CRDs: Strimzi's `kafka.strimzi.io/v1beta2` (as served by Strimzi
0.51, `packaging/install/cluster-operator/04*-Crd-*.yaml`) and KEDA's `keda.sh/v1alpha1`
(`config/crd/bases/keda.sh_*.yaml`), plus what their documentation says of annotations, labels
and the kafka scaler's parameters. Each table lists, for every path it knows, the field's type
and where it has them its values and bounds; an object's field that the table does not list,
a value of another type, or one outside its values is a problem. A path listed as an object
without its own fields listed accepts none: an object the manifests never fill.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple


class Field(NamedTuple):
    """One documented field: its type, and what its value may be."""

    type: str  # object, array, string, integer, boolean, map (any scalars), strings (str->str)
    values: frozenset[str] | None = None
    required: tuple[str, ...] = ()  # an object's fields that must be there
    minimum: int | None = None
    maximum: int | None = None
    pattern: str | None = None


def _one_of(*values: str) -> frozenset[str]:
    return frozenset(values)


OBJECT, ARRAY, STRING = Field("object"), Field("array"), Field("string")
INTEGER, BOOLEAN, MAP, STRINGS = Field("integer"), Field("boolean"), Field("map"), Field("strings")


def _all(field: Field, path: str, names: str) -> dict[str, Field]:
    """`field` at each of the space-separated `names` under `path`."""
    return {f"{path}.{name}": field for name in names.split()}


def _operator(path: str) -> dict[str, Field]:
    """The fields the topic and the user operator share."""
    return {
        path: OBJECT,
        **_all(STRING, path, "watchedNamespace image"),
        **_all(INTEGER, path, "reconciliationIntervalSeconds reconciliationIntervalMs"),
        **_all(OBJECT, path, "resources livenessProbe readinessProbe logging jvmOptions"),
    }


ACL_OPERATIONS = _one_of(
    "Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction", "AlterConfigs",
    "DescribeConfigs", "IdempotentWrite", "All",
)  # fmt: skip

KAFKA = {
    "spec": Field("object", required=("kafka",)),
    "spec.kafka": Field("object", required=("listeners",)),
    **_all(OBJECT, "spec", "zookeeper clusterCa clientsCa cruiseControl jmxTrans kafkaExporter"),
    "spec.maintenanceTimeWindows": ARRAY,
    "spec.kafka.version": STRING,
    "spec.kafka.metadataVersion": STRING,
    "spec.kafka.replicas": INTEGER,
    "spec.kafka.image": STRING,
    "spec.kafka.brokerRackInitImage": STRING,
    "spec.kafka.config": MAP,
    **_all(
        OBJECT,
        "spec.kafka",
        "storage rack livenessProbe readinessProbe jvmOptions jmxOptions resources metricsConfig "
        "logging template tieredStorage quotas",
    ),
    "spec.kafka.listeners": ARRAY,
    "spec.kafka.listeners[]": Field("object", required=("name", "port", "type", "tls")),
    "spec.kafka.listeners[].name": Field("string", pattern=r"^[a-z0-9]{1,11}$"),
    "spec.kafka.listeners[].port": Field("integer", minimum=9092),
    "spec.kafka.listeners[].type": Field(
        "string", _one_of("internal", "route", "loadbalancer", "nodeport", "ingress", "cluster-ip")
    ),
    "spec.kafka.listeners[].tls": BOOLEAN,
    "spec.kafka.listeners[].configuration": OBJECT,
    "spec.kafka.listeners[].networkPolicyPeers": ARRAY,
    "spec.kafka.listeners[].authentication": Field("object", required=("type",)),
    "spec.kafka.listeners[].authentication.type": Field(
        "string", _one_of("tls", "scram-sha-512", "oauth", "custom")
    ),
    "spec.kafka.authorization": Field("object", required=("type",)),
    "spec.kafka.authorization.type": Field(
        "string", _one_of("simple", "opa", "keycloak", "custom")
    ),
    "spec.kafka.authorization.superUsers": ARRAY,
    "spec.kafka.authorization.superUsers[]": STRING,
    "spec.entityOperator": OBJECT,
    "spec.entityOperator.tlsSidecar": OBJECT,
    "spec.entityOperator.template": OBJECT,
    **_all(OBJECT, "spec.entityOperator", "topicOperator userOperator"),
    **_operator("spec.entityOperator.topicOperator"),
    **_operator("spec.entityOperator.userOperator"),
    "spec.entityOperator.userOperator.secretPrefix": STRING,
    "spec.entityOperator.topicOperator.topicMetadataMaxAttempts": INTEGER,
    "spec.entityOperator.topicOperator.startupProbe": OBJECT,
}

_VOLUME = {
    "type": Field("string", _one_of("ephemeral", "persistent-claim")),
    "id": Field("integer", minimum=0),
    "size": STRING,
    "sizeLimit": STRING,
    "class": STRING,
    "deleteClaim": BOOLEAN,
    "kraftMetadata": Field("string", _one_of("shared")),
    "selector": STRINGS,
    "overrides": ARRAY,
    "volumeAttributesClass": STRING,
}
KAFKA_NODE_POOL = {
    "spec": Field("object", required=("replicas", "storage", "roles")),
    "spec.replicas": Field("integer", minimum=0),
    "spec.roles": ARRAY,
    "spec.roles[]": Field("string", _one_of("controller", "broker")),
    "spec.resources": OBJECT,
    "spec.jvmOptions": OBJECT,
    "spec.template": OBJECT,
    "spec.storage": Field("object", required=("type",)),
    **{f"spec.storage.{name}": field for name, field in _VOLUME.items()},
    "spec.storage.type": Field("string", _one_of("ephemeral", "persistent-claim", "jbod")),
    "spec.storage.volumes": ARRAY,
    "spec.storage.volumes[]": Field("object", required=("type",)),
    **{f"spec.storage.volumes[].{name}": field for name, field in _VOLUME.items()},
}

KAFKA_TOPIC = {
    "spec": OBJECT,
    "spec.topicName": STRING,
    "spec.partitions": Field("integer", minimum=1),
    "spec.replicas": Field("integer", minimum=1, maximum=32767),
    "spec.config": MAP,
}

KAFKA_USER = {
    "spec": OBJECT,
    "spec.authentication": Field("object", required=("type",)),
    "spec.authentication.type": Field("string", _one_of("tls", "tls-external", "scram-sha-512")),
    "spec.authentication.password": OBJECT,
    "spec.authorization": Field("object", required=("acls", "type")),
    "spec.authorization.type": Field("string", _one_of("simple")),
    "spec.authorization.acls": ARRAY,
    "spec.authorization.acls[]": Field("object", required=("resource",)),
    "spec.authorization.acls[].type": Field("string", _one_of("allow", "deny")),
    "spec.authorization.acls[].host": STRING,
    "spec.authorization.acls[].operation": Field("string", ACL_OPERATIONS),
    "spec.authorization.acls[].operations": ARRAY,
    "spec.authorization.acls[].operations[]": Field("string", ACL_OPERATIONS),
    "spec.authorization.acls[].resource": Field("object", required=("type",)),
    "spec.authorization.acls[].resource.type": Field(
        "string", _one_of("topic", "group", "cluster", "transactionalId")
    ),
    "spec.authorization.acls[].resource.name": STRING,
    "spec.authorization.acls[].resource.patternType": Field("string", _one_of("literal", "prefix")),
    "spec.quotas": OBJECT,
    "spec.template": OBJECT,
}

SCALED_OBJECT = {
    "spec": Field("object", required=("scaleTargetRef", "triggers")),
    "spec.advanced": OBJECT,
    "spec.fallback": OBJECT,
    **_all(
        INTEGER,
        "spec",
        "cooldownPeriod idleReplicaCount initialCooldownPeriod maxReplicaCount minReplicaCount "
        "pollingInterval",
    ),
    "spec.scaleTargetRef": Field("object", required=("name",)),
    "spec.scaleTargetRef.apiVersion": STRING,
    "spec.scaleTargetRef.kind": STRING,
    "spec.scaleTargetRef.name": STRING,
    "spec.scaleTargetRef.envSourceContainerName": STRING,
    "spec.triggers": ARRAY,
    "spec.triggers[]": Field("object", required=("metadata", "type")),
    "spec.triggers[].type": STRING,
    "spec.triggers[].name": STRING,
    "spec.triggers[].metricType": STRING,
    "spec.triggers[].useCachedMetrics": BOOLEAN,
    "spec.triggers[].metadata": STRINGS,
    "spec.triggers[].authenticationRef": Field("object", required=("name",)),
    "spec.triggers[].authenticationRef.name": STRING,
    "spec.triggers[].authenticationRef.kind": Field(
        "string", _one_of("TriggerAuthentication", "ClusterTriggerAuthentication")
    ),
}


def _target_refs(path: str) -> dict[str, Field]:
    """A list of references to a key of a Secret or ConfigMap, each naming its parameter."""
    item = {f"{path}[]": Field("object", required=("key", "name", "parameter"))}
    return {path: ARRAY, **item, **_all(STRING, f"{path}[]", "parameter name key")}


TRIGGER_AUTHENTICATION = {
    "spec": OBJECT,
    **_all(
        OBJECT,
        "spec",
        "podIdentity hashiCorpVault azureKeyVault awsSecretManager gcpSecretManager oauth2",
    ),
    "spec.filePath": STRING,
    "spec.boundServiceAccountToken": ARRAY,
    "spec.env": ARRAY,
    "spec.env[]": Field("object", required=("name", "parameter")),
    "spec.env[].name": STRING,
    "spec.env[].parameter": STRING,
    "spec.env[].containerName": STRING,
    **_target_refs("spec.secretTargetRef"),
    **_target_refs("spec.configMapTargetRef"),
}

CUSTOM_RESOURCES: dict[tuple[str, str], dict[str, Field]] = {
    ("kafka.strimzi.io/v1beta2", "Kafka"): KAFKA,
    ("kafka.strimzi.io/v1beta2", "KafkaNodePool"): KAFKA_NODE_POOL,
    ("kafka.strimzi.io/v1beta2", "KafkaTopic"): KAFKA_TOPIC,
    ("kafka.strimzi.io/v1beta2", "KafkaUser"): KAFKA_USER,
    ("keda.sh/v1alpha1", "ScaledObject"): SCALED_OBJECT,
    ("keda.sh/v1alpha1", "TriggerAuthentication"): TRIGGER_AUTHENTICATION,
}
# Strimzi's documented annotations and their values, and the label that names an object's
# cluster (without it the operators ignore the object).
ANNOTATIONS = {
    "Kafka": {
        "strimzi.io/kraft": _one_of("enabled", "disabled", "migration", "rollback"),
        "strimzi.io/node-pools": _one_of("enabled", "disabled"),
    }
}
CLUSTER_LABEL = "strimzi.io/cluster"
NEEDS_CLUSTER_LABEL = {"KafkaNodePool", "KafkaTopic", "KafkaUser"}
# KEDA's kafka scaler: its trigger metadata, the parameters a TriggerAuthentication may give
# it, and the metadata it cannot do without.
KAFKA_TRIGGER_METADATA = {
    "bootstrapServers": None, "consumerGroup": None, "topic": None, "partitionLimitation": None,
    "lagThreshold": None, "activationLagThreshold": None,
    "offsetResetPolicy": _one_of("latest", "earliest"),
    "allowIdleConsumers": _one_of("true", "false"),
    "excludePersistentLag": _one_of("true", "false"),
    "scaleToZeroOnInvalidOffset": _one_of("true", "false"),
    "limitToPartitionsWithLag": _one_of("true", "false"),
    "ensureEvenDistributionOfPartitions": _one_of("true", "false"),
    "version": None, "tls": _one_of("enable", "disable"), "unsafeSsl": _one_of("true", "false"),
    "sasl": _one_of("none", "plaintext", "scram_sha256", "scram_sha512", "oauthbearer", "gssapi"),
}  # fmt: skip
KAFKA_TRIGGER_REQUIRED = ("bootstrapServers", "consumerGroup")
KAFKA_AUTH_PARAMETERS = {
    "sasl", "username", "password", "tls", "ca", "cert", "key", "keyPassword",
    "saslTokenProvider", "scopes", "oauthTokenEndpointUri", "oauthExtensions", "keytab", "realm",
    "kerberosConfig", "kerberosServiceName", "kerberosDisableFAST",
}  # fmt: skip
_METADATA = {"name", "namespace", "labels", "annotations"}
_TOP = {"apiVersion", "kind", "metadata", "spec"}
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def problems(resource: dict[str, Any]) -> list[str]:
    """What in `resource` its kind's documented fields do not allow (empty: nothing)."""
    key = (resource.get("apiVersion"), resource.get("kind"))
    table = CUSTOM_RESOURCES.get(key)  # type: ignore[arg-type]
    if table is None:
        return [f"{key}: not a custom resource these tables know"]
    found = [f"{name}: not a field of a resource" for name in sorted(set(resource) - _TOP)]
    found += _metadata_problems(resource)
    _walk(resource.get("spec"), "spec", table, found)
    if key[1] == "ScaledObject":
        found += _trigger_problems(resource["spec"].get("triggers", []))
    if key[1] == "TriggerAuthentication":
        found += _parameter_problems(resource["spec"])
    return found


def _metadata_problems(resource: dict[str, Any]) -> list[str]:
    metadata, kind = resource.get("metadata") or {}, resource["kind"]
    found = [f"metadata.{name}: not set by these manifests"
             for name in sorted(set(metadata) - _METADATA)]  # fmt: skip
    name = metadata.get("name", "")
    if not (0 < len(name) <= 253 and _DNS_NAME.match(name)):
        found.append(f"metadata.name {name!r}: not a DNS subdomain")
    for annotation, value in (metadata.get("annotations") or {}).items():
        allowed = ANNOTATIONS.get(kind, {}).get(annotation)
        if allowed is None or value not in allowed:
            found.append(f"metadata.annotations.{annotation}={value!r}: not documented")
    if kind in NEEDS_CLUSTER_LABEL and CLUSTER_LABEL not in (metadata.get("labels") or {}):
        found.append(f"metadata.labels: {CLUSTER_LABEL} missing")
    return found


def _walk(value: Any, path: str, table: dict[str, Field], found: list[str]) -> None:
    field = table.get(path)
    if field is None:
        found.append(f"{path}: not a documented field")
        return
    problem = _value_problem(value, field)
    if problem:
        found.append(f"{path}: {problem}")
        return
    if field.type == "object":
        found.extend(f"{path}.{name}: required" for name in field.required if name not in value)
        for name, child in value.items():
            _walk(child, f"{path}.{name}", table, found)
    elif field.type == "array":
        for item in value:
            _walk(item, f"{path}[]", table, found)


def _value_problem(value: Any, field: Field) -> str | None:
    """Why `value` cannot be a value of `field` (None: it can)."""
    scalar = (str, int, float, bool)
    checks = {
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "map": isinstance(value, dict) and all(isinstance(v, scalar) for v in value.values()),
        "strings": isinstance(value, dict) and all(isinstance(v, str) for v in value.values()),
    }
    if not checks[field.type]:
        return f"{value!r} is not of type {field.type}"
    if field.values is not None and value not in field.values:
        return f"{value!r} is not one of {sorted(field.values)}"
    if field.minimum is not None and value < field.minimum:
        return f"{value} is below {field.minimum}"
    if field.maximum is not None and value > field.maximum:
        return f"{value} is above {field.maximum}"
    if field.pattern is not None and not re.match(field.pattern, value):
        return f"{value!r} does not match {field.pattern}"
    return None


def _trigger_problems(triggers: list[dict[str, Any]]) -> list[str]:
    found = []
    for trigger in triggers:
        if trigger.get("type") != "kafka":
            found.append(f"trigger type {trigger.get('type')!r}: only kafka is tabled here")
            continue
        metadata = trigger.get("metadata", {})
        for name, value in metadata.items():
            if name not in KAFKA_TRIGGER_METADATA:
                found.append(f"kafka trigger metadata {name}: not a parameter of the scaler")
            elif (allowed := KAFKA_TRIGGER_METADATA[name]) is not None and value not in allowed:
                found.append(f"kafka trigger metadata {name}={value!r}: not one of {allowed}")
        found += [f"kafka trigger metadata {name}: required"
                  for name in KAFKA_TRIGGER_REQUIRED if name not in metadata]  # fmt: skip
    return found


def _parameter_problems(spec: dict[str, Any]) -> list[str]:
    references = [*spec.get("secretTargetRef", []), *spec.get("configMapTargetRef", []),
                  *spec.get("env", [])]  # fmt: skip
    return [
        f"authentication parameter {ref['parameter']!r}: not one the kafka scaler reads"
        for ref in references
        if ref.get("parameter") not in KAFKA_AUTH_PARAMETERS
    ]
