"""The desired connector, read from a Connect resource (pure: no I/O)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from fibers.api import CONNECT_PLURAL
from fibers.connect.ownership import OWNER_KEY
from fibers.startfrom import StartFrom, StartFromError

PLURAL = CONNECT_PLURAL
KIND = "Connect"

# Kafka Connect's per-connector override of a sink's consumer group. Refused: the group a seek or replay moves
# must be the connector's own (connect-<name>), never one a user names, which may be another team's.
GROUP_OVERRIDE = "consumer.override.group.id"

# spec.state → the state Kafka Connect reports once it is reached.
# `suspended` is the word every kind shares (nothing runs, positions kept): a STOPPED connector, offsets kept.
CONNECT_STATES = {"running": "RUNNING", "paused": "PAUSED", "stopped": "STOPPED", "suspended": "STOPPED"}


# Kafka Connect replaces `${provider:[path:]key}` in a connector's config with what a config provider set up on
# its workers reads: a worker's file or directory, its environment, or Secrets the workers may read. None of
# them is the namespace's, so no value may ask for one (Kafka's own ConfigTransformer pattern).
_PROVIDER_REFERENCE = re.compile(r"\$\{[^}]*?:[^}]*?\}")


class SpecError(ValueError):
    """The spec cannot be acted on; the message says what to fix."""


@dataclass(frozen=True)
class SecretRef:
    name: str
    key: str


@dataclass(frozen=True)
class AutoRestartPolicy:
    enabled: bool = True
    max_restarts: int | None = None
    backoff_seconds: int = 60
    max_backoff_seconds: int = 1800
    reset_after_seconds: int = 600

    def delay(self, restarts_made: int) -> int:
        """Seconds to wait after the last restart before the next one: 0, 2b, 6b, 12b, … capped."""
        return min(self.backoff_seconds * restarts_made * (restarts_made + 1), self.max_backoff_seconds)

    def exhausted(self, restarts_made: int) -> bool:
        return self.max_restarts is not None and restarts_made >= self.max_restarts


@dataclass(frozen=True)
class Seek:
    """`spec.seek`: move a sink connector's consumer group to `start` once per nonce (see fibers.connect.offsets)."""

    nonce: str
    start: StartFrom


@dataclass(frozen=True)
class ConnectSpec:
    cluster: str | None  # a ConnectCluster's name; None: the default (see fibers.connect.clusters.place)
    connector: str
    connector_class: str
    tasks_max: int
    config: dict[str, str]
    secret_refs: dict[str, SecretRef] = field(default_factory=dict)
    state: str = "running"
    restart_nonce: str | None = None
    auto_restart: AutoRestartPolicy = AutoRestartPolicy()
    # resume: a connector this resource creates takes the offsets Connect kept under its name (Connect's
    # way); reset: it starts from none (see fibers.connect.offsets).
    offsets_on_create: str = "resume"
    # A sink connector this resource creates: where its consumer group starts (it is created STOPPED and
    # moved there first, see fibers.connect.offsets). None: Kafka Connect's way (its auto.offset.reset).
    start_from: StartFrom | None = None
    seek: Seek | None = None

    @property
    def created_at_offsets(self) -> str | None:
        """The offsets operation a connector this resource creates goes through, STOPPED, before it runs."""
        if self.start_from is not None:
            return "startFrom"
        return "reset" if self.offsets_on_create == "reset" else None

    @cached_property
    def is_sink(self) -> bool:
        """A sink connector: its topics in `config`, or even in `secretConfig` (so a consumer group is its)."""
        return any(key in self.config or key in self.secret_refs for key in ("topics", "topics.regex"))

    @property
    def connect_state(self) -> str:
        return CONNECT_STATES[self.state]

    def full_config(self, secret_values: dict[str, str], owner: str) -> dict[str, str]:
        """The configuration Kafka Connect is given: user config, secrets, and the fields we own (the
        owner among them, see `fibers.connect.ownership`).

        SpecError when a value asks a config provider. Checked here rather than when the spec is parsed: a
        resource whose spec parses stays the owner of its connector (a deletion still deletes it), and its
        connector is left as it is until the value is put right."""
        for key, value in self.config.items():
            refuse_provider_reference(value, f"spec.config.{key}")
        refuse_provider_reference(self.connector_class, "spec.class")
        for key, value in secret_values.items():
            refuse_provider_reference(value, f"spec.secretConfig.{key}", secret=True)
        return {
            **self.config,
            **secret_values,
            "name": self.connector,
            "connector.class": self.connector_class,
            "tasks.max": str(self.tasks_max),
            OWNER_KEY: owner,
        }


def refuse_provider_reference(value: str, where: str, *, secret: bool = False) -> None:
    """SpecError naming `where` when the value asks a config provider (quoting it, unless it is a Secret's)."""
    if found := _PROVIDER_REFERENCE.search(value):
        what = "the Secret's value" if secret else repr(found.group(0)[:60])
        raise SpecError(
            f"{where}: {what} asks a Kafka Connect config provider for a value (a worker's files, environment "
            "or Secrets, not this namespace's); give the value itself, or a Secret's through secretConfig"
        )


def config_value(value: Any) -> str:
    """Kafka Connect stores every value as a string; render ours the way it will compare."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    raise SpecError(f"config values must be strings or numbers, not {type(value).__name__}")


def parse(spec: dict[str, Any], name: str) -> ConnectSpec:
    config = {}
    for key, value in (spec.get("config") or {}).items():
        try:
            config[key] = config_value(value)
        except SpecError as exc:
            raise SpecError(f"spec.config.{key}: {exc}") from None
    refs = {
        key: SecretRef(ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"])
        for key, ref in (spec.get("secretConfig") or {}).items()
    }
    for field_name, keys in (("config", config), ("secretConfig", refs)):
        if OWNER_KEY in keys:
            raise SpecError(f"spec.{field_name}.{OWNER_KEY}: the operator writes this key itself (a connector's owner)")
        if GROUP_OVERRIDE in keys:
            raise SpecError(
                f"spec.{field_name}.{GROUP_OVERRIDE}: a sink connector's consumer group is connect-<connector name>; "
                "another name could join another connector's group, and a seek or replay would move its offsets"
            )
    restart = spec.get("autoRestart") or {}
    seek = start_from = None
    try:
        if spec.get("seek"):
            start = StartFrom.parse(spec["seek"].get("startFrom"), "spec.seek.startFrom", ("earliest", "latest"))
            seek = Seek(str(spec["seek"]["nonce"]), start)
        if spec.get("startFrom"):
            start_from = StartFrom.parse(spec["startFrom"], "spec.startFrom", ("earliest", "latest"))
    except StartFromError as exc:
        raise SpecError(str(exc)) from None
    if start_from and not ({"topics", "topics.regex"} & config.keys()):
        raise SpecError(
            "spec.startFrom: only a sink connector (config topics or topics.regex) starts from a position in its "
            "topics; a source connector's offsets are the source's own"
        )
    return ConnectSpec(
        cluster=spec.get("cluster") or None,
        connector=spec.get("connectorName") or name,
        connector_class=spec["class"],
        tasks_max=int(spec.get("tasksMax", 1)),
        config=config,
        secret_refs=refs,
        state=spec.get("state", "running"),
        restart_nonce=spec.get("restartNonce") or None,
        auto_restart=AutoRestartPolicy(
            enabled=bool(restart.get("enabled", True)),
            max_restarts=restart.get("maxRestarts"),
            backoff_seconds=int(restart.get("backoffSeconds", 60)),
            max_backoff_seconds=int(restart.get("maxBackoffSeconds", 1800)),
            reset_after_seconds=int(restart.get("resetAfterSeconds", 600)),
        ),
        offsets_on_create=(spec.get("offsets") or {}).get("onCreate", "resume"),
        start_from=start_from,
        seek=seek,
    )
