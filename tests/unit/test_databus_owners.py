"""Whose a checkpoint ConfigMap, a StatefulSet or a Lease is: the consumer named by its label, not its name."""

from __future__ import annotations

from typing import Any

from fibers.databus.owners import LABEL_CONSUMER, foreign_checkpoint, foreign_leases, foreign_workload, lease_prefix


def _cm(labels: dict[str, str] | None) -> dict[str, Any]:
    return {"metadata": {"name": "orders-checkpoint", "labels": labels}}


def test_an_absent_configmap_or_the_consumers_own_is_its_to_use() -> None:
    assert foreign_checkpoint(None, "orders") == ""
    assert foreign_checkpoint(_cm({LABEL_CONSUMER: "orders", "other": "x"}), "orders") == ""


def test_another_consumers_configmap_names_its_owner() -> None:
    message = foreign_checkpoint(_cm({LABEL_CONSUMER: "payments"}), "orders")
    assert "ConfigMap orders-checkpoint belongs to consumer payments" in message
    assert f"{LABEL_CONSUMER}=orders" in message  # how to hand it over, when that is what is meant


def test_a_configmap_no_consumer_created_is_not_taken() -> None:
    for labels in (None, {}, {"app": "orders"}):
        assert f"no label {LABEL_CONSUMER}" in foreign_checkpoint(_cm(labels), "orders")


def test_a_statefulset_of_the_consumers_name_is_its_own_only_when_labelled() -> None:
    """Another workload may have the consumer's name: it is never patched to run consumer pods."""
    database = {"metadata": {"name": "orders", "labels": {"app": "postgres"}}}
    assert "StatefulSet orders was not created for a consumer" in foreign_workload(database, "orders")
    assert foreign_workload({"metadata": {"name": "orders", "labels": {LABEL_CONSUMER: "orders"}}}, "orders") == ""
    assert foreign_workload(None, "orders") == ""


def _lease(name: str, labels: dict[str, str] | None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def test_a_lease_named_as_a_consumers_partition_but_not_made_for_it_is_a_conflict() -> None:
    prefix = lease_prefix("orders", "shop.public.orders")
    ours = _lease(f"{prefix}-p0", {LABEL_CONSUMER: "orders"})
    planted = _lease(f"{prefix}-p1", {"app": "x"})
    message = foreign_leases([ours, planted], "orders", [prefix])
    assert f"Lease {prefix}-p1 was not created for a consumer" in message
    assert "partition is not consumed" in message
    assert foreign_leases([ours], "orders", [prefix]) == ""


def test_leases_of_other_names_are_none_of_the_consumers_business() -> None:
    """Another consumer's, one whose name merely starts like ours, and the operator's peering Leases."""
    prefix = lease_prefix("orders", "t")
    others = [
        _lease(f"{lease_prefix('orders-eu', 't')}-p0", None),
        _lease(f"{prefix}-p0-extra", None),
        _lease(f"{prefix}-px", None),
        _lease("fibers-peering", None),
    ]
    assert foreign_leases(others, "orders", [prefix]) == ""
    assert foreign_leases(others, "orders", []) == ""


def test_lease_names_keep_topics_that_read_alike_apart() -> None:
    assert lease_prefix("orders", "Shop.Orders") != lease_prefix("orders", "shop-orders")
    assert lease_prefix("orders", "shop.orders").startswith("orders-shop-orders-")
