"""Where a run is deployed: the names its objects take, the shared stores, the pods' layout.

Kubernetes names are DNS labels, a run's name need not be one: every object of a run is named
`asearcher-<slug>-...`, the slug being the run's name in lower case and short enough that a
StatefulSet's pods and its revision label stay within 63 characters.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import msgspec

from asearcher.cli.run.config import RunConfig

# Inside every pod: ASEARCHER_HOME, on the run's shared volume (the built world, index, policy,
# tool results and TensorBoard files live there, as they do under <home> on one machine).
POD_HOME = Path("/var/lib/asearcher")
# The cluster's only client listener: SCRAM logins, no TLS, because the faust apps' client
# (aiokafka) is used with PLAINTEXT or SASL_PLAINTEXT only (streams/service/faust_app.py).
LISTENER_NAME = "scram"
LISTENER_PORT = 9093
DEFAULT_IMAGE = "asearcher:latest"
_SLUG_MAX = 27  # "asearcher-" + slug + "-eval-processor" leaves a StatefulSet name under 52
_NOT_IN_LABEL = re.compile(r"[^a-z0-9-]+")


class Target(msgspec.Struct, frozen=True, kw_only=True):
    """A run as it will run on the cluster: its config (weight store on s3), names, image."""

    config: RunConfig  # its `store` and `claims` are these
    store: str  # the weight store every pod reads and the trainer writes
    claims: str  # the claim-check store, under the same credentials
    image: str = DEFAULT_IMAGE
    namespace: str | None = None

    @property
    def base(self) -> str:
        """The prefix of every object of this run."""
        return f"asearcher-{slug(self.config.name)}"

    @property
    def cluster(self) -> str:
        """The Strimzi `Kafka` resource's name (Strimzi names its services after it)."""
        return self.base

    @property
    def bootstrap(self) -> str:
        """The bootstrap service Strimzi creates for the cluster's client listener."""
        return f"{self.cluster}-kafka-bootstrap:{LISTENER_PORT}"

    @property
    def s3_secret(self) -> str:
        """The Secret the user creates with the object store's credentials."""
        return f"{self.base}-s3"

    @property
    def env_secret(self) -> str:
        """An optional Secret whose keys every service gets as variables (API keys)."""
        return f"{self.base}-env"

    @property
    def weights_key_secret(self) -> str:
        """An optional Secret holding the key that signs weight manifests."""
        return f"{self.base}-weights-key"

    def metadata(self, name: str, labels: dict[str, str] | None = None) -> dict[str, object]:
        """An object's metadata: its name, the run's labels, the namespace if one was given."""
        meta: dict[str, object] = {"name": name}
        if self.namespace:
            meta["namespace"] = self.namespace
        meta["labels"] = {"app.kubernetes.io/part-of": self.base, **(labels or {})}
        return meta


def slug(name: str) -> str:
    """A run's name as part of a DNS label: lower case, '-' for '_', a hash when too long."""
    text = _NOT_IN_LABEL.sub("-", name.lower()).strip("-") or "run"
    if len(text) <= _SLUG_MAX:
        return text
    digest = hashlib.sha256(name.encode()).hexdigest()[:6]
    return f"{text[: _SLUG_MAX - 7].rstrip('-')}-{digest}"


def claims_url(store: str) -> str:
    """The claim-check store beside weight store `store` (`s3://b/run/weights` gives
    `s3://b/run/claims`): never inside it, where the weight store's scan would list it."""
    root, _, last = store.rstrip("/").rpartition("/")
    if root.endswith(":/") or not last:
        raise ValueError(
            f"store {store}: name a prefix inside the bucket (s3://bucket/<run>/weights); "
            "the claim checks go beside it"
        )
    return f"{root}/claims"


def target(
    config: RunConfig, store: str | None = None, image: str = DEFAULT_IMAGE,
    namespace: str | None = None,
) -> Target:  # fmt: skip
    """The run deployed with weight store `store` (default: the run config's) and the run
    config's claim-check store (default: beside the weight store), both `s3://`: every pod on
    every node reads them. ValueError otherwise."""
    chosen = store or config.store
    if not chosen or not chosen.startswith("s3://"):
        where = "--store" if store else "store"
        raise ValueError(
            f"{where} is {chosen or 'unset (a directory on one machine)'}: a cluster needs a "
            'shared weight store, set store = "s3://..." in the run config or pass '
            "--store s3://..."
        )
    claims = config.claims or claims_url(chosen)
    if not claims.startswith("s3://"):
        raise ValueError(
            f"claims is {claims}: a cluster needs a shared claim-check store (s3://...), or "
            "none set (it then goes beside the weight store)"
        )
    return Target(
        config=msgspec.structs.replace(config, store=chosen, claims=claims),
        store=chosen, claims=claims, image=image, namespace=namespace,
    )  # fmt: skip
