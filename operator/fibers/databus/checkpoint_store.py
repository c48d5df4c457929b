"""Checkpoints in a ConfigMap: compare-and-swap on resourceVersion, throttled.

Several instances of one consumer share the ConfigMap, each owning different timelines
(partitions). A write re-reads on conflict and replaces only its own keys, so instances never
overwrite each other. Writes are throttled (at most one per `min_interval`); a throttled
checkpoint stays pending and goes out with the next write or at shutdown. Per-instance figures
(events, lag, mode) ride along as annotations, for the operator to mirror into status.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from fibers.conditions import format_time, utcnow
from fibers.databus.checkpoint import SOURCES_HASH_KEY, Checkpoint, Checkpoints, sources_hash
from fibers.kubeapi import Api, ApiError, path

log = logging.getLogger("fibers.databus.checkpoint")
STATS_ANNOTATION = "fibers.dev/stats-"


class CheckpointStore:
    def __init__(
        self,
        api: Api,
        namespace: str,
        name: str,
        sources: list[str],
        *,
        instance: int,
        min_interval: float = 1.0,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.url = path("v1", "configmaps", namespace, name)
        self.sources, self.instance, self.min_interval = sources, instance, min_interval
        self.labels = dict(labels or {})
        self.pending: dict[str, Checkpoint] = {}
        self.stats_source: Callable[[], dict[str, Any]] = dict
        self.last_write = time.monotonic()  # the first write waits its turn too
        self.writes = 0

    def load(self) -> Checkpoints:
        """Every stored checkpoint; raises CheckpointError on a malformed one (never resets it)."""
        cm = self.api.get_or_none(self.url)
        if cm is None:
            return Checkpoints(self.sources)
        return Checkpoints.from_configmap_data(cm.get("data") or {}, self.sources)

    def save(self, timelines: Mapping[str, Checkpoint], *, force: bool = False) -> bool:
        """Record these checkpoints; write now if forced or the throttle allows. True when written."""
        self.pending.update(timelines)
        if not force and time.monotonic() - self.last_write < self.min_interval:
            return False
        return self.flush()

    def flush(self) -> bool:
        if not self.pending:
            return False
        updates = {key: cp.to_json() for key, cp in self.pending.items()}
        updates[SOURCES_HASH_KEY] = sources_hash(self.sources)
        stats = {**self.stats_source(), "lastCheckpointTime": format_time(utcnow())}
        annotations = {f"{STATS_ANNOTATION}{self.instance}": json.dumps(stats, sort_keys=True)}
        for _ in range(10):
            cm = self.api.get_or_none(self.url)
            try:
                if cm is None:
                    meta = {"name": self.name, "labels": self.labels, "annotations": annotations}
                    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": updates}
                    self.api.create(path("v1", "configmaps", self.namespace), body)
                else:
                    cm["data"] = {**(cm.get("data") or {}), **updates}
                    cm["metadata"]["annotations"] = {**(cm["metadata"].get("annotations") or {}), **annotations}
                    # resourceVersion from the read makes this a compare-and-swap: 409 if anyone wrote since.
                    self.api.replace(self.url, cm)
            except ApiError as exc:
                if exc.status == 409:
                    continue
                raise
            self.pending.clear()
            self.last_write = time.monotonic()
            self.writes += 1
            return True
        raise RuntimeError(f"ConfigMap {self.namespace}/{self.name}: too many concurrent writers")
