"""ConnectCluster: the Kafka Connect clusters a platform team declares, and which Connect goes where.

A ConnectCluster is cluster-scoped: its REST URL, optional auth (basic or bearer, from a Secret) and
TLS, the namespaces allowed to use it (a label selector), and whether it is the default. A Connect
names one in `spec.cluster`, or gets the default; a namespace the selector does not match is refused.
So a namespace user can no longer point the operator's network identity at a URL of their choosing.

This module is pure: reading a ConnectCluster, matching selectors, and placing a Connect. The
registry that keeps clients and probes the clusters is `fibers.connect.registry`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fibers.conditions import READY, Condition
from fibers.selectors import selector_matches

PLURAL = "connectclusters"
KIND = "ConnectCluster"
# Ready reasons of a Connect that could not be placed on a cluster (see `place`).
PLACEMENT_REASONS = frozenset({"NoConnectCluster", "AmbiguousDefaultCluster", "ClusterNotFound", "ClusterNotAllowed"})


@dataclass(frozen=True)
class SecretKey:
    namespace: str
    name: str
    key: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    url: str
    default: bool = False
    namespace_selector: dict[str, Any] | None = None  # None or {}: every namespace
    basic_user: SecretKey | None = None
    basic_password: SecretKey | None = None
    bearer_token: SecretKey | None = None
    ca: SecretKey | None = None
    insecure_skip_verify: bool = False
    generation: int = 0


def parse_cluster(name: str, spec: dict[str, Any], generation: int = 0) -> ClusterSpec:
    """A ConnectCluster's spec (the CRD schema has checked its shape)."""
    auth, tls = spec.get("auth") or {}, spec.get("tls") or {}
    basic, bearer, ca = auth.get("basic"), auth.get("bearer"), tls.get("caSecretRef")

    def key(ref: dict[str, Any], default_key: str) -> SecretKey:
        return SecretKey(ref["namespace"], ref["name"], ref.get("key") or default_key)

    return ClusterSpec(
        name=name,
        url=str(spec["url"]).rstrip("/"),
        default=bool(spec.get("default", False)),
        namespace_selector=spec.get("namespaceSelector") or None,
        basic_user=key(basic["secretRef"], "username") if basic else None,
        basic_password=key(basic["secretRef"], "password") if basic else None,
        bearer_token=key(bearer["secretRef"], "token") if bearer else None,
        ca=key(ca, "ca.crt") if ca else None,
        insecure_skip_verify=bool(tls.get("insecureSkipVerify", False)),
        generation=generation,
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
