"""`asearcher deploy k8s`: the manifests of the embedded run and of every recipe, read back from
the files written, are valid (core kinds against Kubernetes' schemas, offline; Strimzi and KEDA
resources against their documented fields, `tests/support/k8s_specs.py`) and say what the run's
own sources of truth say: services and counts as `stream up` starts them, topics as `TOPICS`
declares them, users and ACLs as `streams.cluster.acl` provisions them, no secret in the clear.
"""

from __future__ import annotations

import json
import re
import socket
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import kubernetes_validate
import msgspec
import pytest
import yaml
from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType
from typer.testing import CliRunner

from asearcher.cli import app as app_module
from asearcher.cli.deployment.manifests import deploy_k8s
from asearcher.cli.deployment.services import INDEX_SLOT
from asearcher.cli.deployment.target import POD_HOME, slug
from asearcher.cli.run.config import RunConfig, load_run_config, paths, programs, resolve
from asearcher.cli.run.service_kinds import CLI_MODULE
from asearcher.cli.run.topology import run_groups
from asearcher.streams.cluster import acl
from asearcher.streams.cluster.settings import BROKER_FILE, client_options_from_env
from asearcher.streams.wire.topics import TOOL_CALLS, TOPICS
from tests.support.k8s_specs import CUSTOM_RESOURCES, problems

RECIPES = sorted((Path(__file__).parents[1] / "infra" / "recipes").glob("*.toml"))
CONFIGS = [None, *RECIPES]  # None: the embedded run
STORE = "s3://asearcher-test/runs/{}/weights"
# The oldest Kubernetes whose pods carry their StatefulSet ordinal as a label (the rollout
# producers' shares and the trainer's ranks read it), and the newest the package knows.
K8S_VERSIONS = ("1.28.0", kubernetes_validate.latest_version())
WORKLOAD_KINDS = {"Deployment", "StatefulSet"}
SECRET_WORDS = re.compile(r"PASSWORD|SECRET|TOKEN|_KEY$|API_KEY|CREDENTIAL", re.IGNORECASE)


def config_id(path: Path | None) -> str:
    return path.name if path else "embedded"


class Written(msgspec.Struct, frozen=True):
    """What `deploy k8s` wrote for one run, read back from its files."""

    config: RunConfig
    out: Path
    objects: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def named(self, kind: str, name: str) -> dict[str, Any]:
        [found] = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        return found

    def workloads(self) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] in WORKLOAD_KINDS]

    def config_file(self, name: str) -> dict[str, Any]:
        [files] = [
            o for o in self.of_kind("ConfigMap") if o["metadata"]["name"].endswith("-config")
        ]
        return json.loads(files["data"][name])


def write(config: RunConfig, out: Path, **options: Any) -> Written:
    deploy_k8s(config, out, **options)
    objects = [
        document
        for path in sorted(out.glob("*.yaml"))
        for document in yaml.safe_load_all(path.read_text())
        if document is not None
    ]
    return Written(config, out, objects)


@pytest.fixture(scope="module", params=CONFIGS, ids=config_id)
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Written:
    config = load_run_config(request.param)
    out = tmp_path_factory.mktemp(f"deploy-{config_id(request.param)}")
    return write(config, out, store=STORE.format(config.name), namespace="asearcher-test")


def container(workload: dict[str, Any]) -> dict[str, Any]:
    [found] = workload["spec"]["template"]["spec"]["containers"]
    return found


def env_of(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in container(workload)["env"]}


def component(workload: dict[str, Any]) -> str:
    return workload["metadata"]["labels"]["app.kubernetes.io/component"]


def stream_up_programs(config: RunConfig, home: Path) -> dict[str, list[str]]:
    """`stream up`'s programs (name -> command) with `home` as the state directory."""
    where = paths(config, home)
    return {p.name: p.command for p in programs(config, resolve(config, where), where)}


# -- validity --------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_core_object_is_valid_against_the_kubernetes_schema(
    written: Written, version: str
) -> None:
    core = [o for o in written.objects if (o["apiVersion"], o["kind"]) not in CUSTOM_RESOURCES]
    assert {"StatefulSet", "Service", "ConfigMap", "PersistentVolumeClaim"} <= {
        o["kind"] for o in core
    }
    for resource in core:
        kubernetes_validate.validate(resource, version, strict=True)


def test_every_custom_resource_has_only_documented_fields(written: Written) -> None:
    custom = [o for o in written.objects if (o["apiVersion"], o["kind"]) in CUSTOM_RESOURCES]
    assert {o["kind"] for o in custom} >= {"Kafka", "KafkaNodePool", "KafkaTopic", "KafkaUser"}
    assert {o["kind"]: problems(o) for o in custom if problems(o)} == {}


def test_the_schema_check_is_strict_and_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """An invented field of a core kind is an error (strict), found with no network at all."""

    def no_network(*args: object) -> None:
        raise AssertionError("the schema check tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "replicaz": 1,
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
        },
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        (
            ("spec", "authorization", "acls", 0, "resource", "patterntype"),
            "literal",
            "patterntype: not a documented field",
        ),
        (("spec", "authorization", "acls", 0, "operations"), ["Raed"], "not one of"),
        (("spec", "authentication", "type"), "scram-sha-256", "not one of"),
        (("spec", "quota"), {}, "spec.quota: not a documented field"),
    ],
)
def test_a_misspelled_or_invented_custom_field_is_a_problem(
    written: Written, path: tuple[Any, ...], value: Any, problem: str
) -> None:
    user = json.loads(json.dumps(written.of_kind("KafkaUser")[0]))
    assert problems(user) == []
    holder = user
    for step in path[:-1]:
        holder = holder[step]
    holder[path[-1]] = value
    assert any(problem in found for found in problems(user)), problems(user)


def test_a_wrong_kafka_trigger_parameter_is_a_problem(written: Written) -> None:
    scaled = json.loads(json.dumps(written.of_kind("ScaledObject")[0]))
    scaled["spec"]["triggers"][0]["metadata"]["consumergroup"] = "x"
    del scaled["spec"]["triggers"][0]["metadata"]["consumerGroup"]
    assert any("consumergroup" in found for found in problems(scaled))
    assert any("consumerGroup: required" in found for found in problems(scaled))


# -- the run's services ----------------------------------------------------------------------


def test_one_workload_per_service_kind_with_stream_ups_counts(
    written: Written, tmp_path: Path
) -> None:
    started = Counter(
        name.rpartition("-")[0] if name[-1].isdigit() else name
        for name in stream_up_programs(written.config, tmp_path)
    )
    workloads = written.workloads()
    assert Counter(component(w) for w in workloads) == Counter(set(started))
    for workload in workloads:
        kind = component(workload)
        expected = written.config.trainer.processes if kind == "trainer" else started[kind]
        assert workload["spec"]["replicas"] == expected, kind


def test_each_replica_runs_stream_ups_command_with_its_ordinal(
    written: Written, tmp_path: Path
) -> None:
    """Pod i's command, $(POD_INDEX) = i, is `stream up`'s for replica i, moved into the pod:
    the image's `asearcher` for this interpreter, the pod's home for this one."""
    interpreter = [sys.executable, "-m", CLI_MODULE]
    by_kind = {component(w): container(w)["command"] for w in written.workloads()}
    for name, command in stream_up_programs(written.config, tmp_path).items():
        kind, _, index = name.rpartition("-") if name[-1].isdigit() else (name, "", "0")
        if kind == "trainer" and written.config.trainer.processes > 1:
            continue  # DeepSpeed's launcher: each pod is one of its ranks (the next test)
        assert command[:3] == interpreter
        expected = ["asearcher", *(a.replace(str(tmp_path), str(POD_HOME)) for a in command[3:])]
        pod = [arg.replace(INDEX_SLOT, index) for arg in by_kind[kind]]
        assert pod == expected, name


def test_the_trainer_is_one_rank_per_pod_meeting_at_rank_zero(written: Written) -> None:
    ranks = written.config.trainer.processes
    trainers = [w for w in written.workloads() if component(w) == "trainer"]
    if ranks == 0:
        assert trainers == []
        return
    [trainer] = trainers
    name = trainer["metadata"]["name"]
    assert trainer["kind"] == "StatefulSet" and trainer["spec"]["replicas"] == ranks
    command = container(trainer)["command"]
    assert command[command.index("--log-level") + 2 :][:3] == ["train", "serve", "-c"]
    env = env_of(trainer)
    if ranks == 1:
        assert "WORLD_SIZE" not in env  # one process: the trainer makes its own world
        return
    headless = written.named("Service", trainer["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert env["WORLD_SIZE"]["value"] == str(ranks)
    assert env["MASTER_ADDR"]["value"] == f"{name}-0.{headless['metadata']['name']}"
    assert env["MASTER_PORT"]["value"] == str(written.config.trainer.master_port)
    assert env["LOCAL_RANK"]["value"] == "0"
    label = env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert label == "metadata.labels['apps.kubernetes.io/pod-index']"


def test_gpus_go_where_vllm_runs(written: Written) -> None:
    config = written.config
    engines = {
        "rollout": config.rollout.engine,
        "evaluator": config.eval.engine or config.rollout.engine,
    }
    gpu_run = "vllm" in engines.values()
    for workload in written.workloads():
        kind = component(workload)
        limits = container(workload)["resources"].get("limits", {})
        expected = gpu_run if kind == "trainer" else engines.get(kind) == "vllm"
        assert limits.get("nvidia.com/gpu", 0) == int(expected), kind


def test_the_configs_are_the_resolved_ones_where_the_commands_read_them(written: Written) -> None:
    config = written.config
    for workload in written.workloads():
        command = container(workload)["command"]
        if "-c" not in command:
            continue
        path = Path(command[command.index("-c") + 1])
        mounts = {m["name"]: m["mountPath"] for m in container(workload)["volumeMounts"]}
        assert str(path.parent) == mounts["config"]
        name = path.name.replace(INDEX_SLOT, "0")
        assert written.config_file(name)  # the ConfigMap holds it
    [files] = [o for o in written.of_kind("ConfigMap") if o["metadata"]["name"].endswith("-config")]
    assert len(json.dumps(files)) < 1024 * 1024  # what a ConfigMap may hold
    for index in range(config.rollout.replicas):
        staleness = written.config_file(f"rollout-{index}.json")["staleness"]
        assert (staleness["producer_index"], staleness["producers"]) == (
            index,
            config.rollout.replicas,
        )
        assert written.config_file(f"rollout-{index}.json")["store"] == STORE.format(config.name)


# -- Kafka -----------------------------------------------------------------------------------


def test_the_topics_are_TOPICS_with_their_partitions_on_three_replicas(written: Written) -> None:
    topics = {t["spec"]["topicName"]: t["spec"] for t in written.of_kind("KafkaTopic")}
    assert {name: spec["partitions"] for name, spec in topics.items()} == {
        spec.name: spec.partitions for spec in TOPICS
    }
    for spec in TOPICS:
        assert topics[spec.name]["replicas"] == 3
        assert topics[spec.name]["config"] == spec.broker_config(3)
        assert topics[spec.name]["config"]["min.insync.replicas"] == "2"


def test_the_cluster_is_kraft_with_scram_and_acls_on_three_nodes(written: Written) -> None:
    [kafka], [pool] = written.of_kind("Kafka"), written.of_kind("KafkaNodePool")
    annotations = kafka["metadata"]["annotations"]
    assert annotations == {"strimzi.io/kraft": "enabled", "strimzi.io/node-pools": "enabled"}
    [listener] = kafka["spec"]["kafka"]["listeners"]
    assert listener["authentication"] == {"type": "scram-sha-512"} and listener["port"] == 9093
    assert kafka["spec"]["kafka"]["authorization"]["type"] == "simple"
    config = kafka["spec"]["kafka"]["config"]
    assert config["offsets.topic.replication.factor"] == 3
    assert config["transaction.state.log.replication.factor"] == 3
    assert config["transaction.state.log.min.isr"] == config["min.insync.replicas"] == 2
    assert pool["spec"]["replicas"] == 3 and set(pool["spec"]["roles"]) == {"broker", "controller"}
    cluster = kafka["metadata"]["name"]
    assert pool["metadata"]["labels"]["strimzi.io/cluster"] == cluster
    for workload in written.workloads():
        assert env_of(workload)["ASEARCHER_BOOTSTRAP_SERVERS"]["value"] == (
            f"{cluster}-kafka-bootstrap:9093"
        )


def _binding_rows(bindings: list) -> set[tuple[str, str, str, str, str]]:
    return {
        (
            b.principal.removeprefix("User:"),
            b.restype.name,
            b.name,
            b.resource_pattern_type.name,
            b.operation.name,
        )
        for b in bindings
    }


def _strimzi_rows(user: dict[str, Any]) -> set[tuple[str, str, str, str, str]]:
    types = {
        "topic": ResourceType.TOPIC,
        "group": ResourceType.GROUP,
        "transactionalId": ResourceType.TRANSACTIONAL_ID,
    }
    patterns = {"literal": ResourcePatternType.LITERAL, "prefix": ResourcePatternType.PREFIXED}
    rows = set()
    for rule in user["spec"]["authorization"]["acls"]:
        assert rule.get("type", "allow") == "allow" and rule.get("host", "*") == "*"
        resource = rule["resource"]
        for operation in rule["operations"]:
            pattern = patterns[resource["patternType"]].name
            row = (resource["name"], pattern, AclOperation[operation.upper()].name)
            rows.add((user["metadata"]["name"], types[resource["type"]].name, *row))
    return rows


def test_the_users_are_the_principals_with_the_acls_acl_provisions(written: Written) -> None:
    users = written.of_kind("KafkaUser")
    assert sorted(u["metadata"]["name"] for u in users) == sorted(acl.SERVICE_PRINCIPALS)
    assert all(u["spec"]["authentication"] == {"type": "scram-sha-512"} for u in users)
    provisioned = acl.acl_bindings(acl.role_grants(run_groups(written.config.name)))
    assert set().union(*map(_strimzi_rows, users)) == _binding_rows(provisioned)
    # The run's own groups are in them.
    rollout = written.named("KafkaUser", acl.ROLLOUT)
    groups = {
        r["resource"]["name"]
        for r in rollout["spec"]["authorization"]["acls"]
        if r["resource"]["type"] == "group"
    }
    assert f"asearcher-{written.config.name}-rollout" in groups


def test_each_service_logs_in_as_its_principal_from_strimzis_secret(written: Written) -> None:
    from asearcher.cli.run.topology import principal_of

    for workload in written.workloads():
        env = env_of(workload)
        kind = component(workload)
        program = kind if kind in ("trainer", "feeder") else f"{kind}-0"
        principal = principal_of(program)  # every kind has one: evaluators log in as rollout
        password = env["ASEARCHER_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert (password["name"], password["key"]) == (principal, "password")
        settings = {name: entry.get("value", "<secret>") for name, entry in env.items()}
        assert client_options_from_env(settings) == acl.client_options(principal, "<secret>")


# -- scaling ---------------------------------------------------------------------------------


def test_scaled_objects_follow_the_groups_and_topics_their_pods_consume(written: Written) -> None:
    scaled = {s["spec"]["scaleTargetRef"]["name"]: s for s in written.of_kind("ScaledObject")}
    kinds = {component(w): w for w in written.workloads()}
    expected_kinds = {"tools", "rollout", "evaluator"} & set(kinds)
    assert {component(written.named("StatefulSet", name)) for name in scaled} == expected_kinds
    for name, scaled_object in scaled.items():
        workload = written.named("StatefulSet", name)
        [trigger] = scaled_object["spec"]["triggers"]
        metadata = trigger["metadata"]
        command = container(workload)["command"]
        if component(workload) == "tools":
            group, topic = command[command.index("--group") + 1], TOOL_CALLS
        else:
            file = Path(command[command.index("-c") + 1]).name.replace(INDEX_SLOT, "0")
            consumer = written.config_file(file)
            group, topic = consumer["group_id"], consumer["topics"]["requests"]
        assert (trigger["type"], metadata["consumerGroup"], metadata["topic"]) == (
            "kafka",
            group,
            topic,
        )
        bootstrap = env_of(workload)["ASEARCHER_BOOTSTRAP_SERVERS"]["value"]
        assert metadata["bootstrapServers"] == bootstrap
        auth = written.named("TriggerAuthentication", trigger["authenticationRef"]["name"])
        [password] = auth["spec"]["secretTargetRef"]
        assert (password["parameter"], password["name"], password["key"]) == (
            "password",
            acl.READER,
            "password",
        )


def test_producers_run_all_or_none_never_past_their_shares(written: Written) -> None:
    rollout = [
        s
        for s in written.of_kind("ScaledObject")
        if s["spec"]["scaleTargetRef"]["name"].endswith("-rollout")
    ]
    [producers] = rollout
    replicas = written.config.rollout.replicas
    spec = producers["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["idleReplicaCount"]) == (
        replicas,
        replicas,
        0,
    )
    text = (written.out / "40-scaling.yaml").read_text()
    assert "staleness" in text and "rollout.replicas" in text  # the why, for the reader


# -- secrets ---------------------------------------------------------------------------------


def test_no_secret_reaches_a_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's environment and a secure local broker's credentials are at hand while
    the manifests are written; none of it appears, and every secret-like variable is a
    reference to a Secret."""
    home = tmp_path / "home"
    passwords = acl.ensure_credentials(home, [acl.ADMIN, *acl.SERVICE_PRINCIPALS])
    (home / BROKER_FILE).write_text(json.dumps({"secure": True}))
    canaries = {
        "ASEARCHER_KAFKA_SASL_PASSWORD": "canary-kafka-password",
        "AWS_SECRET_ACCESS_KEY": "canary-aws-secret",
        "ASEARCHER_WEIGHTS_KEY": "canary-weights-key",
        "SERPER_API_KEY": "canary-serper",
    }
    monkeypatch.setenv("ASEARCHER_HOME", str(home))
    for name, value in canaries.items():
        monkeypatch.setenv(name, value)
    recipe = load_run_config(RECIPES[0].with_name("qwen2.5-7b-web.toml"))
    out = tmp_path / "out"
    written = write(recipe, out, store=STORE.format("x"))
    text = "".join(path.read_text() for path in out.iterdir())
    for secret in [*passwords.values(), *canaries.values()]:
        assert secret not in text
    for workload in written.workloads():
        for name, entry in env_of(workload).items():
            if SECRET_WORDS.search(name):
                assert "value" not in entry and "secretKeyRef" in entry["valueFrom"], name
        # API keys (SERPER_API_KEY...) come from a Secret of the user's.
        api_keys = {"secretRef": {"name": f"asearcher-{slug(recipe.name)}-env", "optional": True}}
        assert api_keys in container(workload)["envFrom"]


# -- refusals, names, the image, the command -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "store is unset"),
        (["--store", "file:///tmp/weights"], "--store is file:///tmp/weights"),
        (["--store", "s3://bucket"], "name a prefix inside the bucket"),
    ],
)
def test_a_store_the_cluster_cannot_share_is_refused_in_one_line(
    args: list[str],
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["asearcher", "deploy", "k8s", "--out", str(out), *args])
    with pytest.raises(SystemExit) as exit_:
        app_module.main()
    error = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in error
    [line] = error.strip().splitlines()
    assert line.startswith("asearcher: error: ") and says in line
    assert not out.exists()  # nothing half-written


def test_claims_go_beside_the_store_unless_the_run_names_a_shared_store(tmp_path: Path) -> None:
    beside = write(RunConfig(), tmp_path / "a", store="s3://b/runs/x/weights")
    named = write(RunConfig(claims="s3://c/claims"), tmp_path / "b", store="s3://b/w")
    for written, claims in ((beside, "s3://b/runs/x/claims"), (named, "s3://c/claims")):
        for workload in written.workloads():
            assert env_of(workload)["ASEARCHER_CLAIMS_URL"]["value"] == claims
    with pytest.raises(ValueError, match="claims is file:///tmp/c: a cluster needs a shared"):
        deploy_k8s(RunConfig(claims="file:///tmp/c"), tmp_path / "c", store="s3://b/w")


def test_a_long_run_name_gives_names_kubernetes_accepts(tmp_path: Path) -> None:
    config = RunConfig(name="An_Unusually_Long_Experiment_Name_For_A_Run_Of_Qwen_7B")
    written = write(config, tmp_path, store=STORE.format("long"))
    for resource in written.objects:
        name = resource["metadata"]["name"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name
        # A StatefulSet's pods get a revision label of its name plus 11 characters.
        assert len(name) <= (52 if resource["kind"] == "StatefulSet" else 63), name
    other = write(
        msgspec.structs.replace(config, name=config.name + "2"),
        tmp_path / "b",
        store=STORE.format("long"),
    )
    assert {o["metadata"]["name"] for o in other.workloads()}.isdisjoint(
        {o["metadata"]["name"] for o in written.workloads()}
    )  # two runs, two sets of names


def test_the_dockerfile_installs_the_gpu_and_s3_extras_on_cuda(written: Written) -> None:
    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    text = (written.out / "Dockerfile").read_text()
    assert re.search(r"^FROM nvidia/cuda:\S+", text, re.MULTILINE)
    [installed] = re.findall(r'pip install [^\n]*"/src/asearcher\[([a-z0-9,]+)\]"', text)
    assert set(installed.split(",")) == {"vllm", "s3"}
    assert any(d.startswith("vllm") for d in extras["vllm"])
    assert any(d.startswith("s3fs") for d in extras["s3"])
    ignored = (written.out / "Dockerfile.dockerignore").read_text().split()
    assert ".venv" in ignored


def test_the_command_writes_the_files_and_says_what_is_in_them(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app_module.app,
        ["deploy", "k8s", "--out", str(tmp_path), "--store", STORE.format("default")],
        terminal_width=200,
    )
    assert result.exit_code == 0, result.output
    for file in ("10-kafka.yaml", "11-topics.yaml", "12-users.yaml", "30-services.yaml"):
        assert file in result.output and (tmp_path / file).is_file()
    assert f"KafkaTopic x{len(TOPICS)}" in result.output
    assert "no principal" not in result.output  # every service of the run can log in
