"""One queue of due reconciles for the kinds that live in the cluster (DatabusConsumer, Transform).

Why not a kopf timer per object: each tick is a few API calls per object, at rest too — with 3 s and
5 s timers that is about 50 requests per resource per minute, so a thousand resources would keep the
API server busy doing nothing. Here a resource is looked at when something it reads changed (its own
spec, a child — see `fibers.watches` —, a resource it references), at the time it asked for (a cron
slot, a submission deadline, a retry while it waits for something that sends no event), and at a
slow resync; all from one heap of due times and a few workers.

A reconcile returns when it wants to be looked at again (`Again`), or None when the resource no
longer exists (it is forgotten).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fibers import memory
from fibers.changes import Changes
from fibers.kube import describe
from fibers.kubeapi import transient
from fibers.logs import Repeats
from fibers.upstream import Dependents
from fibers.wake import sleep_until_woken

log = logging.getLogger("fibers.reconciles")

Key = tuple[str, str, str]  # (kind, namespace, name)
TRIM_SECONDS = 30.0  # while nothing is due, the dispatcher still wakes this often to give freed memory back


@dataclass(frozen=True)
class Again:
    """When a resource wants to be looked at again, besides any change and the resync."""

    at: float = math.inf  # a Unix time: a cron slot, a submission deadline
    waiting: bool = False  # it waits for something that sends no event (a SchemaRegistry, a Schema's id)


Reconcile = Callable[[str, str], Awaitable[Again | None]]  # (namespace, name) -> Again, or None: gone


@dataclass(frozen=True)
class Pacing:
    """How the queue paces its reconciles (FIBERS_RESYNC_SECONDS and friends, see fibers.controller)."""

    # Reconciles running at once. Each is a handful of API calls in worker threads; more did not help
    # on two cores, and a start-up of thousands of resources must not flood the API server.
    workers: int = 4
    # Every resource is looked at again this long after its last look, whatever happened: a missed
    # event or a lost watch cannot leave a status wrong for longer. Strimzi's full reconciliation is
    # every 120 s, but it reads from caches; ours reads from the API server, and at 600 s its share is
    # ~0.5 requests per resource per minute (the budget: 1).
    resync: float = 600.0
    resync_jitter: float = 0.1  # ±10 %: resources created together do not come due together
    # Child events bring at most one reconcile of their owner per this long: a consumer checkpointing
    # every second, or a StatefulSet's pods starting one by one, is one reconcile, not one per event.
    # A change after a quiet spell is looked at at once (a run's driver ending is reported in
    # milliseconds, not after this delay); those that follow within it wait for its end, together.
    child_delay: float = 1.0
    # The same for a Transform's SparkApplications: a run changes state a handful of times (submitted,
    # running, succeeding, completed) and each is worth reporting soon, so they are hardly held back.
    run_delay: float = 0.2
    # The same, for a resource that changed and what reads from it (a sourceRef, a transformRef).
    upstream_delay: float = 0.5
    # A resource waiting for something that sends no event is looked at again this often.
    waiting: float = 30.0
    # A failed reconcile is tried again after retry_min, doubling up to retry_max.
    retry_min: float = 2.0
    retry_max: float = 60.0
    log_every: float = 300.0  # an unchanged failure is logged again this often (once when it starts)


class Reconciles:
    def __init__(self, pacing: Pacing | None = None, dependents: Dependents | None = None) -> None:
        self.pacing = pacing or Pacing()
        self.dependents = dependents or Dependents()
        self._kinds: dict[str, Reconcile] = {}
        self._heap: list[tuple[float, Key]] = []
        self._due: dict[Key, float] = {}
        self._known: set[Key] = set()  # handed over by kopf, not forgotten since
        self._ready: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: dict[Key, float] = {}  # handed to the workers, not taken yet: since when
        self._running: dict[Key, asyncio.Event] = {}  # each reconcile running now, and the event set as it ends
        self._again: set[Key] = set()  # came due while running: looked at once more when it ends
        self._failures: dict[Key, int] = {}
        self._started: dict[Key, float] = {}  # when each known resource's last reconcile started
        self._logged = Repeats(self.pacing.log_every)
        self._wake = asyncio.Event()
        self.changes = Changes()  # what each resource's last watch event showed of what it acts on
        self.done = 0  # reconciles finished, failed ones included

    def register(self, kind: str, reconcile: Reconcile) -> None:
        self._kinds[kind] = reconcile

    def soon(self, kind: str, namespace: str, name: str, delay: float = 0.0) -> None:
        """Look at this resource in `delay` seconds (or sooner, if it is due sooner already).

        Called from kopf's handlers (through `observe`), which makes the resource known to the queue."""
        self._known.add((kind, namespace, name))
        self.at((kind, namespace, name), time.time() + delay)

    def observe(self, kind: str, event_type: str | None, meta: Mapping[str, Any]) -> bool:
        """A watch event of a resource of this kind (kopf.on.event): looked at now if it is new to this
        process or changed what its reconcile acts on (`fibers.changes`), not at our own status writes.
        One being deleted is left to its deletion (a handler, or its children's owner references).

        True when the event ends the resource this process knows under that name (its DELETED, and not
        that of an earlier one of the name): the caller then retires it and drops what it said of it."""
        if event_type == "DELETED":
            return self.changes.gone(kind, meta)
        if not meta.get("deletionTimestamp") and self.changes.changed(kind, meta):
            self.soon(kind, meta["namespace"], meta["name"])
        return False

    def nudge(self, kind: str, namespace: str, name: str, delay: float) -> None:
        """Look at a resource kopf has handed over (a child's event about any other is dropped) now, or,
        when it was looked at less than `delay` ago, `delay` after that look: at most one look per
        `delay` from these events, and none of them left waiting when it arrives after a quiet spell.

        A standby operator (kopf peering) gets no kopf handler calls until it is the active one, so it
        knows no resource and acts on none; the active one knows each from its watch events (`observe`).
        """
        key = (kind, namespace, name)
        if key in self._known:
            self.at(key, max(time.time(), self._started.get(key, -math.inf) + delay))

    def at(self, key: Key, when: float) -> None:
        current = self._due.get(key)
        if current is not None and current <= when:
            return
        self._due[key] = when
        heapq.heappush(self._heap, (when, key))
        if self._heap[0][1] == key:
            self._wake.set()

    def changed(self, kind: str, namespace: str, name: str) -> None:
        """A resource changed (its status too): whatever reads from it looks again."""
        for key in self.dependents.of(kind, namespace, name):
            self.nudge(*key, delay=self.pacing.upstream_delay)

    def forget(self, kind: str, namespace: str, name: str) -> None:
        """The resource is gone: nothing more is due for it (a stale heap entry is skipped)."""
        key = (kind, namespace, name)
        self._known.discard(key)
        self._due.pop(key, None)
        self._failures.pop(key, None)
        self._started.pop(key, None)
        self._logged.ended(key)
        self.dependents.forget(key)

    async def retire(self, kind: str, namespace: str, name: str) -> None:
        """A resource being deleted: forgotten, and back once no reconcile of it runs. What the caller then
        undoes (its series, what was said of it) stays undone: a reconcile that read the resource just
        before the delete has finished by then, and none starts after (the resource reads as deleted)."""
        self.forget(kind, namespace, name)
        if ended := self._running.get((kind, namespace, name)):
            await ended.wait()

    def due(self, kind: str, namespace: str, name: str) -> float | None:
        """When the resource is due next (Unix time), if at all."""
        return self._due.get((kind, namespace, name))

    def behind(self) -> float:
        """Seconds the oldest reconcile handed to the workers has waited for one (0: none waits)."""
        queued = list(self._queued.values())  # read from the metrics server's thread too
        return max(0.0, time.time() - min(queued)) if queued else 0.0

    async def run(self) -> None:
        workers = [asyncio.create_task(self._work(), name=f"reconcile-{i}") for i in range(self.pacing.workers)]
        try:
            await self._dispatch()
        finally:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _dispatch(self) -> None:
        """Hand each key to the workers when its time comes."""
        while True:
            self._wake.clear()
            now = time.time()
            while self._heap and self._heap[0][0] <= now:
                when, key = heapq.heappop(self._heap)
                if self._due.get(key) == when:  # else a stale entry: forgotten, or moved sooner
                    del self._due[key]
                    self._queued.setdefault(key, now)
                    self._ready.put_nowait(key)
            # Quiet now: the pages a burst used (a thousand resources created at once, kopf's relisting
            # of them every few minutes) go back to the OS, so RSS follows the steady state.
            memory.release_free_memory()
            timeout = self._heap[0][0] - now if self._heap else None
            timeout = min(timeout, TRIM_SECONDS) if timeout is not None else TRIM_SECONDS
            await sleep_until_woken(self._wake, timeout)

    async def _work(self) -> None:
        while True:
            key = await self._ready.get()
            self._queued.pop(key, None)
            if key in self._running:
                self._again.add(key)
                continue
            self._running[key] = asyncio.Event()
            if key in self._known:
                self._started[key] = time.time()
            try:
                await self._one(key)
            finally:
                self._running.pop(key).set()
                self.done += 1
            if key in self._again:
                self._again.discard(key)
                if key in self._known:
                    self.at(key, time.time())

    async def _one(self, key: Key) -> None:
        kind, namespace, name = key
        ctx = {"kind": kind, "namespace": namespace, "resource": name}
        try:
            again = await self._kinds[kind](namespace, name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # logged (bounded) and retried: one bad resource must not stop the queue
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
            delay = min(self.pacing.retry_min * 2 ** (failures - 1), self.pacing.retry_max)
            outage = transient(exc)
            message = describe(exc)
            if self._logged.due(key, message):
                if outage:
                    log.warning("the Kubernetes API server did not answer; retrying", extra={**ctx, "error": message})
                else:
                    log.exception("reconcile failed; retrying", extra={**ctx, "retry_seconds": delay})
            self.at(key, time.time() + delay)
            return
        if self._failures.pop(key, None) is not None and self._logged.ended(key):
            log.info("reconciled again after failures", extra=ctx)
        if again is None:
            self.forget(kind, namespace, name)
            return
        if key not in self._known:  # forgotten while it ran (deleted): nothing more is due
            return
        now = time.time()
        jitter = 1 + random.uniform(-self.pacing.resync_jitter, self.pacing.resync_jitter)
        when = min(again.at, now + self.pacing.resync * jitter)
        if again.waiting:
            when = min(when, now + self.pacing.waiting)
        self.at(key, when)
