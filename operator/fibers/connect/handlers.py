"""kopf handlers for Connect and ConnectCluster: thin, they only pass each watch event on."""

from __future__ import annotations

from typing import Any

import kopf

from fibers.api import GROUP, VERSION
from fibers.connect.clusters import PLURAL as CLUSTERS
from fibers.connect.registry import ConnectClusters
from fibers.connect.spec import KIND, PLURAL
from fibers.connect.sync import ConnectSync
from fibers.readiness import Readiness
from fibers.reconciles import Reconciles


@kopf.on.event(GROUP, VERSION, PLURAL)
async def connect_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Creations, changes, deletions and the listing at start-up alike: the loop is level-triggered."""
    readiness: Readiness = memo.readiness  # the pod is Ready once kopf has handed over what existed
    readiness.seen(PLURAL, body["metadata"]["namespace"], body["metadata"]["name"])
    sync: ConnectSync = memo.connect
    await sync.observe(event.get("type"), body)
    reconciles: Reconciles = memo.reconciles  # Transforms and consumers reading its topics look again
    reconciles.changed(KIND, body["metadata"]["namespace"], body["metadata"]["name"])


@kopf.on.event(GROUP, VERSION, CLUSTERS)
async def connect_cluster_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """ConnectClusters (cluster-scoped): kopf watches them cluster-wide even when it serves a few namespaces."""
    readiness: Readiness = memo.readiness
    readiness.seen(CLUSTERS, None, body["metadata"]["name"])
    registry: ConnectClusters = memo.connect_clusters
    await registry.observe(event.get("type"), dict(body))


@kopf.on.event("", "v1", "namespaces")
async def namespace_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A namespace's labels decide which ConnectClusters its Connects may use."""
    registry: ConnectClusters = memo.connect_clusters
    registry.namespace_event(event.get("type"), dict(body))
