"""Connector offsets on request (Kafka Connect's offsets API, KIP-875): pure, no I/O.

A user asks with the annotation `fibers.dev/offsets` on a Connect resource:

- `list`: the current offsets are written to the ConfigMap `<resource>-offsets` (key `offsets.json`),
  named in `status.offsets.configMap` with the time they were read;
- `reset`: every offset is forgotten, so the connector starts again from the beginning;
- `alter`: the offsets in a ConfigMap (`fibers.dev/offsets-from`, by default the list ConfigMap, in
  the form `list` writes) are applied.

A sink connector this resource creates with `spec.startFrom` is created STOPPED, moved there, and only
then started: the operator writes `fibers.dev/offsets: startFrom` with its claim (as `onCreate: reset`
writes `reset`), so a restart half-way carries on. A person may write it too, to move a connector back to
its `spec.startFrom`.

And with `spec.seek` (a nonce and a `startFrom`, the words every kind uses; a Replay writes it): a sink
connector's consumer group is moved to the first offsets at or after the time in each partition of its
topics (Kafka's offsets for times), or to the earliest or latest kept, once per nonce
(`status.lastSeekNonce`). A source connector has no position in time to move to (its offsets are the
source's own, a log position or a snapshot's): a seek asks a Debezium connector instead for an ad hoc,
incremental snapshot of its tables, through its Kafka signal channel (Debezium re-sends every row as it is
now; the connector keeps running). Without that channel configured the seek is refused, saying what to
configure, and nothing is changed.

Kafka Connect changes offsets of a STOPPED connector only: the connector is stopped, changed, and
returned to its desired state. The annotation stays until the operation has ended, so an operator
restart half-way carries on; it is then removed and the result lands in status. A Connect with
`spec.offsets.onCreate: reset` writes the `reset` annotation itself, together with its claim on the
connector name, and creates the connector STOPPED: it never runs on offsets a namesake left behind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fibers.api import ANNOTATION_OFFSETS, ANNOTATION_OFFSETS_FROM
from fibers.connect.spec import ConnectSpec
from fibers.kafka_positions import Position, same_kafka
from fibers.startfrom import StartFrom

OPERATIONS = ("list", "reset", "alter", "startFrom")
CONFIGMAP_KEY = "offsets.json"


class OffsetsInputError(ValueError):
    """The request or the offsets given cannot be applied; the message says what to fix."""


@dataclass(frozen=True)
class OffsetsRequest:
    operation: str  # list | reset | alter | seek | snapshot (a seek of a source connector)
    configmap: str = ""  # alter: where the offsets come from
    start: StartFrom | None = None  # seek: where to
    nonce: str = ""  # seek: spec.seek.nonce

    @property
    def needs_stop(self) -> bool:
        return self.operation in ("reset", "alter", "seek")


def configmap_name(resource: str) -> str:
    return f"{resource}-offsets"


def request_from(
    annotations: dict[str, str], resource: str, start_from: StartFrom | None = None
) -> OffsetsRequest | None:
    """The operation the annotations ask for; an unknown one raises, naming the annotation."""
    value = (annotations.get(ANNOTATION_OFFSETS) or "").strip()
    if not value:
        return None
    if value not in OPERATIONS:
        raise OffsetsInputError(
            f"annotation {ANNOTATION_OFFSETS}={value!r} is not one of {', '.join(OPERATIONS)}; nothing was done"
        )
    if value == "startFrom":
        if start_from is None:
            raise OffsetsInputError(f"annotation {ANNOTATION_OFFSETS}=startFrom needs spec.startFrom; nothing was done")
        return OffsetsRequest("seek", start=start_from)
    source = annotations.get(ANNOTATION_OFFSETS_FROM) or configmap_name(resource)
    return OffsetsRequest(value, source if value == "alter" else "")


def request_for(
    annotations: dict[str, str], resource: str, spec: ConnectSpec | None, last_seek_nonce: str | None
) -> OffsetsRequest | None:
    """What to do with the offsets now: an annotation's operation first (ours at creation, or a person's),
    else a seek the spec asks for and the status does not say was done. A bad annotation raises, naming it."""
    request = request_from(annotations, resource, spec.start_from if spec else None)
    seek = spec.seek if spec else None
    if request is None and spec is not None and seek is not None and seek.nonce != last_seek_nonce:
        operation = "seek" if spec.is_sink else "snapshot"  # topics in secretConfig make a sink too
        return OffsetsRequest(operation, start=seek.start, nonce=seek.nonce)
    return request


@dataclass(frozen=True)
class SnapshotSignal:
    """Debezium's `execute-snapshot` signal for its Kafka channel: the record, and where it goes."""

    bootstrap: str
    topic: str
    key: str  # the connector's topic.prefix: Debezium acts on signals keyed with its own
    value: str
    tables: tuple[str, ...]


def snapshot_signal(config: dict[str, str], kafka: str) -> SnapshotSignal:
    """The signal asking a Debezium source connector for an incremental snapshot of every table it captures;
    OffsetsInputError names what its config lacks for that.

    `kafka` is the Kafka the platform declared for the connector's cluster (its ConnectCluster's
    kafkaBootstrapServers, else the operator's own). The signal goes there and nowhere else: the
    connector's `signal.kafka.bootstrap.servers` is the user's to write, and must not point the
    operator's network identity at an address of their choosing.
    """
    channels = {c.strip() for c in (config.get("signal.enabled.channels") or "source").split(",")}
    topic, bootstrap = config.get("signal.kafka.topic", ""), config.get("signal.kafka.bootstrap.servers", "")
    signals = config.get("signal.data.collection", "")  # captured too, so Debezium sees its watermarks: not data
    tables = tuple(
        t.strip() for t in (config.get("table.include.list") or "").split(",") if t.strip() not in ("", signals)
    )
    missing = [
        name
        for name, ok in (
            ("signal.enabled.channels with kafka", "kafka" in channels),
            ("signal.kafka.topic", bool(topic)),
            ("signal.kafka.bootstrap.servers", bool(bootstrap)),
            (
                "signal.data.collection (the table Debezium keeps its snapshot watermarks in)",
                "signal.data.collection" in config,
            ),
            ("table.include.list", bool(tables)),
            ("topic.prefix", "topic.prefix" in config),
        )
        if not ok
    ]
    if missing:
        raise OffsetsInputError(
            "spec.seek: a source connector has no position in time to move to (its offsets are the source's own); "
            "it can be asked to send its tables again (an incremental snapshot) through Debezium's Kafka signal "
            f"channel, which needs in its config: {', '.join(missing)}. Nothing was changed"
        )
    if not same_kafka(bootstrap, kafka):
        raise OffsetsInputError(
            f"spec.seek: signal.kafka.bootstrap.servers ({bootstrap}) is not the Kafka declared for the connector's "
            f"Connect cluster ({kafka or 'none declared'}); the operator sends a snapshot signal only there. Nothing "
            "was changed"
        )
    value = {"type": "execute-snapshot", "data": {"data-collections": list(tables), "type": "INCREMENTAL"}}
    return SnapshotSignal(kafka, topic, config["topic.prefix"], json.dumps(value), tables)


def sink_topics(config: dict[str, str]) -> tuple[list[str], str] | None:
    """A sink connector's topics and topics regex from its config; None for a source connector (it has neither)."""
    topics = [t.strip() for t in (config.get("topics") or "").split(",") if t.strip()]
    regex = (config.get("topics.regex") or "").strip()
    return (topics, regex) if topics or regex else None


def sink_offsets(positions: list[Position]) -> dict[str, Any]:
    """Positions as Kafka Connect's offsets API takes them for a sink connector's consumer group."""
    return {
        "offsets": [
            {
                "partition": {"kafka_topic": p.topic, "kafka_partition": p.partition},
                "offset": {"kafka_offset": p.offset},
            }
            for p in positions
        ]
    }


def render(offsets: dict[str, Any]) -> str:
    """Offsets as the ConfigMap holds them: Connect's own JSON, stable and readable for editing."""
    return json.dumps({"offsets": offsets.get("offsets") or []}, indent=2, sort_keys=True) + "\n"


def parse(text: str | None, where: str) -> dict[str, Any]:
    """Offsets to apply, checked before the connector is stopped: Connect's form, with at least one."""
    if text is None:
        raise OffsetsInputError(f"{where} has no key {CONFIGMAP_KEY}")
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise OffsetsInputError(f"{where}: {CONFIGMAP_KEY} is not valid JSON ({exc})") from None
    entries = body.get("offsets") if isinstance(body, dict) else None
    if not isinstance(entries, list) or not entries:
        raise OffsetsInputError(f'{where}: {CONFIGMAP_KEY} must be {{"offsets": [{{"partition": …, "offset": …}}, …]}}')
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("partition"), dict) or "offset" not in entry:
            raise OffsetsInputError(f"{where}: offsets[{i}] needs a partition object and an offset (null resets it)")
    return {"offsets": entries}
