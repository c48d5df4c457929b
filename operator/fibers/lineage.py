"""OpenLineage run events (START, COMPLETE, FAIL) with their datasets, sent to a Kafka topic.

Where pipelines report what they read and wrote: every Transform run and every DatabusConsumer
instance emits them through the `openlineage-python` client's Kafka transport, to the topic the
chart's `lineage.topic` names (off when unset). A COMPLETE event also carries what was ingested (rows
in and out, files, Kafka offsets) in the `fibers_ingestion` run facet: DataFibers' `df_meta`.

Dataset names follow OpenLineage's naming conventions: `kafka://<bootstrap host:port>` / topic,
`mongodb://<host:port>` / database.collection, `file` / path. A MongoDB URI's credentials never reach
an event: only its host and port are kept.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("fibers.lineage")


@dataclass
class IngestionRunFacet:
    """What a run ingested (DataFibers' df_meta): rows in and out, files, Kafka offsets per partition.

    Sent as the `fibers_ingestion` run facet. Offsets are a list, not a map by topic: topic names hold
    dots, which document stores refuse in keys."""

    kind: str = ""  # the field names are the facet's (camelCase)
    rowsIn: int | None = None
    rowsOut: int | None = None
    streamedBack: int | None = None
    files: list[str] = field(default_factory=list)
    offsets: list[dict[str, Any]] = field(default_factory=list)  # Kafka read: {topic, partition, first, last} each


@dataclass
class ReplayRunFacet:
    """A step a Replay moved: which Replay, from where, and how many records the step reads again. Sent as
    the `fibers_replay` run facet of an OTHER event on the step's job, so a lineage history shows where
    a dataset's records were computed twice."""

    replay: str  # <namespace>/<name> of the Replay
    startFrom: str  # the field names are the facet's (camelCase)
    records: int | None = None


@dataclass(frozen=True)
class Settings:
    """Where events go and what the job is called; rendered by the operator into each job's spec."""

    topic: str
    bootstrap_servers: str
    namespace: str  # OpenLineage job namespace (chart value lineage.namespace)
    job: str  # <kubernetes namespace>.<kind>.<name>
    run_id: str  # a UUID: the Transform run's submissionId, a consumer instance's own

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Settings:
        return cls(raw["topic"], raw["bootstrapServers"], raw["namespace"], raw["job"], raw["runId"])

    def to_dict(self) -> dict[str, str]:
        return {
            "topic": self.topic,
            "bootstrapServers": self.bootstrap_servers,
            "namespace": self.namespace,
            "job": self.job,
            "runId": self.run_id,
        }


@dataclass(frozen=True)
class Producer:
    """The Fibers resource that writes a dataset, when a reference named it (connectRef, transformRef):
    lineage then links the same resources the pipeline does (the `fibers_producer` dataset facet)."""

    kind: str  # Connect | Transform
    name: str
    namespace: str

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Producer | None:
        return cls(str(data["kind"]), str(data["name"]), str(data["namespace"])) if data else None


@dataclass(frozen=True)
class DatasetRef:
    namespace: str
    name: str
    rows: int | None = None  # read (inputs) or written (outputs), when known
    producer: Producer | None = None


def kafka(bootstrap_servers: str, topic: str, rows: int | None = None, producer: Producer | None = None) -> DatasetRef:
    return DatasetRef(f"kafka://{bootstrap_servers.split(',')[0].strip()}", topic, rows, producer)


_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._%-]+)(:[0-9]+)?")  # a name or [IPv6], and a port


def mongodb(uri: str, database: str, collection: str, rows: int | None = None) -> DatasetRef:
    """Only the (first) host and port of the URI: its user and password stay out of the event.

    A replica set's URI lists several hosts (`h1:27017,h2:27017`): the first names the dataset, as
    OpenLineage's `mongodb://{host}:{port}` asks. The hosts are what follows the URI's last `@`, up to its
    path or options: a password is before it even with an unescaped `#`, `/`, `?` or `@` in it, which
    pymongo may take (and a Transform names its datasets before it connects). What does not read as a host
    of a `mongodb://` URI names `unknown` — a Secret holding the bare password, say: nothing of a value that
    cannot be read as such a URI reaches the event.
    """
    if not uri:
        return DatasetRef("mongodb://localhost", f"{database}.{collection}", rows)
    scheme, _, rest = uri.partition("://")
    first = re.split(r"[/?#]", rest.rpartition("@")[2], maxsplit=1)[0].split(",")[0]
    host = first if scheme in ("mongodb", "mongodb+srv") and _HOST.fullmatch(first) else "unknown"
    return DatasetRef(f"mongodb://{host}", f"{database}.{collection}", rows)


def files(path: str, rows: int | None = None) -> DatasetRef:
    return DatasetRef("file", path, rows)


@dataclass(frozen=True)
class Emitter:
    """Sends one run's events. Emitting never fails the run: a lineage topic that cannot be written is
    logged, and the work goes on. The OpenLineage client is imported on the first event: a process
    that reports no lineage (the operator, most of all) never loads it (~25 MiB)."""

    settings: Settings

    def start(self, inputs: list[DatasetRef], outputs: list[DatasetRef]) -> None:
        self._emit("START", inputs, outputs)

    def complete(self, inputs: list[DatasetRef], outputs: list[DatasetRef], ingestion: IngestionRunFacet) -> None:
        self._emit("COMPLETE", inputs, outputs, ingestion=ingestion)

    def fail(self, inputs: list[DatasetRef], outputs: list[DatasetRef], message: str) -> None:
        self._emit("FAIL", inputs, outputs, error=message)

    def repositioned(self, inputs: list[DatasetRef], replay: ReplayRunFacet) -> None:
        self._emit("OTHER", inputs, [], replay=replay)

    def _emit(
        self,
        state: str,
        inputs: list[DatasetRef],
        outputs: list[DatasetRef],
        *,
        ingestion: IngestionRunFacet | None = None,
        error: str | None = None,
        replay: ReplayRunFacet | None = None,
    ) -> None:
        try:
            from fibers import lineage_events

            event = lineage_events.build(
                self.settings, state, inputs, outputs, ingestion=ingestion, error=error, replay=replay
            )
            lineage_events.send(self.settings, event)
        except Exception as exc:  # lineage is a report on the work, never a reason for it to fail
            log.warning("could not emit a lineage event: %s", exc, extra={"event": state})
        else:
            log.info("lineage event", extra={"event": state, "job": self.settings.job})
