"""kopf handlers for DatabusConsumer: thin, each asks the reconciler to look at one consumer."""

from __future__ import annotations

from typing import Any

import kopf

from fibers import metrics
from fibers.api import GROUP, VERSION
from fibers.databus import workload
from fibers.databus.reconciler import DatabusReconciler
from fibers.databus.workload import PLURAL
from fibers.kubeapi import path
from fibers.outages import api_outage_is_temporary


# The same shape as transform/handlers.py, on purpose: the kinds know nothing of each other (an
# import-linter contract), and three lines of kopf wiring are not worth a shared module.
def _reconciler(memo: Any) -> DatabusReconciler:
    reconciler: DatabusReconciler = memo.databus
    return reconciler


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
async def consumer_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    with api_outage_is_temporary():
        await _reconciler(memo).reconcile(body["metadata"]["namespace"], body["metadata"]["name"])


@kopf.timer(GROUP, VERSION, PLURAL, interval=3, initial_delay=2, backoff=5)
async def consumer_tick(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Mirror the checkpoints the consumers write into status."""
    with api_outage_is_temporary():
        await _reconciler(memo).reconcile(body["metadata"]["namespace"], body["metadata"]["name"])


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def consumer_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The StatefulSet and the Leases go with their owner; the checkpoint ConfigMap stays unless retention is Delete."""
    metrics.forget_consumer(body["metadata"]["namespace"], body["metadata"]["name"])
    if ((body["spec"].get("checkpoint") or {}).get("retention") or "Retain") != "Delete":
        return
    name = workload.checkpoint_config_map(dict(body))
    await _reconciler(memo).kube.delete(path("v1", "configmaps", body["metadata"]["namespace"], name))
