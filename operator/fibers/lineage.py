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

import functools
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import attr
from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import RunFacet
from openlineage.client.generated.error_message_run import ErrorMessageRunFacet
from openlineage.client.generated.input_statistics_input_dataset import InputStatisticsInputDatasetFacet
from openlineage.client.generated.output_statistics_output_dataset import OutputStatisticsOutputDatasetFacet
from openlineage.client.transport.kafka import KafkaConfig, KafkaTransport

log = logging.getLogger("fibers.lineage")

PRODUCER = "https://github.com/fibers-dev/fibers"
FACET_SCHEMA = "https://fibers.dev/spec/facets/1-0-0/IngestionRunFacet.json"


@attr.define
class IngestionRunFacet(RunFacet):
    """What a run ingested (DataFibers' df_meta): rows in and out, files, Kafka offsets per partition.

    Offsets are a list, not a map by topic: topic names hold dots, which document stores refuse in keys."""

    kind: str = attr.field(default="")
    rowsIn: int | None = attr.field(default=None)
    rowsOut: int | None = attr.field(default=None)
    streamedBack: int | None = attr.field(default=None)
    files: list[str] = attr.field(factory=list)
    offsets: list[dict[str, Any]] = attr.field(factory=list)  # Kafka read: {topic, partition, first, last} each

    @staticmethod
    def _get_schema() -> str:
        return FACET_SCHEMA


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
class DatasetRef:
    namespace: str
    name: str
    rows: int | None = None  # read (inputs) or written (outputs), when known


def kafka(bootstrap_servers: str, topic: str, rows: int | None = None) -> DatasetRef:
    return DatasetRef(f"kafka://{bootstrap_servers.split(',')[0].strip()}", topic, rows)


def mongodb(uri: str, database: str, collection: str, rows: int | None = None) -> DatasetRef:
    """Only the (first) host and port of the URI: its user and password stay out of the event.

    A replica set's URI lists several hosts (`h1:27017,h2:27017`), which `urlsplit` cannot take as one
    port: the first host names the dataset, as OpenLineage's `mongodb://{host}:{port}` asks.
    """
    hosts = urlsplit(uri).netloc.rpartition("@")[2]
    return DatasetRef(f"mongodb://{hosts.split(',')[0] or 'localhost'}", f"{database}.{collection}", rows)


def files(path: str, rows: int | None = None) -> DatasetRef:
    return DatasetRef("file", path, rows)


@functools.cache
def _client(topic: str, bootstrap_servers: str) -> OpenLineageClient:
    """One client (one Kafka producer) per topic, shared by every run a process reports."""
    config = KafkaConfig(
        topic=topic, config={"bootstrap.servers": bootstrap_servers, "message.timeout.ms": "15000"}, flush=True
    )
    return OpenLineageClient(transport=KafkaTransport(config))


@dataclass(frozen=True)
class Emitter:
    """Sends one run's events. Emitting never fails the run: a lineage topic that cannot be written is
    logged, and the work goes on."""

    settings: Settings

    def _transport(self) -> OpenLineageClient:
        return _client(self.settings.topic, self.settings.bootstrap_servers)

    def start(self, inputs: list[DatasetRef], outputs: list[DatasetRef]) -> None:
        self._emit(RunState.START, inputs, outputs, {})

    def complete(self, inputs: list[DatasetRef], outputs: list[DatasetRef], ingestion: IngestionRunFacet) -> None:
        self._emit(RunState.COMPLETE, inputs, outputs, {"fibers_ingestion": ingestion})

    def fail(self, inputs: list[DatasetRef], outputs: list[DatasetRef], message: str) -> None:
        error = ErrorMessageRunFacet(message=message, programmingLanguage="python")
        self._emit(RunState.FAIL, inputs, outputs, {"errorMessage": error})

    def _emit(
        self, state: RunState, inputs: list[DatasetRef], outputs: list[DatasetRef], facets: dict[str, RunFacet]
    ) -> None:
        event = build(self.settings, state, inputs, outputs, facets)
        try:
            self._transport().emit(event)
        except Exception as exc:  # lineage is a report on the work, never a reason for it to fail
            log.warning("could not emit a lineage event: %s", exc, extra={"event": state.value})
        else:
            log.info("lineage event", extra={"event": state.value, "job": self.settings.job})


def build(
    settings: Settings,
    state: RunState,
    inputs: list[DatasetRef],
    outputs: list[DatasetRef],
    facets: dict[str, RunFacet],
) -> RunEvent:
    """One run event (pure)."""
    return RunEvent(
        eventType=state,
        eventTime=datetime.now(UTC).isoformat(),
        run=Run(runId=settings.run_id, facets=facets),
        job=Job(namespace=settings.namespace, name=settings.job),
        producer=PRODUCER,
        inputs=[
            InputDataset(
                namespace=d.namespace,
                name=d.name,
                inputFacets={"inputStatistics": InputStatisticsInputDatasetFacet(rowCount=d.rows)}
                if d.rows is not None
                else {},
            )
            for d in inputs
        ],
        outputs=[
            OutputDataset(
                namespace=d.namespace,
                name=d.name,
                outputFacets={"outputStatistics": OutputStatisticsOutputDatasetFacet(rowCount=d.rows)}
                if d.rows is not None
                else {},
            )
            for d in outputs
        ],
    )
