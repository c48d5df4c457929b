"""What a stopped consumer's reconcile reads (a fake API, no servers).

At rest a stopped consumer has no pod and takes no partition, yet each of its reconciles listed the namespace's
Leases and its pods. At an operator restart beside 1,000 stopped consumers those were 2,000 of the 7,050
requests before every resource was looked at again, and the Lease list grows with the namespace's running
consumers (the benchmark `operator_restart`). A consumer still stopping, or one to run, reads them as before.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fibers.consumer.ownership import lease_name
from fibers.databus.owners import LABEL_CONSUMER
from fibers.databus.reconciler import DatabusReconciler, Pass


class FakeKube:
    """The consumer's StatefulSet and checkpoint ConfigMap, and a record of every list asked for."""

    def __init__(self, statefulset: dict[str, Any], leases: list[dict[str, Any]] | None = None) -> None:
        self.statefulset, self.leases = statefulset, leases or []
        self.listed: list[str] = []

    async def read(self, url: str) -> dict[str, Any] | None:
        if "/statefulsets/" in url:
            return self.statefulset
        return None  # no checkpoint yet

    async def get_object(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return None  # no sourceRefs here: never asked

    async def items(self, url: str, **params: Any) -> list[dict[str, Any]]:
        self.listed.append(url.rsplit("/", 1)[-1])
        return list(self.leases) if url.endswith("/leases") else []


def statefulset(replicas: int, *, pods: int, observed: int = 3) -> dict[str, Any]:
    return {
        "metadata": {"name": "orders", "uid": "s1", "generation": 3, "labels": {LABEL_CONSUMER: "orders"}},
        "spec": {"replicas": replicas},
        "status": {"observedGeneration": observed, "replicas": pods, "readyReplicas": pods},
    }


def consumer(state: str) -> dict[str, Any]:
    spec = {"sources": ["t"], "sink": {"type": "log"}, "state": state}
    return {"metadata": {"namespace": "shop", "name": "orders", "generation": 2}, "spec": spec, "status": {}}


def look(kube: FakeKube, state: str) -> Pass:
    reconciler = DatabusReconciler(kube, kafka_bootstrap="kafka:9092", image="fibers-job", service_account=None)  # type: ignore[arg-type]
    p = Pass(consumer(state), {})

    async def steps() -> None:
        for step in (reconciler._read_children, reconciler._resolve_sources, reconciler._observe):
            await step(p)

    asyncio.run(steps())
    return p


def test_a_stopped_consumer_at_rest_lists_neither_the_namespaces_leases_nor_its_pods() -> None:
    kube = FakeKube(statefulset(0, pods=0))
    p = look(kube, "stopped")
    assert kube.listed == []
    assert p.new_status["phase"] == "Stopped"


def test_a_stopped_consumer_still_stopping_lists_its_pods() -> None:
    """Scaled to none, but its controller has not seen its pods go (or not seen the scale yet): Stopping."""
    pod = {"metadata": {"name": "orders-0"}, "status": {}}
    for sts in (statefulset(0, pods=1), statefulset(0, pods=0, observed=2), statefulset(1, pods=1)):
        kube = FakeKube(sts)
        kube.items = _listing(kube, pod)  # type: ignore[method-assign]
        p = look(kube, "stopped")
        assert kube.listed == ["pods"], sts
        assert p.new_status["phase"] == "Pending", sts


def test_a_consumer_to_run_still_finds_a_lease_planted_under_its_partitions_name() -> None:
    planted = {"metadata": {"name": lease_name("orders", "t", 0)}, "spec": {"holderIdentity": "b"}}
    kube = FakeKube(statefulset(1, pods=1), leases=[planted])
    p = look(kube, "running")
    assert "leases" in kube.listed
    assert f"Lease {lease_name('orders', 't', 0)}" in p.conflict


def _listing(kube: FakeKube, pod: dict[str, Any]) -> Any:
    async def items(url: str, **params: Any) -> list[dict[str, Any]]:
        kube.listed.append(url.rsplit("/", 1)[-1])
        return [pod] if url.endswith("/pods") else []

    return items
