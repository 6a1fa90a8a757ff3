"""`deploy k8s`: every manifest of a run, written as a few files, one per concern.

Files are numbered in the order `kubectl apply -f DIR` should meet them: the namespace, the
Kafka cluster and what it serves, the shared volume and configs, the services, their scaling.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import msgspec

from asearcher.cli.deployment import image, kafka_resources, scaling, workloads
from asearcher.cli.deployment.documents import Document, render
from asearcher.cli.deployment.services import RunServices, run_services
from asearcher.cli.deployment.target import DEFAULT_IMAGE, POD_HOME, Target, target
from asearcher.cli.run.config import RunConfig

NAMESPACE_FILE = "00-namespace.yaml"
DOCKERFILE = "Dockerfile"


class ManifestFile(msgspec.Struct, frozen=True):
    """One file of the output and the objects in it."""

    name: str
    documents: list[Document]

    def kinds(self) -> dict[str, int]:
        """How many objects of each kind the file holds."""
        return dict(Counter(document.kind for document in self.documents))


class Deployment(msgspec.Struct, frozen=True, kw_only=True):
    """What `deploy k8s` wrote, and what a user must still do or know."""

    files: list[ManifestFile]
    other_files: list[str]  # the image's
    notes: list[str]


def deploy_k8s(
    config: RunConfig, out: Path, store: str | None = None,
    image_name: str = DEFAULT_IMAGE, namespace: str | None = None,
) -> Deployment:  # fmt: skip
    """Write the run's manifests and the image's Dockerfile into `out`. ValueError when the
    run cannot be deployed (no shared store, a run that does not resolve)."""
    chosen = target(config, store, image_name, namespace)
    run = run_services(chosen.config, POD_HOME)
    files = manifest_files(chosen, run)
    out.mkdir(parents=True, exist_ok=True)
    for manifest in files:
        (out / manifest.name).write_text(render(manifest.documents))
    if namespace is None:
        (out / NAMESPACE_FILE).unlink(missing_ok=True)  # an earlier run's, now wrong
    (out / DOCKERFILE).write_text(image.dockerfile())
    (out / f"{DOCKERFILE}.dockerignore").write_text(image.dockerignore())
    return Deployment(
        files=files,
        other_files=[DOCKERFILE, f"{DOCKERFILE}.dockerignore"],
        notes=notes(chosen, run),
    )


def manifest_files(chosen: Target, run: RunServices) -> list[ManifestFile]:
    """Every manifest of the run, by file."""
    files = [
        ManifestFile("10-kafka.yaml", kafka_resources.cluster(chosen)),
        ManifestFile("11-topics.yaml", kafka_resources.topics(chosen)),
        ManifestFile("12-users.yaml", kafka_resources.users(chosen)),
        ManifestFile(
            "20-storage.yaml", [workloads.home_volume(chosen), workloads.config_map(chosen, run)]
        ),
        ManifestFile("30-services.yaml", workloads.workloads(chosen, run)),
        ManifestFile("40-scaling.yaml", scaling.scaling_objects(chosen, run)),
    ]
    if chosen.namespace:
        namespace = {"name": chosen.namespace}
        document = Document({"apiVersion": "v1", "kind": "Namespace", "metadata": namespace})
        files.insert(0, ManifestFile(NAMESPACE_FILE, [document]))
    return [manifest for manifest in files if manifest.documents]


def notes(chosen: Target, run: RunServices) -> list[str]:
    """What the manifests leave to the user: Secrets to create, data to provide, gaps."""
    found = [
        f"create Secret {chosen.s3_secret} (keys access-key-id, secret-access-key; optional "
        f"endpoint-url, region) for {chosen.store} and {chosen.claims}",
        f"build the image from the repository: docker build -f <out>/{DOCKERFILE} "
        f"-t {chosen.image} .",
    ]
    where = run.where
    read = {str(path) for path in (where.model_dir, where.qa, where.index_dir, where.world_dir)}
    outside = sorted(path for path in read if not Path(path).is_relative_to(POD_HOME))
    if outside:
        found.append(f"every pod needs {', '.join(outside)} (outside {POD_HOME}): mount them or "
                     "put them in the image")  # fmt: skip
    if inside := sorted(set(read) - set(outside)):
        found.append(f"nothing builds {', '.join(inside)} on the cluster (`stream up` does on one "
                     f"machine): fill the volume {chosen.base}-home with them first")  # fmt: skip
    if chosen.config.warm_start.enabled:
        found.append("warm_start is not run on the cluster: run it with `stream up` first, or "
                     "clone a version with `asearcher sft`")  # fmt: skip
    unlogged = [service.kind for service in run.services if service.principal is None]
    if unlogged:
        found.append(f"{', '.join(unlogged)}: no principal in streams/cluster/acl.py, so the "
                     "cluster's ACLs refuse them (as `stream up --secure` does)")  # fmt: skip
    return found
