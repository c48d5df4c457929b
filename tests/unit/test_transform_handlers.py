"""A Transform carries no finalizer: nothing at its end needs the operator (its SparkApplications go by
their owner references), so neither its deletion nor its namespace's waits for a running operator. Its
metric series and queue entry go when its DELETED watch event arrives."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
from prometheus_client import REGISTRY

from fibers import controller, metrics
from fibers.api import GROUP, VERSION
from fibers.readiness import Readiness
from fibers.reconciles import Reconciles
from fibers.transform import handlers
from fibers.transform.spec import KIND, PLURAL

TRANSFORMS = kopf.Resource(GROUP, VERSION, PLURAL)


def test_no_transform_handler_needs_a_finalizer() -> None:
    """kopf adds its finalizer only for handlers that require one, and removes it from an object that
    carries it when none does (kopf/_core/reactor/processing.py, "Removing the finalizer, as there are
    no handlers requiring it"): Transforms of earlier versions lose theirs at their next event, at the
    latest when the operator starts and lists them."""
    assert controller.RECONCILED_KINDS  # importing the controller registers every kind's handlers
    registry = kopf.get_default_registry()
    assert registry._watching.has_handlers(resource=TRANSFORMS)  # the check sees Transform's handlers
    assert [h.id for h in registry._changing.get_resource_handlers(TRANSFORMS) if h.requires_finalizer] == []
    spawning = registry._spawning.get_all_handlers()  # timers and daemons always require one
    assert [h.id for h in spawning if h.selector is not None and h.selector.check(TRANSFORMS)] == []


def _series(name: str) -> list[str]:
    return [
        sample.name
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.labels.get("name") == name and sample.labels.get("namespace") == "shop"
    ]


def test_a_deleted_event_drops_the_transforms_series_and_its_queue_entry() -> None:
    queue = Reconciles()
    queue.soon(KIND, "shop", "gone-etl")
    metrics.transform_submitted("shop", "gone-etl")
    metrics.transform_last_success("shop", "gone-etl", ended_at=1795514490.0, records=42)
    assert _series("gone-etl")
    body: dict[str, Any] = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND}
    body["metadata"] = {"namespace": "shop", "name": "gone-etl", "uid": "u1"}

    async def event(kind: str) -> None:
        handler: Any = handlers.transform_event  # called as kopf calls it, with the keywords it uses
        raw: Any = {"type": kind, "object": body}
        await handler(event=raw, body=kopf.Body(raw["object"]), memo=kopf.Memo(reconciles=queue, readiness=Readiness()))

    asyncio.run(event("MODIFIED"))  # any other event leaves both alone
    assert _series("gone-etl") and queue.due(KIND, "shop", "gone-etl") is not None
    asyncio.run(event("DELETED"))
    assert _series("gone-etl") == []
    assert queue.due(KIND, "shop", "gone-etl") is None
