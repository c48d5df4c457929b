"""A DatabusConsumer's seek drops its checkpoints only once every instance has stopped (a fake API, no servers).

An instance that outlives the stop (a kubelet that lost touch, a slow foreground delete) would otherwise write
its old positions into the ConfigMap its successors make again — their fencing tokens start afresh there — and
they would resume at those positions instead of the seek's: records skipped or repeated with nobody told.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fibers.databus import reconciler as module
from fibers.databus import report
from fibers.databus.owners import LABEL_CONSUMER
from fibers.databus.reconciler import DatabusReconciler, Pass


class FakeKube:
    """What a seek asks of the API server: deletes, the consumer's pods, its checkpoint ConfigMap, its status."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.deleted: list[str] = []
        self.statuses: list[dict[str, Any]] = []

    async def delete(self, url: str, *, propagation: str | None = None, uid: str | None = None) -> None:
        self.deleted.append(url)

    async def items(self, url: str, **params: Any) -> list[dict[str, Any]]:
        return list(self.pods) if url.endswith("/pods") else []

    async def read(self, url: str) -> dict[str, Any] | None:
        labels = {LABEL_CONSUMER: "orders-view"}
        return {"metadata": {"name": "orders-view-checkpoint", "uid": "cm-1", "labels": labels}, "data": {}}

    async def replace_status(self, plural: str, namespace: str, name: str, status: dict[str, Any], *_: Any) -> None:
        self.statuses.append(dict(status))


def consumer(nonce: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "shop", "name": "orders-view", "generation": 2},
        "spec": {"seek": {"nonce": nonce, "startFrom": {"position": "earliest"}}},
        "status": {},
    }


def test_a_seek_keeps_the_checkpoints_until_every_instance_has_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "SEEK_STOP_WAIT_SECONDS", 0.2)
    monkeypatch.setattr(module, "SEEK_STOP_POLL_SECONDS", 0.05)
    kube = FakeKube(pods=[{"metadata": {"name": "orders-view-0"}}])  # it does not go
    seeker = DatabusReconciler(kube, kafka_bootstrap="kafka:9092", image="fibers-job", service_account=None)  # type: ignore[arg-type]

    waiting = Pass(consumer("1"), {})
    asyncio.run(seeker._seek(waiting))
    assert kube.deleted == ["/apis/apps/v1/namespaces/shop/statefulsets/orders-view"]  # told to stop; checkpoints kept
    assert "lastSeekNonce" not in waiting.status and not kube.statuses  # the seek is not done
    assert waiting.seek_due is not None  # and it looks again
    assert "1 instance(s) still running" in waiting.seek_waiting
    conds, phase = report.decide(waiting.spec, {}, "", "", "", "", seek_waiting=waiting.seek_waiting)
    assert (phase, conds[0].reason) == ("Pending", "SeekWaiting")

    kube.pods = []  # the instance has gone: the next look drops the checkpoints and records the seek
    done = Pass(consumer("1"), {})
    asyncio.run(seeker._seek(done))
    assert kube.deleted[-1] == "/api/v1/namespaces/shop/configmaps/orders-view-checkpoint"
    assert done.status["lastSeekNonce"] == "1" and not done.seek_waiting
