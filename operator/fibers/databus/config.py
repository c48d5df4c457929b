"""The consumer's configuration, rendered by the operator and passed to `fibers consume`."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from fibers.startfrom import POSITIONS, StartFrom, StartFromError

# The pod's own name and uid, from the downward API (the StatefulSet sets them): its ordinal, and the name
# its Leases are held in. Here rather than with the StatefulSet, so a consumer pod does not load kopf.
POD_NAME_ENV, POD_UID_ENV = "FIBERS_POD_NAME", "FIBERS_POD_UID"
SINK_TYPES = ("mongodb", "history", "bootstrap", "kafka", "log", "callback")
UNDECODABLE_ACTIONS = ("fail", "skip", "deadLetter")  # fibers.consumer.undecodable
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")  # Kafka's rule for topic names
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_CALLBACK = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")
_SERVER = re.compile(r"^[^\s,/:]+:[0-9]{1,5}$")  # host:port
_MONGO_DATABASE_BAD = re.compile(r'[/\\. "$\x00]')


class ConfigError(ValueError):
    """The configuration cannot run; the message names the DatabusConsumer field to fix."""


def sink_specs(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(field, sink) of each of a DatabusConsumer's sinks: `spec.sink`, or each of `spec.sinks`."""
    if spec.get("sinks"):
        return [(f"spec.sinks[{i}]", dict(sink)) for i, sink in enumerate(spec["sinks"])]
    return [("spec.sink", dict(spec["sink"]))]


def sink_name(sink: dict[str, Any]) -> str:
    """A sink's name in status and logs: its own, else its type."""
    return str(sink.get("name") or sink["type"])


@dataclass(frozen=True)
class ConsumerConfig:
    name: str
    namespace: str
    topics: list[str]
    bootstrap_servers: str
    sinks: list[dict[str, Any]]  # each with "field" (spec.sink or spec.sinks[i]) and "name"; windows go to all
    checkpoint_config_map: str
    instance: int = 0
    instances: int = 1
    # Where a timeline with no checkpoint starts (fibers.startfrom), and the field that said so.
    start_from: StartFrom = field(default_factory=lambda: StartFrom(position="bootstrap"))
    start_field: str = "spec.startFrom"
    bootstrap: dict[str, Any] | None = None  # {"uriEnv", "database"} of the bootstrap store
    checkpoint_min_interval: float = 1.0
    callback_timeout: float = 60.0
    retries: int = 5
    retry_backoff: float = 1.0
    max_window_events: int = 5000
    labels: dict[str, str] = field(default_factory=dict)
    registry_url: str | None = None  # values are Avro in the registry's wire format (spec.relay.avro)
    lineage: dict[str, str] | None = None  # {topic, bootstrapServers, namespace, job}: OpenLineage events go there
    producers: dict[str, dict[str, str]] = field(default_factory=dict)  # topic → the sourceRef that resolved to it
    on_undecodable: str = "fail"  # fail | skip | deadLetter (fibers.consumer.undecodable)
    dead_letter_topic: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConsumerConfig:
        relay, checkpoint, callback = data["relay"], data["checkpoint"], data.get("callback") or {}
        sinks = data.get("sinks") or [{"field": "spec.sink", **data["sink"]}]  # the one-sink form
        return cls(
            name=data["name"],
            namespace=data["namespace"],
            topics=list(relay["topics"]),
            bootstrap_servers=relay["bootstrapServers"],
            sinks=[{"field": f"spec.sinks[{i}]", "name": sink_name(s), **s} for i, s in enumerate(sinks)],
            checkpoint_config_map=checkpoint["configMapName"],
            instance=int(data.get("instance", 0)),
            instances=int(data.get("instances", 1)),
            start_from=_start_from(data),
            start_field=str(
                data.get("startFromField") or ("spec.startFrom" if "startFrom" in data else "spec.startPosition")
            ),
            bootstrap=data.get("bootstrap"),
            checkpoint_min_interval=float(checkpoint.get("minIntervalSeconds", 1.0)),
            callback_timeout=float(callback.get("timeoutSeconds", 60)),
            retries=int(callback.get("retries", 5)),
            retry_backoff=float(callback.get("retryBackoffSeconds", 1)),
            labels=dict(data.get("labels") or {}),
            registry_url=(relay.get("avro") or {}).get("registryUrl"),
            lineage=data.get("lineage"),
            producers=dict(relay.get("producers") or {}),
            on_undecodable=str((data.get("onUndecodable") or {}).get("action", "fail")),
            dead_letter_topic=(data.get("onUndecodable") or {}).get("deadLetterTopic"),
        )

    @property
    def start_position(self) -> str:
        """The position a timeline with no checkpoint starts at: a POSITIONS word, or "timestamp"."""
        return "timestamp" if self.start_from.timestamp_ms is not None else str(self.start_from.position)

    def secrets(self) -> list[str]:
        """The values of the environment variables that carry MongoDB URIs (to mask in messages)."""
        names = [*(sink.get("uriEnv") for sink in self.sinks), (self.bootstrap or {}).get("uriEnv")]
        return [value for name in names if name and (value := os.environ.get(str(name)))]

    def check(self) -> ConsumerConfig:
        """Everything that can be checked without Kafka or MongoDB, so neither the operator nor a pod
        starts a consumer that cannot run. The operator checks before it creates an instance, the
        consumer again when it starts (its configuration may come from elsewhere).
        """
        _check_topics(self.topics, "spec.sources")
        for server in self.bootstrap_servers.split(","):
            if not _SERVER.match(server.strip()):
                raise ConfigError(f"spec.relay.bootstrapServers: {server.strip()!r} is not host:port")
        if not _DNS_SUBDOMAIN.match(self.checkpoint_config_map):
            raise ConfigError(
                f"spec.checkpoint.configMapName: {self.checkpoint_config_map!r} is not a ConfigMap name "
                "(lower-case letters, digits, '-' and '.', at most 253)"
            )
        if self.start_from.timestamp_ms is None and self.start_from.position not in POSITIONS:
            raise ConfigError(f"{self.start_field} must be one of {', '.join(POSITIONS)}")
        if self.start_position == "bootstrap" and not self.bootstrap:
            raise ConfigError(f"{self.start_field} bootstrap needs spec.bootstrap (enabled, with a store)")
        try:
            self.start_from.check(int(time.time() * 1000), self.start_field)
        except StartFromError as exc:
            raise ConfigError(str(exc)) from None
        if self.on_undecodable not in UNDECODABLE_ACTIONS:
            raise ConfigError(f"spec.onUndecodable.action must be one of {', '.join(UNDECODABLE_ACTIONS)}")
        if self.on_undecodable == "deadLetter":
            _check_topics([self.dead_letter_topic or ""], "spec.onUndecodable.deadLetterTopic")
            if self.dead_letter_topic in self.topics:
                raise ConfigError("spec.onUndecodable.deadLetterTopic must not be a topic the consumer reads")
        if not 0 <= self.instance < self.instances:
            raise ConfigError(f"spec.instances must be at least 1 (instance {self.instance} of {self.instances})")
        for where, value, low in (
            ("spec.checkpoint.minIntervalSeconds", self.checkpoint_min_interval, 0.0),
            ("spec.callbackPolicy.retries", self.retries, 0),
            ("spec.callbackPolicy.retryBackoffSeconds", self.retry_backoff, 0.0),
        ):
            if value < low:
                raise ConfigError(f"{where} must be at least {low}, not {value}")
        if self.callback_timeout <= 0:
            raise ConfigError(f"spec.callbackPolicy.timeoutSeconds must be positive, not {self.callback_timeout}")
        for sink in self.sinks:
            _check_sink(sink, str(sink["field"]), self.topics)
        names = [str(sink["name"]) for sink in self.sinks]
        if len(set(names)) != len(names):
            raise ConfigError(f"spec.sinks: names must be distinct (name the sinks of one type); {names}")
        if self.bootstrap:
            _check_database(str(self.bootstrap.get("database") or ""), "spec.bootstrap.database")
        return self


def _check_sink(sink: dict[str, Any], where: str, topics: list[str]) -> None:
    kind = sink.get("type")
    if kind not in SINK_TYPES:
        raise ConfigError(f"{where}.type must be one of {', '.join(SINK_TYPES)}, not {kind!r}")
    if kind in ("mongodb", "history", "bootstrap"):
        _check_database(str(sink.get("database") or ""), f"{where}.database")
    if kind in ("mongodb", "history"):
        collection = str(sink.get("collection") or "")
        if not collection or "$" in collection or "\x00" in collection or collection.startswith("system."):
            raise ConfigError(f"{where}.collection: {collection!r} is not a collection name (no $, not system.*)")
        if kind == "mongodb" and len(topics) > 1 and TOPIC not in collection:
            raise ConfigError(
                f"{where}.collection: a view holds one document per row key, so the {len(topics)} topics it reads "
                f"({', '.join(topics)}) would overwrite each other's rows that share a key; put {TOPIC} in the name "
                "to give each topic its own collection"
            )
    if kind == "kafka":
        _check_topics([str(sink.get("topic") or "")], f"{where}.topic")
    if kind == "callback" and not _CALLBACK.match(str(sink.get("callback") or "")):
        raise ConfigError(f"{where}.callback: {sink.get('callback')!r} is not package.module:Class")


TOPIC = "{topic}"  # in a mongodb sink's collection name: the topic whose rows it holds


def _check_topics(topics: list[str], where: str) -> None:
    if not topics:
        raise ConfigError(f"{where} must name at least one topic")
    for topic in topics:
        if not _TOPIC.match(topic) or topic in (".", ".."):
            raise ConfigError(f"{where}: {topic!r} is not a Kafka topic name (1-249 of letters, digits, . _ -)")
    if len(set(topics)) != len(topics):
        raise ConfigError(f"{where} must be distinct; {sorted({t for t in topics if topics.count(t) > 1})} repeat")


def _check_database(database: str, where: str) -> None:
    if not database or len(database) > 63 or _MONGO_DATABASE_BAD.search(database):
        raise ConfigError(
            f'{where}: {database!r} is not a MongoDB database name (1-63 characters, none of / \\ . space " $)'
        )


def _start_from(data: dict[str, Any]) -> StartFrom:
    """The rendered `startFrom` ({position} or {timestamp}), or the older `startPosition` word."""
    if "startFrom" not in data:
        return StartFrom(position=str(data.get("startPosition", "bootstrap")))
    try:
        return StartFrom.parse(data["startFrom"], str(data.get("startFromField") or "spec.startFrom"))
    except StartFromError as exc:
        raise ConfigError(str(exc)) from None
