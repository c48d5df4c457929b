"""When a Connect being deleted lets go of its connector without deleting it (pure: no I/O).

A Connect keeps its finalizer until the connector it created is confirmed gone from Kafka Connect
(`ConnectSync._delete`), so deleting the resource never leaves a connector running unnoticed. That wait
must end, or the resource, and the namespace it is in, can never be deleted:

- the annotation `fibers.dev/deletion-policy: orphan` releases it at once and leaves the connector
  running (a connector moved to another tool, or a cluster being torn down anyway): a Normal Event;
- a ConnectCluster that no longer exists leaves nowhere to delete the connector from: released at once;
- a Kafka Connect that has not answered (or whose credentials cannot be read) for the deployment's grace
  period (`SyncSettings.deletion_grace`, FIBERS_CONNECT_DELETION_GRACE, chart
  `connect.deletionGraceSeconds`; 10 minutes by default) is taken to be gone for good: released.
  The last two post a Warning Event naming the connector, which may still run on that cluster.

A cluster that answers with an error (a rebalance, a connector that will not go) keeps the resource
waiting: it can be deleted later, and the orphan annotation is the way out when it cannot.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from fibers.api import ANNOTATION_DELETION_POLICY

ORPHAN = "orphan"  # its one value that changes anything; absent (or anything else): delete the connector


class ClusterState(enum.Enum):
    """What the last attempt to delete the connector learnt of its cluster."""

    ANSWERS = "answers"  # not tried yet, or it answered (an error too): try again
    UNREACHABLE = "unreachable"  # no answer, or no client (its credentials cannot be read)
    MISSING = "missing"  # the ConnectCluster does not exist


class Verdict(enum.Enum):
    DELETE = "delete"  # delete the connector, then release the resource
    WAIT = "wait"  # the cluster does not answer: try again, until the grace period ends
    RELEASE = "release"  # release the resource without deleting the connector: it may remain (Warning)
    ORPHAN = "orphan"  # release it without deleting the connector, as the resource asks (Normal)


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str = ""  # the Event's reason, for the verdicts that release without deleting
    message: str = ""  # the Event's message; for WAIT, what happens when

    @property
    def releases(self) -> bool:
        """The resource goes without its connector being deleted."""
        return self.verdict in (Verdict.RELEASE, Verdict.ORPHAN)


def orphans(annotations: dict[str, str]) -> bool:
    """The policy asks to leave the connector ("Orphan" too, as Kubernetes spells its propagation policy)."""
    return str(annotations.get(ANNOTATION_DELETION_POLICY) or "").strip().lower() == ORPHAN


def decide(
    *,
    connector: str,
    cluster: str,
    state: ClusterState,
    unreachable_since: float | None,
    now: float,
    grace: float,
    orphan: bool,
) -> Decision:
    """What to do now about the connector of a Connect being deleted.

    `unreachable_since`: when the attempts began to find the cluster unreachable (None while it answers);
    `now` on the same clock; `grace`: how long an unreachable cluster is waited for, in seconds.
    """
    if orphan:
        message = f"{ANNOTATION_DELETION_POLICY}: {ORPHAN}: connector {connector} left on ConnectCluster {cluster}"
        return Decision(Verdict.ORPHAN, "ConnectorOrphaned", message)
    left = f"connector {connector} was not deleted and may remain on that Kafka Connect; delete it there by hand"
    if state is ClusterState.MISSING:
        return Decision(Verdict.RELEASE, "ConnectorLeft", f"ConnectCluster {cluster} does not exist: {left}")
    if state is ClusterState.UNREACHABLE:
        waited = now - (now if unreachable_since is None else unreachable_since)
        if waited >= grace:
            message = f"Kafka Connect of ConnectCluster {cluster} has not answered for {waited:.0f} s: {left}"
            return Decision(Verdict.RELEASE, "ConnectorLeft", message)
        message = f"released without deleting the connector if it still does not answer in {grace - waited:.0f} s"
        return Decision(Verdict.WAIT, message=message)
    return Decision(Verdict.DELETE)
