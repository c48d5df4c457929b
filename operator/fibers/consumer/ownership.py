"""Who consumes which timeline: one `coordination.k8s.io` Lease per partition, held by the pod consuming it.

A DatabusConsumer's instances are the pods of one StatefulSet. Pod `<name>-i` of n wants the partitions
p with p % n == i; n is read from the StatefulSet while the pod runs, so `kubectl scale` (the
DatabusConsumer's scale subresource) moves only the partitions whose owner changes, without a restart.
Wanting is not owning: a pod consumes a partition only while it holds that partition's Lease. When n
changes, the pod that loses a partition writes its last checkpoint and empties the Lease's holder; the pod
that gains it takes the Lease, and only then reads the checkpoint. So one partition is never consumed by
two pods at once, whatever order the pods notice the change in.

Holding the Lease, the new owner claims the timeline in the checkpoint ConfigMap, which raises its fencing
token; a write carrying a lower token is refused (`checkpoint_store`). So a pod that stalled past its Lease
(a long GC pause, a partitioned node) cannot move a checkpoint backwards.

Expiry is judged the way client-go's leader election judges it: by how long this process has seen the
same record unchanged, by its own clock — never by comparing another machine's clock with ours.
Why Leases and not the Kafka group protocol: `docs/architecture.md`, "Ownership while scaling".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fibers import failpoints
from fibers.conditions import utcnow
from fibers.consumer.tuning import (
    LEASE_DURATION_SECONDS,
    LEASE_RENEW_DEADLINE_SECONDS,
    LEASE_RENEW_SECONDS,
    LEASE_THREAD_JOIN_SECONDS,
)
from fibers.databus import owners
from fibers.databus.timelines import timeline_key
from fibers.kubeapi import Api, ApiError, Unreachable, path

log = logging.getLogger("fibers.consumer.ownership")
LEASE_WRITE_TRIES = 2  # a write that met a conflict is tried once more on the Lease as the server has it


def wanted(partitions: Iterable[int], replicas: int, ordinal: int) -> list[int]:
    """The partitions instance `ordinal` of `replicas` consumes: p % replicas == ordinal."""
    return sorted(p for p in partitions if replicas > 0 and p % replicas == ordinal)


def ordinal_of(pod_name: str) -> int:
    """A StatefulSet pod's ordinal: the number after its last dash (`orders-2` → 2)."""
    head, _, tail = pod_name.rpartition("-")
    if not head or not tail.isdigit():
        raise ValueError(f"{pod_name!r} is not the name of a StatefulSet's pod (<name>-<ordinal>)")
    return int(tail)


def lease_name(consumer: str, topic: str, partition: int) -> str:
    """The Lease of one partition: a DNS subdomain from the consumer, the topic and the partition."""
    return f"{owners.lease_prefix(consumer, topic)}-p{partition}"


def _micro_time() -> str:
    return utcnow().strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class _Seen:
    """A Lease record another holder owns, and when (by our clock) we first saw it as it is."""

    record: tuple[Any, ...]
    since: float


@dataclass
class Held:
    """A Lease this process holds: its name, its transitions when we took it, its last renewal (monotonic),
    and the object as we last wrote it (the next renewal replaces it: one call, a compare-and-swap)."""

    name: str
    transitions: int
    renewed: float
    record: dict[str, Any]


class Leases:
    """The partition Leases of one consumer process: taken, renewed in a thread of their own, released.

    `overdue()` is what the consumer asks before it hands on windows: a Lease not renewed for
    LEASE_RENEW_DEADLINE_SECONDS counts as lost here, well before anyone else may take it
    (LEASE_DURATION_SECONDS), so the pause between asking and handing on has a margin.
    """

    def __init__(
        self,
        api: Api,
        namespace: str,
        holder: str,
        *,
        labels: dict[str, str],
        owner: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api, self.namespace, self.holder = api, namespace, holder
        self.labels, self.owner, self.clock = labels, owner, clock
        self.held: dict[str, Held] = {}  # timeline key → its Lease
        self.lost: set[str] = set()  # taken from us, or not renewed in time: to be dropped by the consumer
        self._seen: dict[str, _Seen] = {}
        self._foreign_said: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ----- the consumer's side ---------------------------------------------------------------------

    def overdue(self) -> set[str]:
        """Timelines lost, or not renewed within the deadline (the renewal thread may itself be stuck)."""
        with self._lock:
            if not self.lost and not self.held:
                return set()
            now = self.clock()
            return self.lost | {k for k, h in self.held.items() if now - h.renewed >= LEASE_RENEW_DEADLINE_SECONDS}

    def take(self, key: str, name: str) -> bool:
        """Take the Lease `name` for timeline `key` if it is free, expired or ours; whether we hold it now."""
        url = path("coordination.k8s.io/v1", "leases", self.namespace, name)
        try:
            current = self.api.get_or_none(url)
            now = _micro_time()
            if current is None:
                fresh: dict[str, Any] = {
                    "holderIdentity": self.holder,
                    "leaseDurationSeconds": int(LEASE_DURATION_SECONDS),
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 1,
                }
                meta: dict[str, Any] = {"name": name, "labels": self.labels}
                if self.owner:
                    meta["ownerReferences"] = [self.owner]
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": fresh}
                written = self.api.create(path("coordination.k8s.io/v1", "leases", self.namespace), body)
            elif self._foreign(key, current):
                return False
            else:
                spec = current.get("spec") or {}
                if not self._free(key, spec):
                    return False
                # Every take is a new owner, even our own pod's earlier process: transitions count it.
                current["spec"] = {
                    **spec,
                    "holderIdentity": self.holder,
                    "leaseDurationSeconds": int(LEASE_DURATION_SECONDS),
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": int(spec.get("leaseTransitions") or 0) + 1,
                }
                written = self.api.replace(url, current)  # resourceVersion: a compare-and-swap
        except ApiError as exc:
            if exc.status in (404, 409):  # someone else was quicker; look again next time
                return False
            raise
        transitions = int(written["spec"]["leaseTransitions"])
        with self._lock:
            self.held[key] = Held(name, transitions, self.clock(), written)
            self.lost.discard(key)
            self._seen.pop(key, None)
        log.info("lease taken", extra={"timeline": key, "lease": name, "transitions": transitions})
        return True

    def _foreign(self, key: str, lease: dict[str, Any]) -> bool:
        """A Lease of this name that the consumer's instances did not make is never taken over (its partition
        waits; the operator reports it as a Conflict); said once a timeline."""
        consumer = self.labels.get(owners.LABEL_CONSUMER)
        why = owners.foreign_lease(lease, consumer) if consumer else ""
        if why and key not in self._foreign_said:
            self._foreign_said.add(key)
            log.warning("lease not ours", extra={"timeline": key, "problem": why})
        return bool(why)

    def _free(self, key: str, spec: dict[str, Any]) -> bool:
        holder = spec.get("holderIdentity")
        if not holder or holder == self.holder:
            return True
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
        seen = self._seen.get(key)
        if seen is None or seen.record != record:
            self._seen[key] = _Seen(record, self.clock())
            return False
        duration = float(spec.get("leaseDurationSeconds") or LEASE_DURATION_SECONDS)
        return self.clock() - seen.since > duration

    def forget(self, key: str) -> Held | None:
        """Stop counting a timeline as ours (lost, or about to be released)."""
        with self._lock:
            self.lost.discard(key)
            return self.held.pop(key, None)

    def release(self, key: str) -> None:
        """Give a Lease up (its holder emptied), so the next owner need not wait for it to expire."""
        held = self.forget(key)
        if held is None:
            return
        try:
            self._write_ours(held, {"holderIdentity": None})
        except (ApiError, Unreachable) as exc:  # it will expire instead
            log.warning("lease not released", extra={"timeline": key, "lease": held.name, "error": str(exc)})
        log.info("lease released", extra={"timeline": key, "lease": held.name})

    def release_all(self) -> None:
        self.stop()
        for key in list(self.held):
            self.release(key)

    # ----- renewal, in its own thread ------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._renew_loop, name="lease-renewal", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=LEASE_THREAD_JOIN_SECONDS)

    def _renew_loop(self) -> None:
        while not self._stop.wait(LEASE_RENEW_SECONDS):
            self.renew()

    def renew(self) -> None:
        """Renew every held Lease once; one found taken is lost at once, one not renewed in time soon after."""
        with self._lock:
            held = dict(self.held)
        for key, lease in held.items():
            try:
                failpoints.hit("lease.renew", Unreachable)
                written = self._write_ours(lease, {"renewTime": _micro_time()})
            except (ApiError, Unreachable) as exc:
                if isinstance(exc, ApiError) and exc.status == 404:
                    self._lose(key, "the Lease was deleted")
                elif self.clock() - lease.renewed >= LEASE_RENEW_DEADLINE_SECONDS:
                    self._lose(key, f"not renewed for {LEASE_RENEW_DEADLINE_SECONDS:g} s: {exc}")
                continue
            if written is None:
                self._lose(key, "taken by another holder")
                continue
            with self._lock:
                if key in self.held:
                    self.held[key] = Held(lease.name, lease.transitions, self.clock(), written)

    def _write_ours(self, lease: Held, change: dict[str, Any]) -> dict[str, Any] | None:
        """Apply `change` to a Lease's spec while it is ours: the object as we last wrote it, replaced in one
        call; after a conflict, as the server has it. None when another holder has it now."""
        url = path("coordination.k8s.io/v1", "leases", self.namespace, lease.name)
        current = lease.record
        for attempt in range(LEASE_WRITE_TRIES):
            spec = current.get("spec") or {}
            transitions = int(spec.get("leaseTransitions") or 0)
            if spec.get("holderIdentity") != self.holder or transitions != lease.transitions:
                return None
            try:
                return self.api.replace(url, {**current, "spec": {**spec, **change}})
            except ApiError as exc:
                if exc.status != 409 or attempt:
                    raise
                current = self.api.get(url)
        return None

    def _lose(self, key: str, why: str) -> None:
        with self._lock:
            if self.held.pop(key, None) is not None:
                self.lost.add(key)
        log.warning("lease lost", extra={"timeline": key, "why": why})


@dataclass(frozen=True)
class Members:
    """Where this process stands among a consumer's instances: its ordinal, the name it holds Leases in,
    and how to learn their number.

    In a pod, the number is the StatefulSet's `spec.replicas`, read while it runs; elsewhere (a
    benchmark's or test's own process, restarted in place) it is the configuration's `instances`.
    """

    ordinal: int
    holder: str
    replicas: Callable[[], int]

    @classmethod
    def fixed(cls, name: str, instance: int, instances: int) -> Members:
        return cls(instance, f"{name}-{instance}", lambda: instances)

    @classmethod
    def of_pod(cls, api: Api, namespace: str, statefulset: str, pod: str, uid: str) -> Members:
        """A StatefulSet's pod. Its Leases are held in the name of the pod *and* its uid: a container the
        kubelet restarts takes them back at once (the pod is the same, its old process is gone), while a
        pod made anew under the same name (after a forced deletion, its old container perhaps still
        running somewhere) waits until they are released or expire."""
        url = path("apps/v1", "statefulsets", namespace, statefulset)

        def replicas() -> int:
            return int((api.get(url).get("spec") or {}).get("replicas") or 0)

        return cls(ordinal_of(pod), f"{pod}_{uid}", replicas)


def owned_keys(partitions: Mapping[str, Sequence[int]], replicas: int, ordinal: int) -> dict[str, tuple[str, int]]:
    """Timeline key → (topic, partition) of what instance `ordinal` of `replicas` should consume."""
    return {
        timeline_key(topic, p): (topic, p)
        for topic, parts in partitions.items()
        for p in wanted(parts, replicas, ordinal)
    }
