"""Checkpoints in a ConfigMap: compare-and-swap on resourceVersion, fenced, throttled.

Several instances of one consumer share the ConfigMap, each owning different timelines
(partitions). A write re-reads on conflict and replaces only its own keys, so instances never
overwrite each other. Timelines are held exclusively through Leases (`fibers.databus.ownership`),
and fenced here too: once it holds the Lease, a new owner *claims* the timeline (raises its recorded
token and reads the checkpoint in one compare-and-swap) before it consumes, and a write carrying a
lower token than the recorded one is refused — so a pod that lost a partition (and perhaps does not
know it yet) cannot move its checkpoint backwards. Writes are throttled (at most one per `min_interval`); a throttled
checkpoint stays pending and goes out with the next write or at shutdown. Per-instance figures
(events, lag, mode) ride along as annotations, for the operator to mirror into status.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fibers.conditions import format_time, utcnow
from fibers.databus.checkpoint import SOURCES_HASH_KEY, Checkpoint, Checkpoints, sources_hash
from fibers.kubeapi import Api, ApiError, path

log = logging.getLogger("fibers.databus.checkpoint")
STATS_ANNOTATION = "fibers.dev/stats-"
OWNERS_ANNOTATION = "fibers.dev/owners"  # {timeline key: fencing token of its owner}


def fenced_keys(recorded: dict[str, int], tokens: dict[str, int], keys: Iterable[str]) -> set[str]:
    """The keys whose recorded owner token is above ours: a newer owner has claimed them."""
    return {key for key in keys if recorded.get(key, 0) > tokens.get(key, 0)}


def _owners(cm: dict[str, Any] | None) -> dict[str, int]:
    raw = ((cm or {}).get("metadata") or {}).get("annotations", {}).get(OWNERS_ANNOTATION)
    return {str(k): int(v) for k, v in json.loads(raw).items()} if raw else {}


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
        self.written: dict[str, float] = {}  # timeline key → Unix time of our last write of it (or our claim)
        self.tokens: dict[str, int] = {}  # timeline key → our fencing token, from claim()
        self.fenced: set[str] = set()  # timelines a write found claimed by a newer owner (the consumer drops them)

    def load(self) -> Checkpoints:
        """Every stored checkpoint; raises CheckpointError on a malformed one (never resets it)."""
        cm = self.api.get_or_none(self.url)
        if cm is None:
            return Checkpoints(self.sources)
        return Checkpoints.from_configmap_data(cm.get("data") or {}, self.sources)

    def claim(self, key: str) -> tuple[int, Checkpoints]:
        """Become the owner of timeline `key`: (our fencing token, every stored checkpoint).

        Called once this process holds the timeline's Lease. One compare-and-swap raises the
        timeline's recorded token by one and reads the checkpoints, so no write by an earlier owner
        can land between our read and our first write, and every later write of theirs is refused.
        The token is counted here rather than taken from the Lease, because a Lease can be deleted
        and made again (its leaseTransitions start over) while the ConfigMap is kept.
        """
        for _ in range(10):
            cm = self.api.get_or_none(self.url)
            owners = _owners(cm)
            token = owners.get(key, 0) + 1
            if not self._write(cm, {}, {OWNERS_ANNOTATION: json.dumps({**owners, key: token}, sort_keys=True)}):
                continue
            self.tokens[key] = token
            self.written[key] = time.time()
            self.fenced.discard(key)
            return token, Checkpoints.from_configmap_data((cm or {}).get("data") or {}, self.sources)
        raise RuntimeError(f"ConfigMap {self.namespace}/{self.name}: too many concurrent writers")

    def _write(self, cm: dict[str, Any] | None, data: dict[str, str], annotations: dict[str, str]) -> bool:
        """Merge these keys into the ConfigMap as read (`cm`; None: create it); False if someone wrote since."""
        try:
            if cm is None:
                meta = {"name": self.name, "labels": self.labels, "annotations": annotations}
                body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
                self.api.create(path("v1", "configmaps", self.namespace), body)
            else:
                cm["data"] = {**(cm.get("data") or {}), **data}
                cm["metadata"]["annotations"] = {**(cm["metadata"].get("annotations") or {}), **annotations}
                # resourceVersion from the read makes this a compare-and-swap: 409 if anyone wrote since.
                self.api.replace(self.url, cm)
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def forget(self, key: str) -> None:
        """Stop writing timeline `key` (given up or lost): its pending checkpoint is dropped."""
        self.tokens.pop(key, None)
        self.pending.pop(key, None)
        self.written.pop(key, None)

    def save(self, timelines: Mapping[str, Checkpoint], *, force: bool = False) -> bool:
        """Record these checkpoints; write now if forced or the throttle allows. True when written."""
        self.pending.update(timelines)
        if not force and time.monotonic() - self.last_write < self.min_interval:
            return False
        return self.flush()

    def flush(self) -> bool:
        if not self.pending:
            return False
        stats = {**self.stats_source(), "lastCheckpointTime": format_time(utcnow())}
        annotations = {f"{STATS_ANNOTATION}{self.instance}": json.dumps(stats, sort_keys=True)}
        for _ in range(10):
            cm = self.api.get_or_none(self.url)
            if fenced := fenced_keys(_owners(cm), self.tokens, self.pending):
                log.warning("checkpoint refused: a newer owner holds the timeline", extra={"timelines": sorted(fenced)})
                self.fenced |= fenced
                for key in fenced:
                    self.forget(key)
                if not self.pending:
                    return False
            updates = {key: cp.to_json() for key, cp in self.pending.items()}
            updates[SOURCES_HASH_KEY] = sources_hash(self.sources)
            if not self._write(cm, updates, annotations):
                continue
            written = time.time()
            self.written.update(dict.fromkeys(self.pending, written))
            self.pending.clear()
            self.last_write = time.monotonic()
            self.writes += 1
            return True
        raise RuntimeError(f"ConfigMap {self.namespace}/{self.name}: too many concurrent writers")
