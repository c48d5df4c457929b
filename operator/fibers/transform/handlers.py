"""kopf handlers for Transform: thin, each asks the reconciler to look at one Transform."""

from __future__ import annotations

from typing import Any

import kopf

from fibers import metrics
from fibers.api import GROUP, VERSION
from fibers.outages import api_outage_is_temporary
from fibers.transform import sparkapp
from fibers.transform.reconciler import TransformReconciler
from fibers.transform.spec import PLURAL


# The same shape as databus/handlers.py, on purpose: the kinds know nothing of each other (an
# import-linter contract), and three lines of kopf wiring are not worth a shared module.
def _reconciler(memo: Any) -> TransformReconciler:
    reconciler: TransformReconciler = memo.transform
    return reconciler


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
async def transform_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    with api_outage_is_temporary():
        await _reconciler(memo).reconcile(body["metadata"]["namespace"], body["metadata"]["name"])


@kopf.timer(GROUP, VERSION, PLURAL, interval=5, initial_delay=5, backoff=5)
async def transform_tick(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Schedules, submission deadlines and connectRef topics need a look even when nothing changes."""
    with api_outage_is_temporary():
        await _reconciler(memo).reconcile(body["metadata"]["namespace"], body["metadata"]["name"])


@kopf.on.event(sparkapp.GROUP, sparkapp.VERSION, sparkapp.PLURAL, labels={sparkapp.LABEL_TRANSFORM: kopf.PRESENT})
async def run_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A SparkApplication moved on: mirror it into its Transform."""
    owner = body["metadata"]["labels"][sparkapp.LABEL_TRANSFORM]
    with api_outage_is_temporary():
        await _reconciler(memo).reconcile(body["metadata"]["namespace"], owner)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
async def transform_deleted(body: kopf.Body, **_: Any) -> None:
    """Its series go with it (the SparkApplications go by their owner references)."""
    metrics.forget_transform(body["metadata"]["namespace"], body["metadata"]["name"])
