"""kopf handlers for DatabusConsumer: thin, each hands the consumer to the reconcile queue.

There is no timer: the consumer is looked at when its spec changes, when one of its children changes
(its StatefulSet, its pods, its checkpoint ConfigMap: `fibers.watches`, wired in `fibers.controller`),
when a resource its sourceRefs name changes, and at the queue's slow resync (`fibers.reconciles`).
"""

from __future__ import annotations

from typing import Any

import kopf

from fibers import metrics
from fibers.api import FINALIZER, GROUP, VERSION
from fibers.databus.reconciler import DatabusReconciler
from fibers.databus.workload import KIND, PLURAL
from fibers.readiness import Readiness
from fibers.reconciles import Reconciles


@kopf.on.event(GROUP, VERSION, PLURAL)
async def consumer_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Found at start-up, new, or changed: looked at now; our own status writes are no change (`fibers.changes`).

    Not before it carries kopf's finalizer: kopf adds it after this handler has run, and a consumer whose
    StatefulSet was made before it could be deleted without its delete handler (checkpoint retention).
    The event that shows the finalizer hands it over."""
    readiness: Readiness = memo.readiness  # the pod is Ready once kopf has handed over what existed
    readiness.seen(PLURAL, body["metadata"]["namespace"], body["metadata"]["name"])
    if event.get("type") != "DELETED" and FINALIZER not in (body["metadata"].get("finalizers") or []):
        return
    reconciles: Reconciles = memo.reconciles
    reconciles.observe(KIND, event.get("type"), body["metadata"])


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def consumer_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The StatefulSet and the Leases go with their owner; the checkpoint ConfigMap stays unless retention is Delete."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    readiness: Readiness = memo.readiness  # found being deleted at start-up: handed over all the same
    readiness.seen(PLURAL, namespace, name)
    reconciles: Reconciles = memo.reconciles
    await reconciles.retire(KIND, namespace, name)  # a reconcile in flight sets no series after this
    metrics.forget_consumer(namespace, name)
    reconciler: DatabusReconciler = memo.databus
    reconciler.forget(namespace, name)
    if ((body["spec"].get("checkpoint") or {}).get("retention") or "Retain") != "Delete":
        return
    await reconciler.delete_checkpoints(dict(body))
