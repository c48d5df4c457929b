"""kopf handlers for Transform: thin, each hands the Transform to the reconcile queue.

There is no timer: a Transform is looked at when its spec changes, when one of its SparkApplications
changes (`fibers.watches`, wired in `fibers.controller`: a server-side label selector, where a kopf
handler would list every SparkApplication in the cluster), when a resource its inputs reference
changes, at the time it asked for (its next schedule slot, a submission deadline) and at the queue's
slow resync (`fibers.reconciles`).

There is no finalizer either: a Transform's SparkApplications go by their owner references, and its
metric series and queue entry go when its DELETED event arrives. A deletion handler (kopf.on.delete)
would need kopf's finalizer, and with it a running operator before the Transform, or its namespace,
could be deleted. kopf removes the finalizer earlier versions added.
"""

from __future__ import annotations

from typing import Any

import kopf

from fibers import metrics
from fibers.api import GROUP, VERSION
from fibers.readiness import Readiness
from fibers.reconciles import Reconciles
from fibers.transform.spec import KIND, PLURAL


@kopf.on.event(GROUP, VERSION, PLURAL)
async def transform_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Found at start-up, new, or changed: looked at now; our own status writes are no change (`fibers.changes`),
    but the Transforms and consumers reading its output look again at any. Gone: its series and queue entry
    go with it (a missed DELETED leaves only series, until a restart)."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    readiness: Readiness = memo.readiness  # the pod is Ready once kopf has handed over what existed
    readiness.seen(PLURAL, namespace, name)
    reconciles: Reconciles = memo.reconciles
    if reconciles.observe(KIND, event.get("type"), body["metadata"]):
        await reconciles.retire(KIND, namespace, name)  # a reconcile in flight sets no series after this
        metrics.forget_transform(namespace, name)
    reconciles.changed(KIND, namespace, name)
