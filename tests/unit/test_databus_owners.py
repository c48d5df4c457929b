"""Whose a checkpoint ConfigMap or a StatefulSet is: the consumer named by its label, never whoever names it."""

from __future__ import annotations

from typing import Any

from fibers.databus.owners import LABEL_CONSUMER, foreign_checkpoint, foreign_workload


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
