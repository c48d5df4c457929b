"""ConnectSync's own bookkeeping, with the Kubernetes and Connect clients replaced by small recorders.

- Connect lists a new connector only once its herder has caught up, so a listing taken right after our
  create may still lack it; the sync must not create the connector a second time.
- Every watch event reaches the sync, our own status writes included: only a change it acts on may
  cost work (a Secret read), and an event older than our claim must not make us forget the claim.
- Deletion deletes only a connector the resource claimed, and releases the resource only after; or
  without deleting it, when the resource asks so, its ConnectCluster is gone, or its Kafka Connect has not
  answered for the grace period (`fibers.connect.deletion`): never held for ever.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import time
from typing import Any

import pytest

from fibers import conditions
from fibers.api import (
    ANNOTATION_CONNECT_CLUSTER,
    ANNOTATION_DELETION_POLICY,
    ANNOTATION_OWNED_CONNECTOR,
    CONNECT_FINALIZER,
)
from fibers.connect.clusters import ClusterSpec
from fibers.connect.ownership import OWNER_KEY
from fibers.connect.policy import POLICY, ConnectPolicy
from fibers.connect.reconcile import Target
from fibers.connect.registry import ClusterSettings, ConnectClusters, Known
from fibers.connect.rest import ConnectError, ConnectorView, ConnectUnreachable
from fibers.connect.settings import SyncSettings
from fibers.connect.sync import ConnectSync
from fibers.kubeapi import ApiError

CLUSTER = "local"  # a ConnectCluster


class RecordingKube:
    """Stands in for fibers.kube.Kube: records writes, keeps each resource's metadata."""

    def __init__(self) -> None:
        self.statuses: dict[str, dict[str, Any]] = {}
        self.patches: list[list[dict[str, Any]]] = []
        self.released: list[str] = []
        self.unannotated: list[tuple[str, tuple[str, ...]]] = []
        self.secret_reads = 0
        self.events: list[tuple[str, str, bool]] = []  # reason, message, warning
        self.cluster_objects: dict[str, dict[str, Any]] = {}  # ConnectClusters as the API server has them

    async def replace_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any], previous: dict[str, Any]
    ) -> None:
        self.statuses[name] = status

    async def patch_object(self, plural: str, namespace: str, name: str, patch: list[dict[str, Any]]) -> bool:
        self.patches.append(patch)
        return True

    async def remove_finalizer(self, plural: str, namespace: str, name: str, finalizer: str) -> None:
        self.released.append(name)

    async def remove_annotation(self, plural: str, namespace: str, name: str, *annotations: str) -> None:
        self.unannotated.append((name, annotations))

    async def secret_value(self, namespace: str, name: str, key: str) -> str:
        self.secret_reads += 1
        return "s3cr3t"

    def post_event_soon(self, ref: dict[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append((reason, message, warning))

    async def get_cluster_object(self, plural: str, name: str) -> dict[str, Any] | None:
        return self.cluster_objects.get(name)


class LaggingConnect:
    """A Connect whose listing does not show created connectors yet (its herder lags behind)."""

    def __init__(self) -> None:
        self.creates: list[str] = []
        self.deletes: list[str] = []
        self.validations = 0
        self.refuse: dict[str, list[str]] = {}  # config key -> Connect's errors for it (an invalid config)
        self.taken: dict[str, dict[str, str]] = {}  # connectors that exist but are not listed yet: their configs
        self.listing: dict[str, ConnectorView] = {}
        self.puts: list[str] = []
        self.delete_error: Exception | None = None  # what a DELETE raises (a Connect that is down, or refuses)
        # Whose each connector is, as its config says; one not named here was created by the resource of
        # its name in "shop" (what a deletion usually finds).
        self.owners: dict[str, str] = {}

    async def list_expanded(self, *, configs: bool = True) -> dict[str, ConnectorView]:
        return dict(self.listing)

    async def config(self, name: str) -> dict[str, str]:
        if name in self.taken:
            return dict(self.taken[name])
        return {"name": name, OWNER_KEY: self.owners.get(name, f"shop/{name}")}

    async def put_config(self, name: str, config: dict[str, str]) -> None:
        self.puts.append(name)

    async def validate(self, connector_class: str, config: dict[str, str]) -> dict[str, Any]:
        self.validations += 1
        errors = [{"value": {"name": key, "errors": messages}} for key, messages in self.refuse.items()]
        return {"error_count": len(errors), "configs": errors}

    async def create(self, name: str, config: dict[str, str], initial_state: str) -> None:
        if self.refuse:  # as Kafka Connect does: an invalid config is refused, nothing is created
            raise ConnectError(400, "Connector configuration is invalid and contains the following 1 error(s)")
        if name in self.taken:
            raise ConnectError(409, f"Connector {name} already exists")
        self.creates.append(name)

    async def delete(self, name: str) -> None:
        if self.delete_error:
            raise self.delete_error
        self.deletes.append(name)

    async def exists(self, name: str) -> bool:
        return False

    async def topics(self, name: str) -> list[str]:
        return []  # the connector has written nothing yet


def _body(name: str, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "shop", "name": name, "uid": f"uid-{name}", "generation": 1, **meta},
        "spec": {
            "cluster": CLUSTER,
            "class": "FileStreamSource",
            "config": {"file": "/tmp/in", "topic": "t"},
            "secretConfig": {"password": {"secretKeyRef": {"name": "db", "key": "password"}}},
        },
    }


def _claimed(name: str) -> dict[str, Any]:
    """A resource that holds the claim on its connector (annotation and finalizer)."""
    return _body(name, finalizers=[CONNECT_FINALIZER], annotations={ANNOTATION_OWNED_CONNECTOR: name})


async def _ready_beside(sync: ConnectSync, other: str) -> tuple[Target, Target]:
    """Two claimed resources: "older", Ready with its topics unknown and due, and `other`."""
    for name in ("older", other):
        await sync.observe(None, _claimed(name))  # type: ignore[arg-type]
    older = sync.targets["shop", "older"]
    older.status = {"conditions": [{"type": "Ready", "status": "True", "reason": "Running"}]}
    older.topics_due = 0.0
    return older, sync.targets["shop", other]


def _recording_topics(connect: LaggingConnect) -> list[str]:
    """The connectors whose topics are asked from now on (each reports one)."""
    asked: list[str] = []

    async def topics(name: str) -> list[str]:
        asked.append(name)
        return [f"{name}-topic"]

    connect.topics = topics  # type: ignore[method-assign]
    return asked


def _sync(policy: ConnectPolicy = POLICY) -> tuple[ConnectSync, RecordingKube, LaggingConnect]:
    kube, connect = RecordingKube(), LaggingConnect()
    clusters = ConnectClusters(kube, ClusterSettings())  # type: ignore[arg-type]
    clusters.known[CLUSTER] = Known(ClusterSpec(CLUSTER, "http://connect:8083"), "uid", client=connect)  # type: ignore[arg-type]
    kube.cluster_objects[CLUSTER] = {"metadata": {"name": CLUSTER}}
    clusters.namespace_labels["shop"] = {}
    sync = ConnectSync(kube, SyncSettings(fast_interval=0.05), clusters, policy)  # type: ignore[arg-type]
    return sync, kube, connect


async def _sync_once(sync: ConnectSync) -> None:
    await sync._sync_cluster(CLUSTER, list(sync.targets.values()))
    await asyncio.gather(*sync._in_flight.values())


def test_a_late_deleted_event_of_an_earlier_resource_does_not_drop_the_one_created_under_its_name() -> None:
    """kopf handles each uid's events apart: after a delete and a create under one name, the new resource's
    first event may be handled before the old one's DELETED, which must not make the sync forget the new one
    (its connector would then be made by nothing until the resource changed)."""

    async def scenario() -> ConnectSync:
        sync, _, _ = _sync()
        await sync.observe(None, _body("orders", uid="u1"))  # type: ignore[arg-type]
        await sync.observe("ADDED", _body("orders", uid="u2"))  # type: ignore[arg-type]
        await sync.observe("DELETED", _body("orders", uid="u1"))  # type: ignore[arg-type]
        assert sync.targets["shop", "orders"].uid == "u2"
        await sync.observe("DELETED", _body("orders", uid="u2"))  # type: ignore[arg-type]
        return sync

    assert ("shop", "orders") not in asyncio.run(scenario()).targets


def test_a_connector_just_created_is_not_created_again_while_the_listing_lags() -> None:
    async def scenario() -> tuple[ConnectSync, RecordingKube, LaggingConnect]:
        sync, kube, connect = _sync()
        await sync.observe(None, _body("orders"))  # type: ignore[arg-type]
        for _ in range(3):  # three syncs, none of whose listings shows the new connector
            await _sync_once(sync)
        return sync, kube, connect

    sync, kube, connect = asyncio.run(scenario())
    assert connect.creates == ["orders"]
    assert len(kube.patches) == 1  # one claim, written before the create
    (claim,) = kube.patches
    assert {"op": "add", "path": "/metadata/finalizers", "value": [CONNECT_FINALIZER]} in claim
    claimed = {ANNOTATION_OWNED_CONNECTOR: "orders", ANNOTATION_CONNECT_CLUSTER: CLUSTER}
    assert {"op": "add", "path": "/metadata/annotations", "value": claimed} in claim
    assert sync.targets["shop", "orders"].owned


def test_a_valid_config_is_created_without_a_validation_call() -> None:
    async def scenario() -> LaggingConnect:
        sync, _, connect = _sync()
        await sync.observe(None, _body("orders"))  # type: ignore[arg-type]
        await _sync_once(sync)
        return connect

    connect = asyncio.run(scenario())
    assert connect.creates == ["orders"]
    assert connect.validations == 0  # Connect validates as it creates


def test_a_config_connect_refuses_is_named_field_by_field_and_stalls() -> None:
    async def scenario() -> tuple[ConnectSync, RecordingKube, LaggingConnect]:
        sync, kube, connect = _sync()
        connect.refuse = {"topic": ["Missing required configuration"]}
        await sync.observe(None, _body("orders"))  # type: ignore[arg-type]
        for _ in range(2):  # the second sync must not try again: the spec has not changed
            await _sync_once(sync)
        return sync, kube, connect

    _, kube, connect = asyncio.run(scenario())
    assert connect.creates == []
    assert connect.validations == 1
    ready = next(c for c in kube.statuses["orders"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidConfig"
    assert "spec.config.topic: Missing required configuration" in ready["message"]


def test_events_that_change_nothing_the_sync_acts_on_cost_no_work() -> None:
    async def scenario() -> tuple[RecordingKube, int]:
        sync, kube, _ = _sync()
        body = _body("orders")
        await sync.observe("ADDED", body)  # type: ignore[arg-type]
        reads_after_add = kube.secret_reads
        await sync.observe("MODIFIED", {**body, "status": {"phase": "Running"}})  # type: ignore[arg-type]
        await sync.observe("MODIFIED", _body("orders", labels={"team": "shop"}))  # type: ignore[arg-type]
        assert kube.secret_reads == reads_after_add
        await sync.observe("MODIFIED", _body("orders", generation=2))  # type: ignore[arg-type]
        return kube, reads_after_add

    kube, reads_after_add = asyncio.run(scenario())
    assert reads_after_add == 1
    assert kube.secret_reads == 2  # the spec changed: its Secrets are read again


def test_an_event_older_than_our_claim_does_not_lose_it() -> None:
    async def scenario() -> ConnectSync:
        sync, _, _ = _sync()
        await sync.observe("ADDED", _body("orders"))  # type: ignore[arg-type]
        await _sync_once(sync)  # claims and creates
        # An edit made before the claim landed arrives after it: no claim annotation in it.
        await sync.observe("MODIFIED", _body("orders", generation=2))  # type: ignore[arg-type]
        return sync

    sync = asyncio.run(scenario())
    assert sync.targets["shop", "orders"].owned


def test_deletion_deletes_only_a_claimed_connector_then_releases_the_resource() -> None:
    async def scenario() -> tuple[RecordingKube, LaggingConnect]:
        sync, kube, connect = _sync()
        claimed = _body(
            "mine",
            finalizers=[CONNECT_FINALIZER],
            annotations={ANNOTATION_OWNED_CONNECTOR: "mine"},
            deletionTimestamp="2026-11-22T08:00:00Z",
        )
        # Someone else's connector of the same name: this resource never claimed it.
        foreign = _body("theirs", finalizers=["example.com/other"], deletionTimestamp="2026-11-22T08:00:00Z")
        for body in (claimed, foreign):
            await sync.observe("MODIFIED", copy.deepcopy(body))  # type: ignore[arg-type]
        sync.deleter.start(sync.targets.values())
        await asyncio.gather(*sync.deleter.tasks.values())
        await sync.observe("DELETED", claimed)  # type: ignore[arg-type]
        assert ("shop", "mine") not in sync.targets
        return kube, connect

    kube, connect = asyncio.run(scenario())
    assert connect.deletes == ["mine"]
    assert kube.released == ["mine"]
    assert connect.creates == []  # nothing is created for a resource being deleted


QUICK_RETRY = ConnectPolicy(delete_retry=0.02)  # a deletion tries again every 20 ms


def _deleting(name: str, **annotations: str) -> dict[str, Any]:
    """A Connect that claimed its connector, being deleted."""
    return _body(
        name,
        finalizers=[CONNECT_FINALIZER],
        annotations={ANNOTATION_OWNED_CONNECTOR: name, ANNOTATION_CONNECT_CLUSTER: CLUSTER, **annotations},
        deletionTimestamp="2026-11-22T08:00:00Z",
    )


async def _deletions_end(sync: ConnectSync, within: float) -> bool:
    """Whether every deletion task ended (the resource released) within `within` seconds."""
    sync.deleter.start(sync.targets.values())
    done, _ = await asyncio.wait(list(sync.deleter.tasks.values()), timeout=within)
    for task in done:
        task.result()  # a deletion that failed outright fails the test
    return len(done) == len(sync.deleter.tasks)


def test_a_deletion_whose_connect_cluster_is_gone_releases_the_resource_with_a_warning() -> None:
    """The ConnectCluster was deleted first (a platform team's cleanup, an uninstall): there is nowhere to
    delete the connector from, and waiting would hold the resource and its namespace for ever."""

    async def scenario() -> tuple[bool, RecordingKube, LaggingConnect]:
        sync, kube, connect = _sync(QUICK_RETRY)
        del sync.clusters.known[CLUSTER], kube.cluster_objects[CLUSTER]
        await sync.observe("MODIFIED", _deleting("orders"))  # type: ignore[arg-type]
        return await _deletions_end(sync, within=2.0), kube, connect

    ended, kube, connect = asyncio.run(scenario())
    assert ended and kube.released == ["orders"]
    assert connect.deletes == []
    (left,) = [e for e in kube.events if e[0] == "ConnectorLeft"]
    assert left[2] and "connector orders" in left[1] and f"ConnectCluster {CLUSTER} does not exist" in left[1]


def test_a_connect_cluster_the_operator_has_not_seen_yet_is_not_taken_for_gone() -> None:
    """At start-up Connects may be seen before ConnectClusters: the API server is asked, and a cluster it
    has is unreachable for now (waited for), not missing."""

    async def scenario() -> tuple[bool, RecordingKube]:
        sync, kube, _ = _sync(QUICK_RETRY)
        del sync.clusters.known[CLUSTER]  # not seen by the operator's watch yet, but it exists
        await sync.observe("MODIFIED", _deleting("orders"))  # type: ignore[arg-type]
        return await _deletions_end(sync, within=0.3), kube

    ended, kube = asyncio.run(scenario())
    assert not ended and kube.released == []
    assert {e[0] for e in kube.events} == {"DeleteFailed"}


def test_a_kafka_connect_that_never_answers_is_waited_for_during_the_grace_period_then_let_go() -> None:
    async def scenario() -> tuple[float, RecordingKube]:
        sync, kube, connect = _sync(QUICK_RETRY)
        sync.settings.deletion_grace = 0.4
        connect.delete_error = ConnectUnreachable("cannot reach Kafka Connect at http://connect:8083")
        await sync.observe("MODIFIED", _deleting("orders"))  # type: ignore[arg-type]
        started = time.monotonic()
        assert await _deletions_end(sync, within=3.0)
        return time.monotonic() - started, kube

    took, kube = asyncio.run(scenario())
    assert took >= 0.4  # not before the grace period ended
    assert kube.released == ["orders"]
    reasons = [e[0] for e in kube.events]
    assert reasons[0] == "DeleteFailed" and reasons[-1] == "ConnectorLeft"
    failed = next(e for e in kube.events if e[0] == "DeleteFailed")
    assert "if it still does not answer in" in failed[1]  # the wait says when it ends
    left = kube.events[-1]
    assert left[2] and "has not answered for" in left[1] and "connector orders" in left[1]


def test_the_orphan_policy_releases_at_once_and_leaves_the_connector() -> None:
    async def scenario() -> tuple[bool, RecordingKube, LaggingConnect]:
        sync, kube, connect = _sync(QUICK_RETRY)
        await sync.observe("MODIFIED", _deleting("orders", **{ANNOTATION_DELETION_POLICY: "orphan"}))  # type: ignore[arg-type]
        return await _deletions_end(sync, within=2.0), kube, connect

    ended, kube, connect = asyncio.run(scenario())
    assert ended and kube.released == ["orders"]
    assert connect.deletes == []  # left running on the cluster
    assert [(reason, warning) for reason, _, warning in kube.events] == [("ConnectorOrphaned", False)]
    assert "orders" in kube.events[0][1]


def test_the_orphan_policy_set_on_a_stuck_deletion_releases_it() -> None:
    """Kafka Connect answers but will not delete the connector: the annotation is the way out."""

    async def scenario() -> tuple[bool, bool, RecordingKube, LaggingConnect]:
        sync, kube, connect = _sync(QUICK_RETRY)
        connect.delete_error = ConnectError(500, "Request timed out")
        await sync.observe("MODIFIED", _deleting("orders"))  # type: ignore[arg-type]
        stuck = not await _deletions_end(sync, within=0.2)
        await sync.observe("MODIFIED", _deleting("orders", **{ANNOTATION_DELETION_POLICY: "orphan"}))  # type: ignore[arg-type]
        return stuck, await _deletions_end(sync, within=2.0), kube, connect

    stuck, ended, kube, connect = asyncio.run(scenario())
    assert stuck and ended and kube.released == ["orders"]
    assert connect.deletes == []
    failed = next(e for e in kube.events if e[0] == "DeleteFailed")
    assert ANNOTATION_DELETION_POLICY in failed[1]  # the Event names the way out
    assert kube.events[-1][0] == "ConnectorOrphaned"


def test_a_release_the_api_server_refuses_is_tried_again_after_the_wait_not_at_once() -> None:
    async def scenario() -> list[float]:
        sync, kube, _ = _sync(ConnectPolicy(delete_retry=0.1))
        attempts: list[float] = []

        async def refused(*args: Any) -> None:
            attempts.append(time.monotonic())
            raise ApiError(503, "Service Unavailable")

        kube.remove_finalizer = refused  # type: ignore[method-assign]
        await sync.observe("MODIFIED", _deleting("orders", **{ANNOTATION_DELETION_POLICY: "orphan"}))  # type: ignore[arg-type]
        assert not await _deletions_end(sync, within=0.35)
        return attempts

    attempts = asyncio.run(scenario())
    assert 2 <= len(attempts) <= 5  # every 0.1 s, not as fast as the API server answers


def _running(name: str, *, config: dict[str, str] | None = None, task_state: str = "RUNNING") -> ConnectorView:
    entry: dict[str, Any] = {"status": {"connector": {"state": "RUNNING"}, "tasks": [{"id": 0, "state": task_state}]}}
    if config is not None:
        entry["info"] = {"config": config}
    return ConnectorView.from_listing(name, entry)


def _count_reconciles(sync: ConnectSync) -> list[str]:
    """The names of the resources reconciled from now on, one entry per reconcile."""
    calls: list[str] = []
    reconcile_once = sync._reconcile

    async def counting(client: Any, target: Any, *args: Any) -> bool:
        calls.append(target.name)
        return await reconcile_once(client, target, *args)

    sync._reconcile = counting  # type: ignore[method-assign]
    return calls


def test_a_quiet_connector_costs_no_reconcile_until_it_moves() -> None:
    async def scenario() -> list[int]:
        sync, _, connect = _sync()
        body = _claimed("orders")
        await sync.observe(None, body)  # type: ignore[arg-type]
        target = sync.targets["shop", "orders"]
        target.status["topics"] = ["t"]
        calls = _count_reconciles(sync)
        views = [
            _running("orders", config=target.config),  # settles it
            _running("orders"),  # same, statuses only: nothing to do
            _running("orders", config=target.config),  # same, with configs: nothing to do
            _running("orders", task_state="FAILED"),  # a failed task: acted on
            _running("orders", config=target.config),  # running again: acted on, settles it
            _running("orders"),  # nothing to do
            _running("orders", config={**target.config, "topic": "drifted"}),  # drift: acted on
        ]
        counts = []
        for view in views:
            connect.list_expanded = lambda *, configs=True, v=view: _listing(v)  # type: ignore[method-assign]
            sync.config_reads.forget_answer(CLUSTER)
            await _sync_once(sync)
            counts.append(len(calls))
        return counts

    assert asyncio.run(scenario()) == [1, 1, 1, 2, 3, 3, 4]


async def _listing(view: ConnectorView) -> dict[str, ConnectorView]:
    return {view.name: view}


def _starting(name: str) -> ConnectorView:
    return ConnectorView.from_listing(name, {"status": {"connector": {"state": "RUNNING"}, "tasks": []}})


def test_a_converging_connector_is_reconciled_again_when_it_moves_or_its_recheck_is_due() -> None:
    """A wave of 1,000 creates was reconciled ~100 times per resource at the fast pace, each time
    finding nothing to do: a connector that has not moved waits (`ConnectPolicy.converging_recheck`)."""

    async def scenario() -> tuple[list[int], list[str]]:
        sync, _, connect = _sync()
        await sync.observe(None, _body("orders"))  # type: ignore[arg-type]
        target = sync.targets["shop", "orders"]
        target.status["topics"] = ["t"]  # topics known: no topic look-up due
        calls = _count_reconciles(sync)
        listings: list[dict[str, ConnectorView] | str] = [
            {},  # creates it
            {},  # not listed yet (its herder lags): nothing to do, it waits
            {},  # unmoved: no reconcile
            {"orders": _starting("orders")},  # listed, task not started: moved, reconciled
            {"orders": _starting("orders")},  # unmoved
            "recheck due",  # the same, but its recheck is due
            {"orders": _running("orders", config=target.config)},  # running: moved, reconciled, Ready
        ]
        counts = []
        for listing in listings:
            if listing == "recheck due":
                view, at = target.waiting_view or (None, 0.0)
                target.waiting_view = (view, at - sync.policy.converging_recheck)
                listing = {"orders": _starting("orders")}

            async def answer(*, configs: bool = True, listed: Any = listing) -> dict[str, ConnectorView]:
                return dict(listed)

            connect.list_expanded = answer  # type: ignore[method-assign]
            sync._finished_at.clear()
            await _sync_once(sync)
            counts.append(len(calls))
        ready = next(c for c in target.status["conditions"] if c["type"] == "Ready")
        return counts, [ready["status"], *connect.creates]

    counts, outcome = asyncio.run(scenario())
    assert counts == [1, 2, 2, 3, 3, 4, 5]
    assert outcome == ["True", "orders"]


def test_a_cluster_that_does_not_answer_is_logged_once_and_asked_at_a_bounded_pace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> tuple[ConnectSync, RecordingKube]:
        sync, kube, connect = _sync()

        async def down(*, configs: bool = True) -> dict[str, ConnectorView]:
            raise ConnectUnreachable("no answer from http://connect:8083")

        connect.list_expanded = down  # type: ignore[method-assign]
        for name in ("a", "b", "c"):
            await sync.observe(None, _body(name))  # type: ignore[arg-type]
        for _ in range(5):
            await _sync_once(sync)
        return sync, kube

    with caplog.at_level(logging.INFO, logger="fibers.connect"):
        sync, kube = asyncio.run(scenario())
    lines = [r.getMessage() for r in caplog.records]
    assert lines.count("Kafka Connect unreachable") == 1  # five syncs, three resources: one line
    assert sync._interval(CLUSTER) == sync.policy.unreachable_retry  # not the fast pace of a converging cluster
    ready = next(c for c in kube.statuses["a"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ConnectUnreachable"  # every resource still says so


def test_a_running_connector_whose_topics_are_unknown_waits_while_creates_are_under_way() -> None:
    """No topics are asked while creates are under way (Connect is busy with those): a connector that
    only waits for that ask is not reconciled at every listing meanwhile."""

    async def scenario() -> list[int]:
        sync, _, connect = _sync()
        release = asyncio.Event()
        creates = connect.create

        async def slow_create(name: str, config: dict[str, str], initial_state: str) -> None:
            if name == "slow":
                await release.wait()  # queued behind other creates in Connect's herder
            await creates(name, config, initial_state)

        connect.create = slow_create  # type: ignore[method-assign]
        body = _claimed("orders")
        await sync.observe(None, body)  # type: ignore[arg-type]
        await sync.observe(None, _body("slow"))  # type: ignore[arg-type]
        orders = sync.targets["shop", "orders"]
        calls = _count_reconciles(sync)
        running = {"orders": _running("orders", config=orders.config)}

        async def answer(*, configs: bool = True) -> dict[str, ConnectorView]:
            return dict(running)

        connect.list_expanded = answer  # type: ignore[method-assign]
        counts = []
        for _ in range(4):
            sync._finished_at.clear()
            orders.topics_due = 0.0  # the time to ask for its topics again has come
            await sync._sync_cluster(CLUSTER, list(sync.targets.values()))
            await asyncio.sleep(0)
            counts.append(calls.count("orders"))
        release.set()
        await asyncio.gather(*sync._in_flight.values())
        return counts

    assert asyncio.run(scenario()) == [1, 1, 1, 1]


def test_topics_are_asked_only_once_new_connectors_report_ready() -> None:
    """A connector of ours that has just started gets its Ready written before any topic ask on its
    cluster: topic asks (and the status writes they bring) would queue ahead of it."""

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        sync, kube, connect = _sync()
        asked = _recording_topics(connect)
        older, fresh = await _ready_beside(sync, "fresh")  # "older": its topics are unknown and due
        fresh.created_at = time.monotonic()  # created by us a moment ago, Ready not written yet
        connect.listing = {n: _running(n, config=t.config) for n, t in (("older", older), ("fresh", fresh))}
        await _sync_once(sync)
        first = list(asked)
        ready_before_asks = [n for n, st in kube.statuses.items() if _ready_status(st) == "True"]
        sync._finished_at.clear()
        await _sync_once(sync)
        return first, ready_before_asks, asked

    first, ready_before_asks, asked = asyncio.run(scenario())
    assert first == []  # "fresh" was starting: no topic ask on the cluster
    assert "fresh" in ready_before_asks  # its Ready went out first
    assert sorted(asked) == ["fresh", "older"]  # once it is Ready, both are asked


def _ready_status(status: dict[str, Any]) -> str | None:
    return next((c["status"] for c in status.get("conditions", []) if c["type"] == "Ready"), None)


def test_a_connector_someone_created_just_before_our_create_is_never_ours() -> None:
    """The listing we decided on did not show it yet: our create finds the name taken (409)."""

    async def scenario() -> tuple[ConnectSync, RecordingKube, LaggingConnect]:
        sync, kube, connect = _sync()
        theirs = {"connector.class": "FileStreamSource", "name": "orders", "file": "/theirs", "topic": "theirs"}
        connect.taken["orders"] = theirs
        await sync.observe("ADDED", _body("orders"))  # type: ignore[arg-type]
        await _sync_once(sync)  # claims, creates, finds the name taken, withdraws the claim
        assert not sync.targets["shop", "orders"].owned
        # Our claim's own event arrives after the withdrawal: it does not make the connector ours again.
        claimed = {ANNOTATION_OWNED_CONNECTOR: "orders", ANNOTATION_CONNECT_CLUSTER: CLUSTER}
        await sync.observe("MODIFIED", _body("orders", finalizers=[CONNECT_FINALIZER], annotations=claimed))  # type: ignore[arg-type]
        assert not sync.targets["shop", "orders"].owned
        connect.listing["orders"] = _running("orders", config=theirs)  # Connect lists it now
        await _sync_once(sync)
        return sync, kube, connect

    _, kube, connect = asyncio.run(scenario())
    assert connect.puts == [] and connect.deletes == []  # never updated, never deleted
    assert kube.unannotated == [("orders", (ANNOTATION_OWNED_CONNECTOR, ANNOTATION_CONNECT_CLUSTER))]
    assert kube.released == ["orders"]  # our finalizer went with the claim
    ready = next(c for c in kube.statuses["orders"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ConnectorNotOwned"


def test_a_connector_with_exactly_our_config_found_on_create_is_ours() -> None:
    """An earlier create whose answer was lost: the name is taken, by the config we would write."""

    async def scenario() -> tuple[ConnectSync, RecordingKube]:
        sync, kube, connect = _sync()
        await sync.observe("ADDED", _body("orders"))  # type: ignore[arg-type]
        connect.taken["orders"] = dict(sync.targets["shop", "orders"].config)
        await _sync_once(sync)
        return sync, kube

    sync, kube = asyncio.run(scenario())
    assert sync.targets["shop", "orders"].owned and kube.unannotated == [] and kube.released == []


def test_a_cluster_with_many_connectors_is_listed_less_often_even_when_nudged() -> None:
    """Listings cost Connect (and the operator) in proportion to the connectors listed: while connectors
    converge, a cluster of 100 is listed at the fast interval, one of 1,000 less often."""
    sync, _, _ = _sync()
    sync._converging.add(CLUSTER)
    sync._listed[CLUSTER] = 100
    assert sync._interval(CLUSTER) == sync.settings.fast_interval
    sync._listed[CLUSTER] = 1000
    spacing = 1000 * sync.policy.listing_spacing_per_connector
    assert spacing > sync.settings.fast_interval
    assert sync._interval(CLUSTER) == pytest.approx(spacing)
    now = time.monotonic()
    sync._last_sync[CLUSTER] = now
    sync._nudged.add(CLUSTER)  # a resource changed: synced without waiting for the interval ...
    assert sync._wait(CLUSTER, now) == pytest.approx(spacing)  # ... but not sooner than the spacing
    sync._converging.clear()
    sync._nudged.clear()
    assert sync._wait(CLUSTER, now) == pytest.approx(sync.settings.interval)  # at rest: one listing per interval


def test_configs_are_not_read_while_our_creates_are_under_way() -> None:
    """Connect answers a listing with configs with one herder request per connector, queued between the
    creates of a wave and the starts of their tasks: the periodic config read waits until the creates are
    done and the new connectors have started (or had `topics_wait_for_starting` to)."""

    async def scenario() -> list[bool]:
        sync, _, connect = _sync()
        release = asyncio.Event()
        creates = connect.create
        asked: list[bool] = []
        listing = connect.list_expanded

        async def slow_create(name: str, config: dict[str, str], initial_state: str) -> None:
            await release.wait()  # queued behind other creates in Connect's herder
            await creates(name, config, initial_state)

        async def recording(*, configs: bool = True) -> dict[str, ConnectorView]:
            asked.append(configs)
            return await listing(configs=configs)

        connect.create = slow_create  # type: ignore[method-assign]
        connect.list_expanded = recording  # type: ignore[method-assign]
        await sync.observe(None, _body("orders"))  # type: ignore[arg-type]
        await sync._sync_cluster(CLUSTER, list(sync.targets.values()))  # the first sync reads configs; creates
        sync.config_reads.forget_answer(CLUSTER)  # an interval has passed
        await sync._sync_cluster(CLUSTER, list(sync.targets.values()))  # the create is still under way
        release.set()
        await asyncio.gather(*sync._in_flight.values())
        await sync._sync_cluster(CLUSTER, list(sync.targets.values()))  # created, still starting: not yet
        sync.targets["shop", "orders"].created_at -= POLICY.topics_wait_for_starting  # it had its time to start
        await sync._sync_cluster(CLUSTER, list(sync.targets.values()))  # the configs are read
        return asked

    assert asyncio.run(scenario()) == [True, False, False, True]


def test_a_cluster_saturated_with_our_reconciles_is_listed_less_often_until_they_drain() -> None:
    """With more reconciles in flight than calls go to Connect at once, a listing cannot start a create
    sooner, it only reports Ready sooner: it waits `saturated_listing_spacing`; as the queue drains to
    what Connect is sent at once, the loop is woken and the usual pace returns."""

    async def scenario() -> tuple[float, float, bool, float, float]:
        sync, _, connect = _sync()
        release = asyncio.Event()

        async def slow_create(name: str, config: dict[str, str], initial_state: str) -> None:
            await release.wait()  # Connect's queue: the creates wait their turn

        connect.create = slow_create  # type: ignore[method-assign]
        for i in range(sync.policy.parallel_calls + 1):
            await sync.observe(None, _body(f"c{i}"))  # type: ignore[arg-type]
        await sync._sync_cluster(CLUSTER, list(sync.targets.values()))
        saturated = sync._interval(CLUSTER)  # the time from this sync to the next listing
        sync._wake.clear()
        release.set()
        await asyncio.gather(*sync._in_flight.values())
        drained = sync._interval(CLUSTER)
        return (
            saturated,
            drained,
            sync._wake.is_set(),
            sync.settings.fast_interval,
            sync.policy.saturated_listing_spacing,
        )

    saturated, drained, woken, fast, spacing = asyncio.run(scenario())
    assert spacing > fast
    assert saturated == pytest.approx(spacing)  # not the fast interval
    assert drained == pytest.approx(fast)
    assert woken


# ----- ownership: what Kafka Connect records, not what the resource's editor writes ------------------

OTHER_TEAMS = "team-a/orders-cdc"  # the Connect, in another namespace, that created the connector


def _intruder(**meta: Any) -> dict[str, Any]:
    """A Connect naming another namespace's connector and carrying a forged claim on it."""
    body = _body(
        "intruder",
        finalizers=[CONNECT_FINALIZER],
        annotations={ANNOTATION_OWNED_CONNECTOR: "orders-cdc", ANNOTATION_CONNECT_CLUSTER: CLUSTER},
        **meta,
    )
    body["spec"]["connectorName"] = "orders-cdc"
    return body


def test_a_forged_claim_never_changes_stops_or_deletes_another_namespaces_connector() -> None:
    """The claim annotation is the resource editor's to write: with it, a Connect named after another
    team's connector must still leave that connector alone, say whose it is, and not delete it."""

    async def scenario() -> tuple[RecordingKube, LaggingConnect]:
        sync, kube, connect = _sync(QUICK_RETRY)
        theirs = {"name": "orders-cdc", "connector.class": "Debezium", "fibers.owner": OTHER_TEAMS}
        connect.owners["orders-cdc"] = OTHER_TEAMS
        connect.listing["orders-cdc"] = _running("orders-cdc", config=theirs)
        await sync.observe("ADDED", _intruder())  # type: ignore[arg-type]
        await _sync_once(sync)
        await sync.observe("MODIFIED", _intruder(deletionTimestamp="2026-11-22T08:00:00Z"))  # type: ignore[arg-type]
        assert await _deletions_end(sync, within=2.0)
        return kube, connect

    kube, connect = asyncio.run(scenario())
    assert connect.puts == [] and connect.creates == [] and connect.deletes == []
    ready = next(c for c in kube.statuses["intruder"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ConnectorNotOwned" and "namespace team-a" in ready["message"]
    assert kube.released == ["intruder"]  # its deletion is not held up: the connector was never its own
    assert any(e[0] == "ConnectorNotOwned" and "namespace team-a" in e[1] for e in kube.events)


def test_two_resources_wanting_the_same_config_never_both_own_one_connector() -> None:
    """Configs that happen to be identical made a create that found the name taken adopt the connector:
    two resources then changed and deleted one connector. The owner in its config tells them apart."""

    async def scenario() -> tuple[ConnectSync, LaggingConnect]:
        sync, _, connect = _sync()
        first, second = _body("first"), _body("second")
        for body in (first, second):
            body["spec"]["connectorName"] = "shared"
        await sync.observe("ADDED", first)  # type: ignore[arg-type]
        await _sync_once(sync)
        connect.taken["shared"] = dict(sync.targets["shop", "first"].config)  # created by "first"
        await sync.observe("ADDED", second)  # type: ignore[arg-type]
        await _sync_once(sync)
        return sync, connect

    sync, connect = asyncio.run(scenario())
    assert connect.creates == ["shared"]
    assert sync.targets["shop", "first"].owned
    assert not sync.targets["shop", "second"].owned


def test_a_connector_from_before_the_owner_record_is_taken_over_only_with_its_exact_config() -> None:
    """An upgrade meets connectors created without the owner key: the resource that claimed it and wants
    exactly its config takes it over (writing the key); a claim with any other config does not."""

    async def scenario(config_of: str) -> LaggingConnect:
        sync, _, connect = _sync()
        body = _claimed("orders")
        await sync.observe("ADDED", body)  # type: ignore[arg-type]
        legacy = {k: v for k, v in sync.targets["shop", "orders"].config.items() if k != OWNER_KEY}
        if config_of == "someone else":
            legacy["file"] = "/theirs"
        connect.listing["orders"] = _running("orders", config=legacy)
        await _sync_once(sync)
        return connect

    assert asyncio.run(scenario("ours")).puts == ["orders"]  # the key written: ours from now on
    assert asyncio.run(scenario("someone else")).puts == []


def test_a_restarted_operator_does_not_rewrite_a_status_that_has_not_changed() -> None:
    """After a restart every Connect is seen again with the status the last process wrote. Unchanged, it is
    not written again until its heartbeat is due — counted from the status's own lastSyncTime, since the
    new process has written nothing yet (it rewrote every Connect's status at start: bench/operator_restart)."""

    async def process(stored: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
        """One operator process (it has written nothing yet) seeing the resource with `stored` as its
        status, over three syncs of a running connector; the statuses it wrote."""
        sync, kube, connect = _sync()
        body = _claimed("orders")
        if stored is not None:
            body["status"] = copy.deepcopy(stored)
        await sync.observe(None, body)  # type: ignore[arg-type]
        connect.list_expanded = lambda *, configs=True: _listing(  # type: ignore[method-assign]
            _running("orders", config=sync.targets["shop", "orders"].config)
        )
        connect.topics = lambda name: _topics()  # type: ignore[method-assign,assignment]
        for _ in range(3):
            sync.config_reads.forget_answer(CLUSTER)
            await _sync_once(sync)
        return kube.statuses

    status = asyncio.run(process(None))["orders"]
    assert (conditions.find(status["conditions"], conditions.READY) or {}).get("status") == "True"
    assert asyncio.run(process(status)) == {}
    # A status whose last sync is older than the heartbeat is written again, once.
    stale = {**status, "lastSyncTime": "2020-01-01T00:00:00Z"}
    written = asyncio.run(process(stale))
    assert list(written) == ["orders"] and written["orders"]["lastSyncTime"] > stale["lastSyncTime"]


async def _topics() -> list[str]:
    return ["t"]


def _statuses_only(listing: dict[str, ConnectorView]) -> dict[str, ConnectorView]:
    return {name: dataclasses.replace(view, config=None) for name, view in listing.items()}


def test_a_config_listing_connect_does_not_answer_in_time_falls_back_to_statuses() -> None:
    """Connect answers a listing with configs through its herder's queue, one request per connector: while
    it starts thousands of tasks that took minutes (connect_scale at 5,000). Its statuses still come at once,
    so the resources keep their Ready (not ConnectUnreachable), and configs are asked again only later."""

    async def scenario() -> tuple[list[bool], dict[str, Any]]:
        sync, kube, connect = _sync()
        asked: list[bool] = []
        body = _claimed("orders")
        await sync.observe(None, body)  # type: ignore[arg-type]
        connect.listing = {"orders": _running("orders", config=sync.targets["shop", "orders"].config)}
        connect.topics = lambda name: _topics()  # type: ignore[method-assign,assignment]
        await _sync_once(sync)  # configs read: the connector is verified, Ready
        herder_busy = True

        async def listing(*, configs: bool = True) -> dict[str, ConnectorView]:
            asked.append(configs)
            if configs and herder_busy:
                raise ConnectUnreachable("cannot reach Kafka Connect at http://connect:8083: TimeoutError()")
            return dict(connect.listing) if configs else _statuses_only(connect.listing)

        connect.list_expanded = listing  # type: ignore[method-assign]
        for _ in range(3):
            sync.config_reads.forget_answer(CLUSTER)  # an interval has passed since the last answer
            sync._finished_at.clear()
            await _sync_once(sync)
        return asked, kube.statuses["orders"]

    asked, status = asyncio.run(scenario())
    assert asked == [True, False, False, False]  # one config listing not answered, then statuses only
    ready = conditions.find(status["conditions"], conditions.READY) or {}
    assert (ready.get("status"), ready.get("reason")) == ("True", "Running")


def test_configs_are_asked_less_often_the_longer_connect_takes_to_list_them() -> None:
    """A listing with configs costs Connect more than linearly in its connectors; its pace follows how long
    the last one took, so at thousands of connectors it is not asked every interval."""
    from fibers.connect.config_reads import ConfigReads

    reads = ConfigReads(interval=10.0, policy=POLICY)
    assert reads.due("a", 0.0, quiet=True)  # never read
    reads.answered("a", 0.0, seconds=0.05)
    assert not reads.due("a", 9.0, quiet=True) and reads.due("a", 10.0, quiet=True)
    assert not reads.due("a", 10.0, quiet=False)  # Connect busy with our creates or starting connectors
    reads.answered("a", 100.0, seconds=3.0)
    spacing = POLICY.config_read_spacing_factor * 3.0
    assert not reads.due("a", 100.0 + spacing - 1, quiet=True) and reads.due("a", 100.0 + spacing, quiet=True)
    reads.not_answered("a", 200.0)
    assert not reads.may_force("a", 200.0 + POLICY.config_read_retry - 1)  # not even for an unverified spec
    assert reads.may_force("a", 200.0 + POLICY.config_read_retry)
    assert reads.due("a", 200.0 + POLICY.config_read_retry, quiet=True)


def test_a_connect_that_answers_nothing_is_unreachable_after_one_timeout_not_two() -> None:
    """A partitioned Connect (packets dropped) answers no listing. The statuses listing that stands in for a
    configs listing not answered is asked while that one still waits, not after it: the resources say
    ConnectUnreachable after one REST timeout (the chaos suite's 22 s outage, with a 15 s timeout)."""
    policy = dataclasses.replace(POLICY, statuses_alongside_configs_after=0.05)

    async def scenario() -> tuple[list[tuple[str, bool]], dict[str, Any]]:
        sync, kube, connect = _sync(policy)
        calls: list[tuple[str, bool]] = []
        body = _claimed("orders")
        await sync.observe(None, body)  # type: ignore[arg-type]

        async def hung(*, configs: bool = True) -> dict[str, ConnectorView]:
            calls.append(("asked", configs))
            await asyncio.sleep(0.3)  # the REST timeout
            calls.append(("timed out", configs))
            raise ConnectUnreachable("cannot reach Kafka Connect at http://connect:8083: TimeoutError()")

        connect.list_expanded = hung  # type: ignore[method-assign]
        await _sync_once(sync)
        return calls, kube.statuses["orders"]

    calls, status = asyncio.run(scenario())
    assert calls[:2] == [("asked", True), ("asked", False)]  # both wait at once: one timeout in all
    ready = conditions.find(status["conditions"], conditions.READY) or {}
    assert (ready.get("status"), ready.get("reason")) == ("False", "ConnectUnreachable")


def test_topics_and_configs_wait_while_connect_is_still_starting_our_connectors() -> None:
    """Connect listing one of ours RUNNING without a task is still starting it (after a wave, or a rebalance:
    17 minutes at 5,000): no topic ask and no periodic configs listing adds to its load meanwhile."""

    async def scenario() -> tuple[list[str], list[bool], list[str], list[bool]]:
        sync, _kube, connect = _sync()
        topic_asks = _recording_topics(connect)
        config_asks: list[bool] = []

        async def listing(*, configs: bool = True) -> dict[str, ConnectorView]:
            config_asks.append(configs)
            return dict(connect.listing) if configs else _statuses_only(connect.listing)

        connect.list_expanded = listing  # type: ignore[method-assign]
        older, waiting = await _ready_beside(sync, "waiting")  # "older": its topics are unknown and due
        older.config_verified = waiting.config_verified = True  # read before: only the periodic read is due
        no_task = ConnectorView.from_listing(
            "waiting", {"status": {"connector": {"state": "RUNNING"}, "tasks": []}, "info": {"config": waiting.config}}
        )
        connect.listing = {"older": _running("older", config=older.config), "waiting": no_task}
        await _sync_once(sync)  # its listing (configs, as at every start) shows "waiting" not started
        config_asks.clear()
        for _ in range(2):
            sync.config_reads.forget_answer(CLUSTER)
            sync._finished_at.clear()
            await _sync_once(sync)
        held = (list(topic_asks), list(config_asks))
        connect.listing["waiting"] = _running("waiting", config=waiting.config)  # Connect gave it its task
        for _ in range(2):
            sync.config_reads.forget_answer(CLUSTER)
            sync._finished_at.clear()
            await _sync_once(sync)
        return *held, topic_asks, config_asks

    held_topics, held_configs, topic_asks, config_asks = asyncio.run(scenario())
    assert (held_topics, held_configs) == ([], [False, False])  # statuses only, no topic ask
    assert sorted(set(topic_asks)) == ["older", "waiting"] and True in config_asks


def test_connect_starting_holds_back_only_while_it_gets_through_ours() -> None:
    """The wait is Connect's own "not started" (unassigned, running without a task, a task unassigned), and
    lasts while Connect starts them; one that never gets a task stops counting once nothing moved for the
    patience, and does not make later changes wait again."""
    from fibers.connect.tasks_starting import TasksStarting, not_started

    def view(state: str, *tasks: str) -> ConnectorView:
        entry = {
            "status": {"connector": {"state": state}, "tasks": [{"id": i, "state": t} for i, t in enumerate(tasks)]}
        }
        return ConnectorView.from_listing("c", entry)

    running = view("RUNNING", "RUNNING")
    assert [
        not_started(view("UNASSIGNED")),
        not_started(view("RUNNING")),
        not_started(view("RUNNING", "UNASSIGNED")),
    ] == [True] * 3
    assert not any(not_started(v) for v in (running, view("STOPPED"), view("PAUSED", "PAUSED"), view("FAILED")))
    watch, patience = TasksStarting(POLICY), POLICY.tasks_starting_patience
    listing = {"a": view("RUNNING"), "b": view("UNASSIGNED"), "c": view("RUNNING"), "theirs": view("RUNNING")}
    watch.observe("x", listing, ["a", "b", "c"], 0.0)
    assert watch.holds("x", patience - 1) and watch.count("x") == 3
    watch.observe("x", {**listing, "a": running}, ["a", "b", "c"], patience - 1)  # Connect started one
    assert watch.holds("x", 2 * patience - 2) and not watch.holds("x", 2 * patience - 1)
    watch.observe("x", {**listing, "a": running}, ["a", "b", "c"], 2 * patience)  # nothing moved since
    assert not watch.holds("x", 2 * patience) and watch.count("x") == 0  # "b" and "c" stalled
    later = 3 * patience
    watch.observe("x", {**listing, "a": running, "d": view("RUNNING")}, ["a", "b", "c", "d"], later)
    assert watch.holds("x", later)  # a new one: waited for
    watch.observe("x", {**listing, "a": running, "d": running}, ["a", "b", "c", "d"], later + 1)
    assert not watch.holds("x", later + 1)  # started; "b" and "c", stalled, hold nothing back again
    watch.observe("x", {"theirs": view("RUNNING")}, ["a", "b"], later + 2)  # only a connector not ours
    assert not watch.holds("x", later + 2)


def test_a_statuses_listing_refused_at_once_beside_a_late_configs_listing_is_asked_again() -> None:
    """Behind a Service, the statuses listing asked beside late configs may reach a worker that is restarting
    and be refused at once: it is asked again when the configs do not come, not taken as Connect's answer."""
    policy = dataclasses.replace(POLICY, statuses_alongside_configs_after=0.05)

    async def scenario() -> tuple[list[bool], dict[str, Any]]:
        sync, kube, connect = _sync(policy)
        body = _claimed("orders")
        await sync.observe(None, body)  # type: ignore[arg-type]
        connect.listing = {"orders": _running("orders", config=sync.targets["shop", "orders"].config)}
        connect.topics = lambda name: _topics()  # type: ignore[method-assign,assignment]
        calls: list[bool] = []

        async def listing(*, configs: bool = True) -> dict[str, ConnectorView]:
            calls.append(configs)
            if configs:
                await asyncio.sleep(0.3)
                raise ConnectUnreachable("cannot reach Kafka Connect at http://connect:8083: TimeoutError()")
            if calls.count(False) == 1:
                raise ConnectUnreachable("Kafka Connect at http://connect:8083 answered 404: <html>")
            return _statuses_only(connect.listing)

        connect.list_expanded = listing  # type: ignore[method-assign]
        await _sync_once(sync)
        return calls, kube.statuses["orders"]

    calls, status = asyncio.run(scenario())
    assert calls == [True, False, False]
    ready = conditions.find(status["conditions"], conditions.READY) or {}
    assert ready.get("reason") != "ConnectUnreachable"


def test_a_secret_whose_value_asks_a_config_provider_creates_nothing_and_is_said_without_its_value() -> None:
    """Kafka Connect would replace `${file:…}` with a worker's file: a Secret of the namespace cannot ask for
    one either. The connector is not created, and the condition names the key, never the value."""

    async def scenario() -> tuple[ConnectSync, RecordingKube, LaggingConnect]:
        sync, kube, connect = _sync()
        kube.secret_value = lambda *_: asyncio.sleep(0, "pw${file:/etc/team-b.properties:password}")  # type: ignore[method-assign]
        await sync.observe(None, _body("orders"))  # type: ignore[arg-type]
        await _sync_once(sync)
        return sync, kube, connect

    sync, kube, connect = asyncio.run(scenario())
    assert connect.creates == [] and connect.puts == []
    problem = sync.targets["shop", "orders"].problem
    assert problem is not None and problem.reason == "InvalidSpec"
    assert problem.message.startswith("spec.secretConfig.password: the Secret's value asks a Kafka Connect config")
    said = repr(kube.statuses) + repr(kube.events)
    assert "team-b" not in said and "pw" not in said.replace("password", "")


def test_a_connect_whose_config_asks_a_config_provider_keeps_its_connector_and_deletes_it_when_deleted() -> None:
    """A connector made before such values were refused (an upgrade): it is left as it is, the resource says
    why, and deleting the resource still deletes the connector (refused when parsed, the resource owned it no
    more, and a deletion released it with the connector left running for nobody)."""

    def provider(**meta: Any) -> dict[str, Any]:
        body = _claimed("orders") | {"metadata": {**_claimed("orders")["metadata"], **meta}}
        body["spec"]["config"]["file"] = "${file:/etc/team-b.properties:path}"
        return body

    async def scenario() -> tuple[ConnectSync, LaggingConnect]:
        sync, _, connect = _sync()
        await sync.observe(None, provider())  # type: ignore[arg-type]
        await _sync_once(sync)
        target = sync.targets["shop", "orders"]
        assert target.spec is not None and target.problem is not None and target.problem.reason == "InvalidSpec"
        assert target.problem.message.startswith("spec.config.file: '${file:/etc/team-b.properties:path}' asks")
        await sync.observe("MODIFIED", provider(deletionTimestamp="2026-11-22T08:00:00Z"))  # type: ignore[arg-type]
        sync.deleter.start(sync.targets.values())
        await asyncio.gather(*sync.deleter.tasks.values())
        return sync, connect

    _, connect = asyncio.run(scenario())
    assert connect.creates == [] and connect.puts == []
    assert connect.deletes == ["orders"]
