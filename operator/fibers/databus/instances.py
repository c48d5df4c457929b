"""What a consumer's instances say of themselves, read by the operator for the consumer's condition.

An instance that exits leaves its error as the container's termination message. One that runs but cannot
get on (its relay topic does not exist yet, the API server does not take its checkpoints) answers its
readiness probe with 503 and the reason (`telemetry.unready`): the kubelet keeps only the status code, so the
operator asks the pod itself, and only the pods of the consumer's own StatefulSet (a pod merely labelled as one
is never asked).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import httpx

from fibers.conditions import parse_time
from fibers.databus.policy import READY_ANSWER_BYTES, READY_ASK_TIMEOUT_SECONDS, UNREADY_INSTANCE_LOOKS_SECONDS
from fibers.databus.workload import METRICS_PORT
from fibers.redact import redact, truncate


def exit_message(pods: list[dict[str, Any]]) -> tuple[int, str]:
    """The last error an instance exited with, while it is not running again, and that instance's ordinal
    (its pod's, from the StatefulSet's name-ordinal); (-1, "") when none did."""
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name") or "")):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if cs.get("ready"):
                continue
            terminated = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
            if terminated and terminated.get("exitCode"):
                # The consumer's termination message (or, with FallbackToLogsOnError, its log's tail).
                message = (terminated.get("message") or "").strip() or f"exited with code {terminated['exitCode']}"
                return ordinal(pod), truncate(redact(message, ()))
    return -1, ""


def none_left(statefulset: dict[str, Any] | None) -> bool:
    """Whether the StatefulSet is scaled to none and its controller has seen every pod of it go (it counts a
    terminating pod until it is gone): a stopped consumer at rest, whose pods need not be listed. False
    without one, as pods of a StatefulSet deleted without them may be left."""
    if statefulset is None:
        return False
    meta, spec, status = (statefulset.get(k) or {} for k in ("metadata", "spec", "status"))
    scaled_to_none = int(spec.get("replicas", 1)) == 0 and not int(status.get("replicas") or 0)
    return scaled_to_none and int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)


def ordinal(pod: dict[str, Any]) -> int:
    """A StatefulSet pod's ordinal, the number after its name's last dash (-1 if it has none)."""
    tail = str((pod.get("metadata") or {}).get("name") or "").rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def _running_unready(pod: dict[str, Any], owner_uid: str) -> str:
    """The pod's IP when it is one of the StatefulSet's, running and not ready ("" otherwise)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    owned = any(ref.get("uid") == owner_uid for ref in meta.get("ownerReferences") or [])
    statuses = status.get("containerStatuses") or []
    running = bool(statuses) and all((cs.get("state") or {}).get("running") for cs in statuses)
    if not owned or meta.get("deletionTimestamp") or not running or all(cs.get("ready") for cs in statuses):
        return ""
    return str(status.get("podIP") or "")


async def _ask(client: httpx.AsyncClient, ip: str, port: int) -> str:
    """The instance's answer to /ready when it says it is not ready ("" when ready or silent)."""
    try:
        async with client.stream("GET", f"http://{ip}:{port}/ready") as reply:
            if reply.status_code != 503:
                return ""
            body = b""
            async for chunk in reply.aiter_bytes():
                body += chunk
                if len(body) >= READY_ANSWER_BYTES:
                    break
    except httpx.HTTPError:
        return ""
    return body[:READY_ANSWER_BYTES].decode(errors="replace").strip()


async def unready_reasons(pods: list[dict[str, Any]], owner_uid: str, port: int = METRICS_PORT) -> str:
    """Why the StatefulSet's running instances that are not ready say they are not ("": none says)."""
    asked = [
        (pod, ip)
        for pod in sorted(pods, key=lambda p: str(p["metadata"]["name"]))
        if (ip := _running_unready(pod, owner_uid))
    ]
    if not asked:  # the common case: every consumer reconcile comes here, most with nothing to ask
        return ""
    reasons: list[str] = []
    # Plain HTTP to pod IPs: no TLS, so no CA bundle to load. A default client loads it on creation, ~40 ms
    # of CPU, once per consumer reconcile: most of an operator restart's CPU (bench/operator_restart).
    async with httpx.AsyncClient(timeout=READY_ASK_TIMEOUT_SECONDS, verify=False) as client:
        for pod, ip in asked:
            if said := await _ask(client, ip, port):
                reasons.append(f"{pod['metadata']['name']}: {said}")
    return truncate(redact("; ".join(reasons), ()))


def look_due(pods: list[dict[str, Any]], owner_uid: str, now: datetime) -> datetime | None:
    """When to ask the running, not-ready instances again (None: no look is due): the next of
    `UNREADY_INSTANCE_LOOKS_SECONDS` after each one's container started."""
    times: list[datetime] = []
    for pod in pods:
        if not _running_unready(pod, owner_uid):
            continue
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            started = ((cs.get("state") or {}).get("running") or {}).get("startedAt")
            if started:
                after = (parse_time(started) + timedelta(seconds=s) for s in UNREADY_INSTANCE_LOOKS_SECONDS)
                times.extend(at for at in after if at > now)
    return min(times) if times else None
