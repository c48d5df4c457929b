"""The steps of an offsets operation on a connector (`fibers.dev/offsets`: list, reset, alter): stop it,
then list its offsets into a ConfigMap, reset them, or alter them from one; how it ended goes into
status and an Event, and the connector then returns to its desired state."""

from __future__ import annotations

import logging
from typing import Any

from fibers.api import object_ref
from fibers.conditions import format_time, utcnow
from fibers.connect import offsets
from fibers.connect.publisher import Publisher
from fibers.connect.reconcile import Outcome, Step, Target
from fibers.connect.rest import ConnectClient, ConnectError
from fibers.connect.spec import KIND
from fibers.kube import Kube, NotOurs
from fibers.redact import MESSAGE_CHARS, redact, truncate

log = logging.getLogger("fibers.connect")


class OffsetSteps:
    def __init__(self, kube: Kube, publisher: Publisher) -> None:
        self.kube, self.publisher = kube, publisher

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
        except (offsets.OffsetsInputError, NotOurs) as exc:
            await self._done(target, outcome, False, str(exc))
        except ConnectError as exc:
            if exc.rebalancing:
                raise
            await self._done(target, outcome, False, f"Kafka Connect refused: {exc.message}")

    async def _to_apply(self, target: Target, source: str) -> dict[str, Any]:
        assert target.offsets_request is not None
        data = await self.kube.configmap_data(target.namespace, target.offsets_request.configmap)
        if data is None:
            raise offsets.OffsetsInputError(f"{source} not found")
        return offsets.parse(data.get(offsets.CONFIGMAP_KEY), source)

    async def _done(self, target: Target, outcome: Outcome, ok: bool, message: str, **listed: str) -> None:
        """End the operation: the result into status (with Event), the annotations removed."""
        assert target.offsets_request is not None
        operation = target.offsets_request.operation
        message = truncate(redact(message, target.secrets), MESSAGE_CHARS)
        previous = dict(target.status.get("offsets") or {})
        outcome.offsets = {
            **previous,
            **listed,
            "lastOperation": {
                "operation": operation,
                "result": "Succeeded" if ok else "Failed",
                "message": message,
                "time": format_time(utcnow()),
            },
        }
        target.offsets_request = None  # the annotations go once the status says how it ended
        log.log(
            logging.INFO if ok else logging.WARNING,
            "offsets %s: %s",
            operation,
            message,
            extra={"namespace": target.namespace, "resource": target.name},
        )
        reason = {"list": "OffsetsListed", "reset": "OffsetsReset", "alter": "OffsetsAltered"}[operation]
        self.publisher.event(target, reason if ok else "OffsetsFailed", f"{operation}: {message}", warning=not ok)
