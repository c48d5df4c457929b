"""ConnectCluster: the Kafka Connect clusters a platform team declares, and which Connect goes where.

A ConnectCluster is cluster-scoped: its REST URL, optional auth (basic or bearer, from a Secret) and
TLS, the namespaces allowed to use it (a label selector), and whether it is the default. A Connect
names one in `spec.cluster`, or gets the default; a namespace the selector does not match is refused.
So a namespace user can no longer point the operator's network identity at a URL of their choosing.

This module is pure: reading a ConnectCluster, matching selectors, and placing a Connect. The
registry that keeps clients and probes the clusters is `fibers.connect.registry`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fibers.conditions import READY, Condition
from fibers.credentials import HttpAuth, parse_http_auth
from fibers.selectors import selector_matches

PLURAL = "connectclusters"
KIND = "ConnectCluster"
# Ready reasons of a Connect that could not be placed on a cluster (see `place`).
PLACEMENT_REASONS = frozenset({"NoConnectCluster", "AmbiguousDefaultCluster", "ClusterNotFound", "ClusterNotAllowed"})


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    url: str
    default: bool = False
    namespace_selector: dict[str, Any] | None = None  # None or {}: every namespace
    auth: HttpAuth = field(default_factory=HttpAuth)
    generation: int = 0
    kafka_bootstrap: str = ""  # where its connectors' topics are, to reposition sink connectors by time


def parse_cluster(name: str, spec: dict[str, Any], generation: int = 0) -> ClusterSpec:
    """A ConnectCluster's spec (the CRD schema has checked its shape)."""
    return ClusterSpec(
        name=name,
        url=str(spec["url"]).rstrip("/"),
        default=bool(spec.get("default", False)),
        namespace_selector=spec.get("namespaceSelector") or None,
        auth=parse_http_auth(spec),
        generation=generation,
        kafka_bootstrap=str(spec.get("kafkaBootstrapServers") or ""),
    )


@dataclass(frozen=True)
class Placement:
    cluster: str  # the ConnectCluster's name ("" when none could be chosen)
    problem: Condition | None = None

    @property
    def placed(self) -> bool:
        return self.problem is None


def place(
    *,
    requested: str | None,
    bound: str | None,
    namespace: str,
    labels: dict[str, str],
    clusters: dict[str, ClusterSpec],
    operator_default: str | None,
) -> Placement:
    """Which ConnectCluster a Connect uses, or why it cannot use one.

    The order: `spec.cluster`; the cluster its claim recorded (a connector stays where it was created,
    even if the default changes later); the operator's default (chart value); the one ConnectCluster
    marked default.
    """
    name = requested or bound or operator_default
    if not name:
        defaults = sorted(c.name for c in clusters.values() if c.default)
        if len(defaults) > 1:
            message = f"spec.cluster is not set and several ConnectClusters are marked default: {', '.join(defaults)}"
            return Placement("", Condition(READY, False, "AmbiguousDefaultCluster", message))
        if not defaults:
            message = "spec.cluster is not set and there is no default ConnectCluster; name one in spec.cluster"
            return Placement("", Condition(READY, False, "NoConnectCluster", message))
        name = defaults[0]
    cluster = clusters.get(name)
    if cluster is None:
        message = f"ConnectCluster {name} (spec.cluster) does not exist; the connector follows once it does"
        return Placement(name, Condition(READY, False, "ClusterNotFound", message))
    if not selector_matches(cluster.namespace_selector, labels):
        message = (
            f"ConnectCluster {name} (spec.cluster) does not allow namespace {namespace}: "
            "its spec.namespaceSelector does not match the namespace's labels"
        )
        return Placement(name, Condition(READY, False, "ClusterNotAllowed", message))
    return Placement(name)
