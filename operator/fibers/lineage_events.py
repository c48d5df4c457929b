"""OpenLineage run events built and sent with the `openlineage-python` client (its Kafka transport).

Only `fibers.lineage.Emitter` imports this, on a run's first event: the client and what it pulls
in cost a process ~25 MiB, which the operator and consumers that report no lineage do not pay.
"""

from __future__ import annotations

import dataclasses
import functools
from datetime import UTC, datetime
from typing import Any

import attr
from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import DatasetFacet, RunFacet
from openlineage.client.generated.error_message_run import ErrorMessageRunFacet
from openlineage.client.generated.input_statistics_input_dataset import InputStatisticsInputDatasetFacet
from openlineage.client.generated.output_statistics_output_dataset import OutputStatisticsOutputDatasetFacet
from openlineage.client.transport.kafka import KafkaConfig, KafkaTransport

from fibers.lineage import DatasetRef, IngestionRunFacet, Producer, ReplayRunFacet, Settings

PRODUCER = "https://github.com/fibers-dev/fibers"
FACET_SCHEMA = "https://fibers.dev/spec/facets/1-0-0/IngestionRunFacet.json"
PRODUCER_FACET_SCHEMA = "https://fibers.dev/spec/facets/1-0-0/ProducerDatasetFacet.json"
REPLAY_FACET_SCHEMA = "https://fibers.dev/spec/facets/1-0-0/ReplayRunFacet.json"


@attr.define
class _IngestionFacet(RunFacet):
    """fibers.lineage.IngestionRunFacet as an OpenLineage run facet (the same fields)."""

    kind: str = attr.field(default="")
    rowsIn: int | None = attr.field(default=None)
    rowsOut: int | None = attr.field(default=None)
    streamedBack: int | None = attr.field(default=None)
    files: list[str] = attr.field(factory=list)
    offsets: list[dict[str, object]] = attr.field(factory=list)

    @staticmethod
    def _get_schema() -> str:
        return FACET_SCHEMA


@attr.define
class _ReplayFacet(RunFacet):
    """fibers.lineage.ReplayRunFacet as an OpenLineage run facet (the same fields)."""

    replay: str = attr.field(default="")
    startFrom: str = attr.field(default="")
    records: int | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return REPLAY_FACET_SCHEMA


@attr.define
class _ProducerFacet(DatasetFacet):
    """fibers.lineage.Producer: the Fibers resource that writes the dataset (the same fields)."""

    kind: str = attr.field(default="")
    name: str = attr.field(default="")
    namespace: str = attr.field(default="")

    @staticmethod
    def _get_schema() -> str:
        return PRODUCER_FACET_SCHEMA


def _producer(producer: Producer | None) -> dict[str, DatasetFacet]:
    return {"fibers_producer": _ProducerFacet(**dataclasses.asdict(producer))} if producer else {}


@functools.cache
def _client(topic: str, bootstrap_servers: str) -> OpenLineageClient:
    """One client (one Kafka producer) per topic, shared by every run a process reports."""
    config = KafkaConfig(
        topic=topic, config={"bootstrap.servers": bootstrap_servers, "message.timeout.ms": "15000"}, flush=True
    )
    return OpenLineageClient(transport=KafkaTransport(config))


def send(settings: Settings, event: RunEvent) -> None:
    _client(settings.topic, settings.bootstrap_servers).emit(event)


def build(
    settings: Settings,
    state: str,
    inputs: list[DatasetRef],
    outputs: list[DatasetRef],
    *,
    ingestion: IngestionRunFacet | None = None,
    error: str | None = None,
    replay: ReplayRunFacet | None = None,
) -> RunEvent:
    """One run event (pure): state is START, COMPLETE, FAIL, or OTHER (a step a Replay moved)."""
    facets: dict[str, RunFacet] = {}
    if replay is not None:
        facets["fibers_replay"] = _ReplayFacet(**dataclasses.asdict(replay))
    if ingestion is not None:
        facets["fibers_ingestion"] = _IngestionFacet(**dataclasses.asdict(ingestion))
    if error is not None:
        facets["errorMessage"] = ErrorMessageRunFacet(message=error, programmingLanguage="python")
    return RunEvent(
        eventType=RunState(state),
        eventTime=datetime.now(UTC).isoformat(),
        run=Run(runId=settings.run_id, facets=facets),
        job=Job(namespace=settings.namespace, name=settings.job),
        producer=PRODUCER,
        inputs=[
            InputDataset(
                namespace=d.namespace,
                name=d.name,
                facets=_producer(d.producer),
                inputFacets=_rows("inputStatistics", d.rows),
            )
            for d in inputs
        ],
        outputs=[
            OutputDataset(namespace=d.namespace, name=d.name, outputFacets=_rows("outputStatistics", d.rows))
            for d in outputs
        ],
    )


_ROW_FACETS = {  # inputs and outputs carry their row counts in different facets
    "inputStatistics": InputStatisticsInputDatasetFacet,
    "outputStatistics": OutputStatisticsOutputDatasetFacet,
}


def _rows(facet: str, rows: int | None) -> dict[str, Any]:
    """A dataset's row count as its statistics facet (none when the count is not known)."""
    return {} if rows is None else {facet: _ROW_FACETS[facet](rowCount=rows)}
