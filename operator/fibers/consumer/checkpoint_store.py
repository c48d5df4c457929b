"""Checkpoints in a ConfigMap: compare-and-swap on resourceVersion, fenced, throttled.

Several instances of one consumer share the ConfigMap, each owning different timelines
(partitions). A write re-reads on conflict and replaces only its own keys, so instances never
overwrite each other. Timelines are held exclusively through Leases (`fibers.consumer.ownership`),
and fenced here too: once it holds the Lease, a new owner *claims* the timeline (raises its recorded
token and reads the checkpoint in one compare-and-swap) before it consumes, and a write carrying a
lower token than the recorded one is refused — so a pod that lost a partition (and perhaps does not
know it yet) cannot move its checkpoint backwards. Writes are throttled (at most one per `min_interval`); a throttled
checkpoint stays pending and goes out with the next write or at shutdown. Per-instance figures
(events, lag, mode) ride along as annotations, for the operator to mirror into status.

The API server goes away now and then (a restart, priority-and-fairness throttling): every read and
write here is tried again with backoff while it does, the consumer pausing meanwhile, rather than
ending the process. Losing a pending checkpoint is never a loss of data (its windows are replayed),
so only a stopping consumer gives up, after API_SHUTDOWN_WAIT_SECONDS.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from fibers import failpoints
from fibers.conditions import format_time, utcnow
from fibers.consumer.tuning import (
    API_RETRY_BASE_SECONDS,
    API_RETRY_CAP_SECONDS,
    API_SHUTDOWN_WAIT_SECONDS,
    API_WAIT_NOTICE_SECONDS,
    CHECKPOINT_CONFLICT_TRIES,
)
from fibers.databus.checkpoint import Checkpoint, CheckpointError
from fibers.databus.owners import LABEL_CONSUMER, foreign_checkpoint
from fibers.databus.timelines import (
    OWNERS_ANNOTATION,
    SOURCES_HASH_KEY,
    STATS_ANNOTATION,
    STOPPED_ANNOTATION,
    Checkpoints,
    sources_hash,
)
from fibers.kubeapi import Api, ApiError, Unreachable, path, retry_delay, transient

log = logging.getLogger("fibers.consumer.checkpoint")
T = TypeVar("T")


class Contended(Unreachable):
    """Every compare-and-swap of a run lost to another writer: tried again later, like an outage."""


class StoreUnavailable(Unreachable):
    """The API server did not answer before a stopping consumer gave up on it."""


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
        self.consumer = self.labels.get(LABEL_CONSUMER)  # whose checkpoints these are (`owners`)
        self.pending: dict[str, Checkpoint] = {}
        self.stats_source: Callable[[], dict[str, Any]] = dict
        self.last_write = time.monotonic()  # the first write waits its turn too
        self.writes = 0
        self.written: dict[str, float] = {}  # timeline key → Unix time of our last write of it (or our claim)
        self.tokens: dict[str, int] = {}  # timeline key → our fencing token, from claim()
        # timeline key → the uid of the ConfigMap our claim was made in: one made again since (the checkpoints
        # deleted, then a new owner's claim) counts its tokens from 1 again, so only its uid tells it apart
        self.claimed_in: dict[str, str] = {}
        self.fenced: set[str] = set()  # timelines a write found claimed by a newer owner (the consumer drops them)
        self.stopping: Callable[[], bool] = lambda: False  # the consumer is shutting down: wait for the API less
        self.pause: Callable[[float], object] = time.sleep  # the wait between tries (the consumer's: cut by a stop)
        self.waiting_since: float | None = None  # Unix time the API server stopped answering us (None: it answers)
        self._give_up_at: float | None = None  # once stopping: when (monotonic) to stop waiting for the API server
        self._stop_recorded = False  # the ConfigMap says why an earlier instance stopped: cleared on progress

    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        """`call()` until it goes through; a transient failure (no answer, 429, 5xx, contention) is tried
        again after a backoff (Retry-After when the server gives one) while the consumer waits."""
        started, attempt, told = time.monotonic(), 0, False
        while True:
            try:
                result = call()
            except (ApiError, Unreachable) as exc:
                if not (transient(exc) or isinstance(exc, Contended)):
                    raise
                delay = retry_delay(exc, attempt, base=API_RETRY_BASE_SECONDS, cap=API_RETRY_CAP_SECONDS)
                attempt += 1
                if self.waiting_since is None:
                    self.waiting_since = time.time()
                if time.monotonic() - started >= API_WAIT_NOTICE_SECONDS and not told:
                    told = True
                    log.warning("waiting for the API server", extra={"doing": what, "error": str(exc)})
                if self.stopping():  # one budget for every wait of a stopping consumer, its last checkpoint's included
                    if self._give_up_at is None:
                        self._give_up_at = time.monotonic() + API_SHUTDOWN_WAIT_SECONDS
                    left = self._give_up_at - time.monotonic()
                    if left <= 0:
                        raise StoreUnavailable(f"{what}: {exc}") from None
                    time.sleep(min(delay, left))
                else:
                    self.pause(delay)
                continue
            if told:
                log.info("the API server answers again", extra={"doing": what, "seconds": time.monotonic() - started})
            self.waiting_since = None
            return result

    def _contended(self) -> Contended:
        return Contended(f"ConfigMap {self.namespace}/{self.name}: too many concurrent writers")

    def _read(self) -> dict[str, Any] | None:
        """The ConfigMap; CheckpointError when one of its name exists that is not this consumer's."""
        failpoints.hit("checkpoint.read", Unreachable)
        cm = self.api.get_or_none(self.url)
        if self.consumer and (conflict := foreign_checkpoint(cm, self.consumer)):
            raise CheckpointError(conflict)
        return cm

    def load(self) -> Checkpoints:
        """Every stored checkpoint; raises CheckpointError on a malformed one (never resets it)."""
        cm = self._retrying("reading checkpoints", self._read)
        if cm is None:
            return Checkpoints(self.sources)
        # Cleared once this instance gets past where the last one stopped (a checkpoint moved, a record passed):
        # clearing at start would make the condition flap while a new pod stops on the same record again.
        self._stop_recorded = bool((cm["metadata"].get("annotations") or {}).get(self.stopped_key))
        return Checkpoints.from_configmap_data(cm.get("data") or {}, self.sources)

    def claim(self, key: str) -> tuple[int, Checkpoints]:
        """Become the owner of timeline `key`: (our fencing token, every stored checkpoint).

        Called once this process holds the timeline's Lease. One compare-and-swap raises the
        timeline's recorded token by one and reads the checkpoints, so no write by an earlier owner
        can land between our read and our first write, and every later write of theirs is refused.
        The token is counted here rather than taken from the Lease, because a Lease can be deleted
        and made again (its leaseTransitions start over) while the ConfigMap is kept.
        """
        return self._retrying(f"claiming {key}", lambda: self._claim(key))

    def _claim(self, key: str) -> tuple[int, Checkpoints]:
        for _ in range(CHECKPOINT_CONFLICT_TRIES):
            cm = self._read()
            owners = _owners(cm)
            token = owners.get(key, 0) + 1
            written = self._write(cm, {}, {OWNERS_ANNOTATION: json.dumps({**owners, key: token}, sort_keys=True)})
            if written is None:
                continue
            self.tokens[key] = token
            self.claimed_in[key] = written["metadata"]["uid"]
            self.written[key] = time.time()
            self.fenced.discard(key)
            return token, Checkpoints.from_configmap_data((cm or {}).get("data") or {}, self.sources)
        raise self._contended()

    def _write(
        self, cm: dict[str, Any] | None, data: dict[str, str], annotations: dict[str, str]
    ) -> dict[str, Any] | None:
        """Merge these keys into the ConfigMap as read (`cm`; None: create it): the ConfigMap written, or
        None if someone wrote since."""
        failpoints.hit("checkpoint.write", Unreachable)
        try:
            if cm is None:
                meta = {"name": self.name, "labels": self.labels, "annotations": annotations}
                body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
                written = self.api.create(path("v1", "configmaps", self.namespace), body)
            else:
                cm["data"] = {**(cm.get("data") or {}), **data}
                cm["metadata"]["annotations"] = {**(cm["metadata"].get("annotations") or {}), **annotations}
                # resourceVersion from the read makes this a compare-and-swap: 409 if anyone wrote since.
                written = self.api.replace(self.url, cm)
        except ApiError as exc:
            if exc.status == 409:
                return None
            raise
        failpoints.hit("checkpoint.write.done", Unreachable)
        return written

    @property
    def stopped_key(self) -> str:
        return f"{STOPPED_ANNOTATION}{self.instance}"

    def record_stop(self, message: str) -> None:
        """Say on the ConfigMap why this instance stopped for good ("" clears it), for the operator's condition."""

        def write() -> None:
            for _ in range(CHECKPOINT_CONFLICT_TRIES):
                if self._write(self._read(), {}, {self.stopped_key: message}) is not None:
                    return
            raise self._contended()

        self._retrying("recording why the instance stopped", write)

    def clear_stop(self) -> None:
        """The consumer got past where an earlier instance stopped: take its reason off the ConfigMap."""
        if self._stop_recorded:
            self.record_stop("")
            self._stop_recorded = False

    def forget(self, key: str) -> None:
        """Stop writing timeline `key` (given up or lost): its pending checkpoint is dropped."""
        self.tokens.pop(key, None)
        self.claimed_in.pop(key, None)
        self.pending.pop(key, None)
        self.written.pop(key, None)

    def save(self, timelines: Mapping[str, Checkpoint], *, force: bool = False) -> bool:
        """Record these checkpoints; write now if forced or the throttle allows. True when written."""
        self.pending.update(timelines)
        if not force and time.monotonic() - self.last_write < self.min_interval:
            return False
        return self.flush()

    def flush(self) -> bool:
        """Write what is pending (True when written); waits out an API server that does not answer."""
        if not self.pending:
            return False
        return self._retrying("writing checkpoints", self._flush)

    def _flush(self) -> bool:
        stats = {**self.stats_source(), "lastCheckpointTime": format_time(utcnow())}
        annotations = {f"{STATS_ANNOTATION}{self.instance}": json.dumps(stats, sort_keys=True)}
        if self._stop_recorded:
            annotations[self.stopped_key] = ""
        for _ in range(CHECKPOINT_CONFLICT_TRIES):
            cm = self._read()
            # Gone since our claim made or read it: a seek (or `retention: Delete`) dropped the checkpoints.
            # Writing would make it again with our old positions, and the seek would be undone unseen; so
            # would writing into one made again since (another uid), whatever tokens it records.
            uid = None if cm is None else cm["metadata"].get("uid")
            gone = {key for key in self.pending if uid is None or self.claimed_in.get(key, uid) != uid}
            if fenced := gone | fenced_keys(_owners(cm), self.tokens, self.pending):  # both, each flush
                log.warning("checkpoint refused: a newer owner holds the timeline", extra={"timelines": sorted(fenced)})
                self.fenced |= fenced
                for key in fenced:
                    self.forget(key)
                if not self.pending:
                    return False
            updates = {key: cp.to_json() for key, cp in self.pending.items()}
            updates[SOURCES_HASH_KEY] = sources_hash(self.sources)
            if self._write(cm, updates, annotations) is None:
                continue
            written = time.time()
            self.written.update(dict.fromkeys(self.pending, written))
            self.pending.clear()
            self._stop_recorded = False
            self.last_write = time.monotonic()
            self.writes += 1
            return True
        raise self._contended()
