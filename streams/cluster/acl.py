"""Who may do what on the cluster: one SCRAM principal per service kind, least-rights ACLs.

`role_grants` is the one table of rights (principal x topic / group / transactional id x
operations); `provision` creates the SCRAM users and the ACL bindings through the Admin API with
any `KafkaSettings` that carry admin rights, so the same rights apply to the local broker
(`stream up --secure`) and to an external cluster. Credentials live in files of librdkafka
`key=value` settings (mode 0600), one per principal; a service finds its own through
`$ASEARCHER_CREDENTIALS_FILE`, so no password reaches a config file, a command line or a log.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from asearcher.streams.cluster.settings import BROKER_FILE, KafkaSettings, SettingsError
from asearcher.streams.service.log import get_logger
from asearcher.streams.wire.topics import (
    DEAD_LETTERS,
    EVAL_REQUESTS,
    EVAL_RESULTS,
    EVAL_TRAJECTORIES,
    FEEDER_PROGRESS,
    REQUESTS_PLAYED,
    ROLLOUT_REQUESTS,
    ROLLOUT_STEPS,
    SERVICE_STATUS,
    SYNTH_ACCEPTED,
    SYNTH_CANDIDATES,
    SYNTH_REJECTED,
    SYNTH_REQUESTS,
    TOOL_CALLS,
    TOOL_RESULTS,
    TRAINER_METRICS,
    TRAJECTORIES,
    WEIGHTS,
)

log = get_logger(__name__)

ENV_CREDENTIALS = "ASEARCHER_CREDENTIALS_FILE"
MECHANISM = "SCRAM-SHA-512"
PROTOCOL = "SASL_PLAINTEXT"
SCRAM_ITERATIONS = 8192
ADMIN = "admin"
TRAINER, ROLLOUT, TOOLS, FEEDER, READER = "trainer", "rollout", "tools", "feeder", "reader"
PROCESSOR, SYNTH = "processor", "synth"  # the stream processors: evaluation and metrics; synthesis
SERVICE_PRINCIPALS = (TRAINER, ROLLOUT, TOOLS, FEEDER, READER, PROCESSOR, SYNTH)
# The client settings a credentials file holds; a service must never inherit another's.
CREDENTIAL_KEYS = (
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
)
ADMIN_TIMEOUT_S = 30.0

Resource = Literal["topic", "group", "transactional_id"]
Operation = Literal["read", "write", "describe", "create"]
_RESOURCE_TYPES = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "transactional_id": ResourceType.TRANSACTIONAL_ID,
}
_OPERATIONS = {
    "read": AclOperation.READ,
    "write": AclOperation.WRITE,
    "describe": AclOperation.DESCRIBE,
    "create": AclOperation.CREATE,
}


class Grant(msgspec.Struct, frozen=True):
    """Allow `operations` on one resource: a name, a name prefix, or every name ("*")."""

    resource: Resource
    name: str
    operations: tuple[Operation, ...]
    prefixed: bool = False


class ServiceGroups(msgspec.Struct, frozen=True, kw_only=True):
    """The consumer groups each service kind joins (a run's: `cli.run_config.groups`)."""

    trainer: tuple[str, ...] = ()
    rollout: tuple[str, ...] = ()  # the producers' group and the evaluators'
    tools: tuple[str, ...] = ()
    # Stream processors by app id: each is its group, and the prefix of its transactional ids
    # (and, for faust apps, of the changelog and assignor topics they create).
    processors: tuple[str, ...] = ()
    synth: tuple[str, ...] = ()


def _topics(operations: tuple[Operation, ...], *names: str) -> list[Grant]:
    grants = [Grant("topic", name, operations) for name in names]
    if "read" in operations:
        # Readers outside any group (`streams.tail`) still name one, `tail-<topic>` or
        # `read-<topic>`, and librdkafka looks up its coordinator: without DESCRIBE on it that
        # lookup fails, and a read-to-end would take the error for the end of the topic.
        grants += [Grant("group", f"{kind}-{name}", ("describe",)) for name in names
                   for kind in ("tail", "read")]  # fmt: skip
    return grants


def _groups(names: Iterable[str]) -> list[Grant]:
    # READ on a group lets a member join it and commit, also inside a transaction.
    return [Grant("group", name, ("read",)) for name in names]


def _transactions(prefix: str) -> list[Grant]:
    # WRITE on a transactional id implies DESCRIBE; WRITE on any topic already allows an
    # idempotent producer (KIP-679), so no cluster-wide IdempotentWrite is granted.
    return [Grant("transactional_id", prefix, ("write",), prefixed=True)]


def _apps(app_ids: Iterable[str]) -> list[Grant]:
    """A stream processor's own resources: its group, its transactional ids, and the topics a
    faust app creates for itself (`<app id>-<table>-changelog`, `<app id>-__assignor-__leader`)."""
    return [
        grant
        for app_id in app_ids
        for grant in (
            Grant("group", app_id, ("read",)),
            Grant("transactional_id", f"{app_id}-", ("write",), prefixed=True),
            Grant("topic", f"{app_id}-", ("create", "read", "write"), prefixed=True),
        )
    ]


def role_grants(groups: ServiceGroups | None = None) -> dict[str, list[Grant]]:
    """Every service principal's rights. Each one also writes `dead.letters`: its decoder sets
    undecodable records aside there, whatever topic it reads."""
    groups = groups or ServiceGroups()
    read, write = ("read",), ("write",)
    return {
        TRAINER: [
            *_topics(read, TRAJECTORIES),
            # It reads the weights topic too: the last announced version is where it resumes.
            *_topics(("read", "write"), WEIGHTS),
            *_topics(write, TRAINER_METRICS, SERVICE_STATUS, DEAD_LETTERS),
            *_groups(groups.trainer),
            *_transactions("trainer-"),
        ],
        # Producers, and evaluators: the same service playing evaluation requests.
        ROLLOUT: [
            *_topics(read, ROLLOUT_REQUESTS, EVAL_REQUESTS, TOOL_RESULTS, WEIGHTS, TRAINER_METRICS),
            *_topics(
                write,
                ROLLOUT_STEPS,
                TOOL_CALLS,
                TRAJECTORIES,
                EVAL_TRAJECTORIES,
                SERVICE_STATUS,
                DEAD_LETTERS,
            ),  # fmt: skip
            # Its markers of played requests, reloaded when it takes a partition over.
            *_topics(("read", "write"), REQUESTS_PLAYED),
            *_groups(groups.rollout),
            *_transactions("rollout-"),
        ],
        TOOLS: [
            *_topics(read, TOOL_CALLS),
            *_topics(write, TOOL_RESULTS, DEAD_LETTERS),
            *_groups(groups.tools),
        ],
        FEEDER: [
            *_topics(read, TRAJECTORIES),
            *_topics(write, ROLLOUT_REQUESTS, SERVICE_STATUS),
            # It resumes from its own progress records and counts dead letters as finished.
            *_topics(("read", "write"), FEEDER_PROGRESS, DEAD_LETTERS),
            *_transactions("feeder-"),
        ],
        # The evaluation processor (it also requests continuous evaluations) and the metrics
        # processor.
        PROCESSOR: [
            *_topics(read, EVAL_TRAJECTORIES, WEIGHTS, TRAINER_METRICS),
            *_topics(("read", "write"), EVAL_REQUESTS, EVAL_RESULTS),
            *_topics(write, SERVICE_STATUS, DEAD_LETTERS),
            *_apps(groups.processors),
        ],
        SYNTH: [
            *_topics(read, SYNTH_REQUESTS, TOOL_RESULTS),
            *_topics(("read", "write"), REQUESTS_PLAYED),
            *_topics(
                write,
                SYNTH_CANDIDATES,
                SYNTH_ACCEPTED,
                SYNTH_REJECTED,
                TOOL_CALLS,
                SERVICE_STATUS,
                DEAD_LETTERS,
            ),  # fmt: skip
            *_apps(groups.synth),
        ],
        READER: [
            Grant("topic", "*", read),
            # DESCRIBE lists and describes every group and fetches its committed offsets (lag).
            Grant("group", "*", ("describe",)),
        ],
    }


def acl_bindings(grants: Mapping[str, list[Grant]], prefix: str = "") -> list[AclBinding]:
    """The Admin API bindings for `grants`, principal `User:<prefix><name>`, from any host."""
    return [
        AclBinding(
            _RESOURCE_TYPES[grant.resource],
            grant.name,
            ResourcePatternType.PREFIXED if grant.prefixed else ResourcePatternType.LITERAL,
            f"User:{prefix}{name}",
            "*",
            _OPERATIONS[operation],
            AclPermissionType.ALLOW,
        )
        for name, role in grants.items()
        for grant in role
        for operation in grant.operations
    ]


# -- credentials files ---------------------------------------------------------------------


def new_password() -> str:
    """A random password of URL-safe characters (nothing the storage tool's parser quotes)."""
    return secrets.token_urlsafe(24)


def client_options(username: str, password: str) -> dict[str, str]:
    """The librdkafka settings that authenticate as `username`."""
    return {
        "security.protocol": PROTOCOL,
        "sasl.mechanism": MECHANISM,
        "sasl.username": username,
        "sasl.password": password,
    }


def write_credentials(path: Path, options: Mapping[str, str]) -> None:
    """Write client settings to `path`, readable by its owner only from the first byte on."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write("".join(f"{key}={value}\n" for key, value in options.items()))
    path.chmod(0o600)  # O_CREAT's mode does not apply to a file that existed


def read_credentials(path: Path) -> dict[str, str]:
    """The `key=value` client settings in `path` (blank lines and `#` comments skipped)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SettingsError(f"credentials file {path} cannot be read: {exc.strerror}") from exc
    if path.stat().st_mode & 0o077:
        log.warning("credentials file %s is readable by others: chmod 600 it", path)
    options: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            # Never echo the line: it may hold a password.
            raise SettingsError(f"credentials file {path}, line {number}: expected key=value")
        options[key.strip()] = value.strip()
    return options


def credentials_dir(home: Path) -> Path:
    """Where the local broker's principals keep their credentials (purged with its data)."""
    return home / "kafka" / "credentials"


def credentials_file(home: Path, principal: str) -> Path:
    return credentials_dir(home) / f"{principal}.properties"


def ensure_credentials(home: Path, principals: Iterable[str]) -> dict[str, str]:
    """The password of each principal, generated and written on first use; name -> password."""
    passwords = {}
    for principal in principals:
        path = credentials_file(home, principal)
        if not path.exists():
            write_credentials(path, client_options(principal, new_password()))
        passwords[principal] = read_credentials(path)["sasl.password"]
    return passwords


def local_secure(home: Path) -> bool:
    """Whether the local broker recorded in `home` requires authentication."""
    record = home / BROKER_FILE
    return record.exists() and bool(json.loads(record.read_text()).get("secure", False))


def credential_options(
    home: Path | None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Client settings that authenticate this process: the file `$ASEARCHER_CREDENTIALS_FILE`
    names (a supervised service's own principal), else the admin's when `home` holds a secure
    local broker (the operator's CLI), else none."""
    environ = os.environ if environ is None else environ
    named = environ.get(ENV_CREDENTIALS)
    if named:
        return read_credentials(Path(named).expanduser())
    if home is not None and local_secure(home):
        return read_credentials(credentials_file(home, ADMIN))
    return {}


def as_principal(settings: KafkaSettings, home: Path, principal: str) -> KafkaSettings:
    """`settings` authenticating as a local principal instead of whoever they named."""
    kept = {k: v for k, v in settings.client_config.items() if k not in CREDENTIAL_KEYS}
    config = {**kept, **read_credentials(credentials_file(home, principal))}
    return msgspec.structs.replace(settings, client_config=config)


# -- applying them -------------------------------------------------------------------------


def create_users(settings: KafkaSettings, passwords: Mapping[str, str], prefix: str = "") -> None:
    """Create (or update) a SCRAM-SHA-512 user per principal; `settings` need admin rights."""
    if not passwords:
        return
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
    upserts = [
        UserScramCredentialUpsertion(f"{prefix}{name}", info, password.encode())
        for name, password in passwords.items()
    ]
    admin = AdminClient(settings.client())  # kept referenced: its futures die with it
    futures = admin.alter_user_scram_credentials(upserts, request_timeout=ADMIN_TIMEOUT_S)
    for user, future in futures.items():
        _result(future, f"creating SCRAM user {user}")


def create_acls(settings: KafkaSettings, bindings: list[AclBinding]) -> None:
    """Create ACL bindings (an existing one is left as is); `settings` need admin rights."""
    if not bindings:
        return
    admin = AdminClient(settings.client())  # kept referenced: its futures die with it
    futures = admin.create_acls(bindings, request_timeout=ADMIN_TIMEOUT_S)
    for binding, future in futures.items():
        _result(future, f"creating ACL {binding}")


def _result(future: Any, what: str) -> None:
    """Wait for an Admin API future; a failure names what was being done."""
    try:
        future.result()
    except KafkaException as exc:
        error = exc.args[0]
        raise KafkaException(KafkaError(error.code(), f"{what}: {error.str()}")) from exc


def provision(
    settings: KafkaSettings,
    groups: ServiceGroups | None = None,
    passwords: Mapping[str, str] | None = None,
    prefix: str = "",
) -> int:
    """Create the service principals' SCRAM users (those in `passwords`) and every ACL of
    `role_grants(groups)`, as the admin `settings` name; idempotent. Returns the ACL count."""
    create_users(settings, passwords or {}, prefix)
    grants = role_grants(groups)
    bindings = acl_bindings(grants, prefix)
    create_acls(settings, bindings)
    log.info("%d ACL bindings in place for %d principals", len(bindings), len(grants))
    return len(bindings)
