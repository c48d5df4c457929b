"""The steps of an offsets operation on a connector (`fibers.dev/offsets`: list, reset, alter; or
`spec.seek`): stop it, then list its offsets into a ConfigMap, reset them, alter them from one, or move a
sink connector's to a time; how it ended goes into status and an Event, and the connector then returns to
its desired state."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fibers.api import object_ref
from fibers.conditions import format_time, utcnow
from fibers.connect import offsets
from fibers.connect.publisher import Publisher
from fibers.connect.reconcile import Outcome, Step, Target
from fibers.connect.registry import ConnectClusters
from fibers.connect.rest import ConnectClient, ConnectError
from fibers.connect.spec import KIND
from fibers.kafka_positions import PositionsError, describe, lookup, total
from fibers.kube import Kube, NotOurs
from fibers.redact import MESSAGE_CHARS, redact, truncate
from fibers.startfrom import StartFromError

log = logging.getLogger("fibers.connect")


class OffsetSteps:
    def __init__(self, kube: Kube, publisher: Publisher, clusters: ConnectClusters, kafka_bootstrap: str) -> None:
        self.kube, self.publisher, self.clusters = kube, publisher, clusters
        self.kafka_bootstrap = kafka_bootstrap  # the chart's kafka.bootstrap: for clusters that name no Kafka

    async def run(self, client: ConnectClient, target: Target, step: Step, outcome: Outcome) -> None:
        """One step of an offsets operation. Connect refusing it ends the operation as Failed (the
        connector then returns to its desired state); a rebalance (409) or no answer is retried."""
        assert target.spec is not None and target.offsets_request is not None
        connector, request = target.spec.connector, target.offsets_request
        ctx = {"namespace": target.namespace, "resource": target.name, "connector": connector}
        source = f"ConfigMap {target.namespace}/{request.configmap}"
        try:
            if step is Step.STOP_FOR_OFFSETS:
                if request.operation == "alter":
                    await self._to_apply(target, source)  # bad input fails before the connector stops
                if request.operation == "seek":
                    self._seekable(target)  # so does a seek that cannot be made
                await client.set_state(connector, "STOPPED")
                log.info("connector stopped to change its offsets", extra={**ctx, "operation": request.operation})
                return
            if step is Step.LIST_OFFSETS:
                listed = await client.offsets(connector)
                name = offsets.configmap_name(target.name)
                read_at = format_time(utcnow())
                await self.kube.put_configmap(
                    target.namespace,
                    name,
                    {offsets.CONFIGMAP_KEY: offsets.render(listed)},
                    owner=object_ref(KIND, target.namespace, target.name, target.uid),
                    annotations={"fibers.dev/offsets-read-at": read_at, "fibers.dev/connector": connector},
                )
                count = len(listed.get("offsets") or [])
                message = f"{count} partition(s) written to ConfigMap {name} at {read_at}"
                await self._done(target, outcome, True, message, configMap=name, listedAt=read_at)
            elif step is Step.RESET_OFFSETS:
                message = await client.reset_offsets(connector)
                await self._done(target, outcome, True, message or "offsets reset")
            elif step is Step.ALTER_OFFSETS:
                message = await client.alter_offsets(connector, await self._to_apply(target, source))
                await self._done(target, outcome, True, message or f"offsets from {source} applied")
            elif step is Step.SNAPSHOT:
                kafka = self.clusters.kafka_bootstrap(target.cluster) or self.kafka_bootstrap or ""
                signal = offsets.snapshot_signal(target.config, kafka)
                await asyncio.to_thread(_send, signal)
                tables = ", ".join(signal.tables)
                message = (
                    f"a source connector has no position in time: an incremental snapshot of {tables} was asked "
                    f"of it on its signal topic {signal.topic} (Debezium sends their rows again as they are now)"
                )
                await self._done(target, outcome, True, message)
            elif step is Step.SEEK_OFFSETS:
                topics, regex = self._seekable(target)
                assert request.start is not None
                bootstrap = self.clusters.kafka_bootstrap(target.cluster) or self.kafka_bootstrap
                positions = await asyncio.to_thread(
                    lookup, bootstrap, topics, request.start, regex=regex, cluster_id=self._kafka_id(target)
                )
                await client.alter_offsets(connector, offsets.sink_offsets(positions))
                message = f"moved {request.start.describe()}: {describe(positions)}"
                await self._done(target, outcome, True, message, records=total(positions))
        except (offsets.OffsetsInputError, NotOurs, PositionsError) as exc:
            await self._done(target, outcome, False, str(exc))
        except ConnectError as exc:
            if exc.rebalancing:
                raise
            await self._done(target, outcome, False, f"Kafka Connect refused: {exc.message}")

    async def refuse(self, target: Target, outcome: Outcome, why: str) -> None:
        """End the operation asked as Failed, without a call to Connect."""
        await self._done(target, outcome, False, why)

    def _kafka_id(self, target: Target) -> str:
        """The id of the Kafka the connector's Kafka Connect uses ("" until it is known): the Kafka a seek's
        positions must be in, whichever bootstrap list they were looked up through. (A Debezium source's signal
        topic may be on another Kafka: `signal.kafka.bootstrap.servers` says which.)"""
        return self.clusters.kafka_ids().get(target.cluster) or ""

    def _seekable(self, target: Target) -> tuple[list[str], str]:
        """A sink connector's topics (and topics regex), where a seek can find its positions; or why not."""
        assert target.offsets_request is not None and target.offsets_request.start is not None
        found = offsets.sink_topics(target.config)
        assert found is not None  # a source connector's seek is a snapshot (`offsets.request_for`)
        if not (self.clusters.kafka_bootstrap(target.cluster) or self.kafka_bootstrap):
            raise offsets.OffsetsInputError(
                f"spec.seek: ConnectCluster {target.cluster} names no Kafka (spec.kafkaBootstrapServers) and the "
                "operator has none (chart value kafka.bootstrap): the offsets at a time cannot be looked up"
            )
        try:
            target.offsets_request.start.check(int(time.time() * 1000), "spec.seek.startFrom")
        except StartFromError as exc:
            raise offsets.OffsetsInputError(str(exc)) from None
        return found

    async def _to_apply(self, target: Target, source: str) -> dict[str, Any]:
        assert target.offsets_request is not None
        data = await self.kube.configmap_data(target.namespace, target.offsets_request.configmap)
        if data is None:
            raise offsets.OffsetsInputError(f"{source} not found")
        return offsets.parse(data.get(offsets.CONFIGMAP_KEY), source)

    async def _done(self, target: Target, outcome: Outcome, ok: bool, message: str, **listed: str | int) -> None:
        """End the operation: the result into status (with Event), the annotations removed."""
        assert target.offsets_request is not None
        operation = target.offsets_request.operation
        message = truncate(redact(message, target.secrets), MESSAGE_CHARS)
        previous = dict(target.status.get("offsets") or {})
        records = listed.pop("records", None)  # a seek's: how many records the connector reads again
        outcome.offsets = {
            **previous,
            **listed,
            "lastOperation": {
                "operation": operation,
                "result": "Succeeded" if ok else "Failed",
                "message": message,
                "time": format_time(utcnow()),
                **({"records": records} if records is not None else {}),
            },
        }
        outcome.seek_nonce = target.offsets_request.nonce
        target.offsets_request = None  # the annotations go once the status says how it ended
        log.log(
            logging.INFO if ok else logging.WARNING,
            "offsets %s: %s",
            operation,
            message,
            extra={"namespace": target.namespace, "resource": target.name},
        )
        reason = {
            "list": "OffsetsListed",
            "reset": "OffsetsReset",
            "alter": "OffsetsAltered",
            "seek": "Repositioned",
            "snapshot": "SnapshotRequested",
        }[operation]
        self.publisher.event(target, reason if ok else "OffsetsFailed", f"{operation}: {message}", warning=not ok)


def _send(signal: offsets.SnapshotSignal) -> None:
    """Write the signal and wait until Kafka has it (blocking: run in a thread)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": signal.bootstrap, "message.timeout.ms": 15_000})
    producer.produce(signal.topic, key=signal.key.encode(), value=signal.value.encode())
    if producer.flush(20) != 0:
        raise PositionsError(f"the signal topic {signal.topic} on {signal.bootstrap} did not take the signal")
