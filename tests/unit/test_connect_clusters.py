"""ConnectCluster specs, label selectors, and which cluster a Connect is placed on (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from fibers.connect.clusters import ClusterSpec, parse_cluster, place
from fibers.credentials import SecretKey
from fibers.selectors import selector_matches


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        (None, {}, True),
        ({}, {"a": "1"}, True),
        ({"matchLabels": {"team": "shop"}}, {"team": "shop", "x": "y"}, True),
        ({"matchLabels": {"team": "shop"}}, {"team": "other"}, False),
        ({"matchLabels": {"team": "shop"}}, {}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}, {"tier": "b"}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}, {}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, {}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, {"tier": "a"}, False),
        ({"matchExpressions": [{"key": "pci", "operator": "Exists"}]}, {"pci": ""}, True),
        ({"matchExpressions": [{"key": "pci", "operator": "DoesNotExist"}]}, {"pci": ""}, False),
        (
            {"matchLabels": {"team": "shop"}, "matchExpressions": [{"key": "pci", "operator": "DoesNotExist"}]},
            {"team": "shop"},
            True,
        ),
    ],
)
def test_label_selector(selector: dict[str, Any] | None, labels: dict[str, str], matches: bool) -> None:
    assert selector_matches(selector, labels) is matches


def test_parse_cluster_with_basic_auth_and_ca() -> None:
    spec = parse_cluster(
        "prod",
        {
            "url": "https://connect.prod:8443/",
            "default": True,
            "auth": {"basic": {"secretRef": {"namespace": "fibers-system", "name": "connect-creds"}}},
            "tls": {"caSecretRef": {"namespace": "fibers-system", "name": "connect-ca"}},
            "namespaceSelector": {"matchLabels": {"team": "shop"}},
        },
        3,
    )
    assert spec.url == "https://connect.prod:8443"
    assert spec.default and spec.generation == 3
    assert spec.auth.basic_user == SecretKey("fibers-system", "connect-creds", "username")
    assert spec.auth.basic_password == SecretKey("fibers-system", "connect-creds", "password")
    assert spec.auth.ca == SecretKey("fibers-system", "connect-ca", "ca.crt")
    assert spec.auth.bearer_token is None and not spec.auth.insecure_skip_verify


def test_parse_cluster_with_bearer_token() -> None:
    spec = parse_cluster(
        "p", {"url": "http://c:8083", "auth": {"bearer": {"secretRef": {"namespace": "n", "name": "t"}}}}
    )
    assert spec.auth.bearer_token == SecretKey("n", "t", "token")


CLUSTERS = {
    "shared": ClusterSpec("shared", "http://shared:8083", default=True),
    "pci": ClusterSpec("pci", "http://pci:8083", namespace_selector={"matchLabels": {"pci": "true"}}),
}


def _place(**kwargs: Any) -> tuple[str, str | None]:
    args: dict[str, Any] = {
        "requested": None,
        "bound": None,
        "namespace": "shop",
        "labels": {},
        "clusters": CLUSTERS,
        "operator_default": None,
        **kwargs,
    }
    placement = place(**args)
    return placement.cluster, placement.problem.reason if placement.problem else None


def test_named_cluster_is_used() -> None:
    assert _place(requested="pci", labels={"pci": "true"}) == ("pci", None)


def test_namespace_the_cluster_does_not_allow_is_refused() -> None:
    assert _place(requested="pci") == ("pci", "ClusterNotAllowed")


def test_unknown_cluster_waits_for_it() -> None:
    assert _place(requested="nope") == ("nope", "ClusterNotFound")


def test_default_order_bound_then_operator_then_marked() -> None:
    assert _place() == ("shared", None)  # the one marked default
    assert _place(operator_default="pci", labels={"pci": "true"}) == ("pci", None)  # the operator's wins
    # A claimed connector stays on the cluster it was created on, whatever the default is now.
    assert _place(bound="pci", operator_default="shared", labels={"pci": "true"}) == ("pci", None)


def test_no_default_or_several_defaults_is_a_problem_naming_them() -> None:
    assert _place(clusters={"pci": CLUSTERS["pci"]}) == ("", "NoConnectCluster")
    two = {**CLUSTERS, "other": ClusterSpec("other", "http://o:8083", default=True)}
    placement = place(requested=None, bound=None, namespace="n", labels={}, clusters=two, operator_default=None)
    assert placement.problem is not None and "other, shared" in placement.problem.message
    assert placement.problem.reason == "AmbiguousDefaultCluster"
