"""Pods that will not start by waiting: what the kubelet and the scheduler say, for the resource to say at once.

A driver whose image cannot be pulled, a consumer pod whose Secret key is missing, an executor asking for
more CPU than any node has: the pod sits in Pending (ImagePullBackOff, CreateContainerConfigError,
Unschedulable) and, without this, the resource said only "waiting for its driver" until a deadline ran
out. `trouble` reads one pod and answers the reason and the kubelet's (or scheduler's) own message. An
unschedulable pod counts once it has been so for `UNSCHEDULABLE_AFTER` (a cluster autoscaler may be
adding a node; a moment's wait for a pod being placed is normal). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from fibers.conditions import parse_time

# Container waiting reasons that do not clear by themselves (an image or a Secret must change first).
STUCK_REASONS = frozenset(
    {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError"}
)
UNSCHEDULABLE_AFTER = timedelta(seconds=10)  # how long a pod may wait to be placed before it is said


@dataclass(frozen=True)
class Trouble:
    pod: str
    reason: str  # the kubelet's or the scheduler's: ImagePullBackOff, Unschedulable, …
    message: str

    def describe(self) -> str:
        return f"pod {self.pod}: {self.reason}: {self.message}".rstrip(": ")


def trouble(pod: dict[str, Any], now: datetime) -> Trouble | None:
    """Why this pod will not start by waiting, or None (running, finished, or still on its way)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") not in (None, "Pending"):
        return None
    name = str(meta.get("name", ""))
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_REASONS:
            return Trouble(name, str(waiting["reason"]), str(waiting.get("message") or ""))
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            since = condition.get("lastTransitionTime")
            if since and now - parse_time(since) >= UNSCHEDULABLE_AFTER:
                return Trouble(name, "Unschedulable", str(condition.get("message") or ""))
    return None


def first(pods: list[dict[str, Any]], now: datetime) -> Trouble | None:
    """The first pod in trouble, by name (a stable answer for a status)."""
    found = [t for t in (trouble(p, now) for p in pods) if t is not None]
    return min(found, key=lambda t: t.pod) if found else None


def due(pods: list[dict[str, Any]], now: datetime) -> datetime | None:
    """When an unschedulable pod, not said yet, will have waited `UNSCHEDULABLE_AFTER` (None: none is):
    nothing else changes then, so the owner asks to be looked at again at that time."""
    times = []
    for pod in pods:
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
                at = (
                    parse_time(condition["lastTransitionTime"]) + UNSCHEDULABLE_AFTER
                    if condition.get("lastTransitionTime")
                    else None
                )
                if at is not None and at > now:
                    times.append(at)
    return min(times) if times else None
