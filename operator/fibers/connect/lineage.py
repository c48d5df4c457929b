"""OpenLineage events for Connect resources: a connector's run starts when it is first Ready, fails when
it or its tasks fail, and completes when the resource deletes it.

A run's id is derived from the resource's uid and the time its Ready condition turned True, so an
operator that restarts reports the same run. Datasets come from the plain spec.config only (never from
secretConfig): a source connector reads its external system (a Debezium PostgreSQL table, a file) and
writes the topics in status; a sink reads its `topics` and writes the external system.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

from fibers import conditions
from fibers.conditions import READY
from fibers.connect.reconcile import Target

if TYPE_CHECKING:  # the OpenLineage client is imported only when lineage is on (about 6 MiB)
    from fibers.lineage import DatasetRef

FAILED = frozenset({"ConnectorFailed", "TasksFailed", "AutoRestartExhausted"})  # a run that ended in failure


def run_id(uid: str, since: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"fibers.dev/connect/{uid}/{since}"))


def datasets(target: Target, bootstrap: str | None) -> tuple[list[DatasetRef], list[DatasetRef]]:
    from fibers import lineage

    assert target.spec is not None
    config = target.spec.config

    def topic(name: str) -> DatasetRef:
        return lineage.kafka(bootstrap, name) if bootstrap else lineage.DatasetRef("kafka", name)

    external = _external(target.spec.connector_class, config)
    if config.get("topics"):  # a sink connector
        return [topic(t.strip()) for t in config["topics"].split(",") if t.strip()], external
    return external, [topic(t) for t in target.status.get("topics") or []]


def _external(connector_class: str, config: dict[str, str]) -> list[DatasetRef]:
    from fibers import lineage

    if "file" in config:
        return [lineage.files(config["file"])]
    if connector_class.endswith("PostgresConnector"):
        host = config.get("database.hostname")
        namespace = f"postgres://{host}:{config.get('database.port', '5432')}" if host else "postgres"
        database = config.get("database.dbname", "")
        tables = [t.strip() for t in config.get("table.include.list", "").split(",") if t.strip()]
        return [lineage.DatasetRef(namespace, f"{database}.{table}") for table in tables]
    return []


class ConnectLineage:
    """Emits in worker threads (the Kafka producer flushes), so the Connect sync never waits on it."""

    def __init__(self, base: dict[str, str] | None, kafka_bootstrap: str | None) -> None:
        self.base = base  # {topic, bootstrapServers, namespace}; None: lineage is off
        self.kafka_bootstrap = kafka_bootstrap  # where the connectors' topics live, for their dataset names
        self._tasks: set[asyncio.Future[Any]] = set()

    def ready_changed(self, target: Target, before: dict[str, Any], after: dict[str, Any]) -> None:
        """START when Ready turns True; FAIL when a running connector fails."""
        if self.base is None or target.spec is None:
            return
        if after.get("status") == "True":
            self._send(target, "start", run_id(target.uid, after.get("lastTransitionTime", "")))
        elif after.get("reason") in FAILED and before.get("status") == "True":
            self._send(
                target, "fail", run_id(target.uid, before.get("lastTransitionTime", "")), after.get("message", "")
            )

    def deleted(self, target: Target) -> None:
        """COMPLETE for the run of a connector that was Ready until the resource deleted it."""
        ready = conditions.find(target.status.get("conditions"), READY) or {}
        if self.base is None or target.spec is None or ready.get("status") != "True":
            return
        self._send(target, "complete", run_id(target.uid, ready.get("lastTransitionTime", "")))

    def _send(self, target: Target, what: str, run: str, message: str = "") -> None:
        from fibers import lineage

        assert self.base is not None
        settings = lineage.Settings.from_dict(
            {**self.base, "job": f"{target.namespace}.connect.{target.name}", "runId": run}
        )
        emitter = lineage.Emitter(settings)
        inputs, outputs = datasets(target, self.kafka_bootstrap)
        if what == "start":
            call = asyncio.to_thread(emitter.start, inputs, outputs)
        elif what == "fail":
            call = asyncio.to_thread(emitter.fail, inputs, outputs, message)
        else:
            facet = lineage.IngestionRunFacet(kind="Connect")
            call = asyncio.to_thread(emitter.complete, inputs, outputs, facet)
        task = asyncio.ensure_future(call)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
