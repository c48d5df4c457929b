"""What the Connect reconciler says: a resource's status, written only when it changed (or a heartbeat is
due), and the Events and lineage runs that go with a change of its Ready condition."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from fibers import conditions
from fibers.api import object_ref
from fibers.conditions import READY, Condition, utcnow
from fibers.connect import reconcile
from fibers.connect.lineage import ConnectLineage
from fibers.connect.policy import ConnectPolicy
from fibers.connect.reconcile import Key, Target
from fibers.connect.spec import KIND, PLURAL
from fibers.kube import Kube
from fibers.redact import redact

log = logging.getLogger("fibers.connect")
# Ready reasons of a new resource's progress, whose status writes are spaced (`ConnectPolicy.startup_status_every`).
STARTUP_REASONS = frozenset({"Creating", "Starting"})

# Ready=False reasons worth a Warning event (the others are progress: Creating, Starting, …).
FAILURE_REASONS = frozenset(
    {
        "ConnectUnreachable",
        "ConnectRejected",
        "ConnectorNotOwned",
        "ConnectorFailed",
        "TasksFailed",
        "TasksUnassigned",
        "AutoRestartExhausted",
        "InvalidSpec",
        "SecretNotFound",
        "SecretUnreadable",
        "ClaimFailed",
        "InvalidConfig",
        "ClusterNotFound",
        "ClusterNotAllowed",
        "NoConnectCluster",
        "AmbiguousDefaultCluster",
    }
)


def unreachable_status(target: Target, message: str) -> dict[str, Any]:
    """The status of a resource whose Kafka Connect does not answer (its other fields kept)."""
    now = utcnow()
    conds = [
        Condition(READY, False, "ConnectUnreachable", message),
        Condition(conditions.RECONCILING, True, "ConnectUnreachable", "retrying"),
        Condition(conditions.STALLED, False, "ConnectUnreachable", ""),
    ]
    status = dict(target.status)
    status.update(
        observedGeneration=target.generation,
        phase="Unknown",
        conditions=conditions.merge(
            target.status.get("conditions"), conds, target.generation, conditions.format_time(now)
        ),
        lastSyncTime=conditions.format_time(now),
    )
    return status


class Publisher:
    def __init__(
        self, kube: Kube, lineage: ConnectLineage, policy: ConnectPolicy, targets: Mapping[Key, Target]
    ) -> None:
        self.kube, self.lineage, self.policy = kube, lineage, policy
        self._targets = targets  # the resources as registered now: a replaced or deleted one is not written
        self.written: dict[Key, float] = {}  # when each resource's status was last written (monotonic)

    def heartbeat_due(self, target: Target) -> bool:
        """An unchanged status is written again once its lastSyncTime is `status_heartbeat` old. Before this
        process has written it, the age is the stored lastSyncTime's: a restarted operator otherwise rewrote
        every Connect's status at once (bench/operator_restart)."""
        written = self.written.get(target.key)
        if written is not None:
            return time.monotonic() - written > self.policy.status_heartbeat
        try:
            synced = conditions.parse_time(str(target.status["lastSyncTime"]))
        except (KeyError, ValueError):
            return True
        return (utcnow() - synced).total_seconds() > self.policy.status_heartbeat

    def forget(self, key: Key) -> None:
        self.written.pop(key, None)

    def event(self, target: Target, reason: str, message: str, *, warning: bool = False) -> None:
        """Post an Event without holding up the sync."""
        ref = object_ref(KIND, target.namespace, target.name, target.uid)
        self.kube.post_event_soon(ref, reason, redact(message, target.secrets), warning=warning)

    async def publish(self, target: Target, status: dict[str, Any]) -> None:
        """Write the status if it changed (or the heartbeat is due), and post an Event on Ready flips."""
        offsets_changed = status.get("offsets") != target.status.get("offsets")
        current = self._targets.get(target.key)
        if current is not target:
            if not (offsets_changed and current and current.uid == target.uid):
                return  # forgotten (deleted) or replaced meanwhile
            # An ended offsets operation is reported even so: its annotation goes next, and with it the request.
            current.status = {**current.status, "offsets": status["offsets"]}
        unchanged = reconcile.significant(status) == reconcile.significant(target.status)
        if unchanged and not self.heartbeat_due(target):
            return
        before = conditions.find(target.status.get("conditions"), READY) or {}
        after = conditions.find(status.get("conditions"), READY) or {}
        if (
            before.get("reason", "Creating") in STARTUP_REASONS  # a new resource has no Ready condition yet
            and after.get("reason") in STARTUP_REASONS
            and time.monotonic() - self.written.get(target.key, target.first_seen) < self.policy.startup_status_every
            and not offsets_changed
        ):
            return  # the resource is still converging, so a later sync writes what this one skipped
        await self.kube.replace_status(PLURAL, target.namespace, target.name, status, target.status)
        target.status = status
        self.written[target.key] = time.monotonic()
        if (before.get("status"), before.get("reason")) != (after.get("status"), after.get("reason")):
            self.lineage.ready_changed(target, before, after)
            ctx = {"namespace": target.namespace, "resource": target.name, "reason": after.get("reason")}
            if after.get("status") == "True":
                log.info("ready", extra=ctx)
                self.event(target, "Ready", after.get("message", ""))
            elif after.get("reason") in FAILURE_REASONS:
                log.warning("not ready: %s", after.get("message", ""), extra=ctx)
                self.event(target, after.get("reason", "NotReady"), after.get("message", ""), warning=True)
