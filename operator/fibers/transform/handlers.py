"""kopf handlers for Transform: thin, each hands the Transform to the reconcile queue.

There is no timer: a Transform is looked at when its spec changes, when one of its SparkApplications
changes (`fibers.watches`, wired in `fibers.controller`: a server-side label selector, where a kopf
handler would list every SparkApplication in the cluster), when a resource its inputs reference
changes, at the time it asked for (its next schedule slot, a submission deadline) and at the queue's
slow resync (`fibers.reconciles`).
"""

from __future__ import annotations

from typing import Any

import kopf

from fibers import metrics
from fibers.api import GROUP, VERSION
from fibers.reconciles import Reconciles
from fibers.transform.spec import KIND, PLURAL


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
async def transform_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """New, changed, or found at start-up: looked at now."""
    reconciles: Reconciles = memo.reconciles
    reconciles.soon(KIND, body["metadata"]["namespace"], body["metadata"]["name"])


@kopf.on.event(GROUP, VERSION, PLURAL)
async def transform_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Any change, its status's too: the Transforms and consumers reading its output look again."""
    reconciles: Reconciles = memo.reconciles
    reconciles.changed(KIND, body["metadata"]["namespace"], body["metadata"]["name"])


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def transform_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Its series go with it (the SparkApplications go by their owner references).

    Not optional: kopf's finalizer makes sure this runs (the per-object timer used to add it)."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    reconciles: Reconciles = memo.reconciles
    reconciles.forget(KIND, namespace, name)
    metrics.forget_transform(namespace, name)
