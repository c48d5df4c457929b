"""A sink's consumer group across ConnectClusters that share one Kafka (`fibers.connect.groups`).

One Connect cluster per team on one Kafka is a common shape. There a Connect on team B's cluster naming
team A's connector would join team A's consumer group: it reads part of team A's records (which team A's
sink then never sees) and, told to seek, moves team A's offsets. Ownership (`fibers.connect.ownership`)
is per Connect cluster and does not see it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fibers.conditions import READY, RECONCILING, STALLED
from fibers.connect import groups
from fibers.connect.clusters import ClusterSpec
from fibers.connect.reconcile import Outcome, Target, decide, report
from fibers.connect.registry import ClusterSettings, ConnectClusters, Known
from fibers.connect.settings import SyncSettings
from fibers.connect.spec import parse
from fibers.connect.sync import ConnectSync
from tests.unit.test_connect_reconcile import NOW
from tests.unit.test_connect_sync import LaggingConnect, RecordingKube

KAFKA = "kafka-cluster-id-1"
A, B = "team-a-connect", "team-b-connect"  # two ConnectClusters on one Kafka


def _target(
    namespace: str,
    cluster: str,
    *,
    created: str,
    recorded: bool = False,
    config: dict[str, Any] | None = None,
    secret_config: dict[str, Any] | None = None,
) -> Target:
    body: dict[str, Any] = {
        "cluster": cluster,
        "class": "io.example.OrdersSink",
        "connectorName": "orders-sink",
        "config": config if config is not None else {"topics": "orders"},
    }
    if secret_config:
        body["secretConfig"] = secret_config
    spec = parse(body, "orders")
    return Target(
        namespace=namespace,
        name="orders",
        uid=f"uid-{namespace}",
        generation=1,
        spec=spec,
        config=spec.full_config({}, f"{namespace}/orders"),
        status={"connectorName": "orders-sink"} if recorded else {},
        meta={"creationTimestamp": created},
        cluster=cluster,
        placed=True,
    )


def test_a_sink_naming_a_group_another_cluster_on_the_same_kafka_holds_is_not_created() -> None:
    first = _target("team-a", A, created="2026-11-01T00:00:00Z")
    second = _target("team-b", B, created="2026-11-02T00:00:00Z")
    assert groups.check([second, first], {A: KAFKA, B: KAFKA}) == [second]
    assert first.group_problem is None
    assert second.group_problem is not None and second.group_problem.reason == groups.IN_USE
    message = second.group_problem.message
    assert "connect-orders-sink" in message and "namespace team-a" in message and f"ConnectCluster {A}" in message
    assert decide(first, None, NOW) != [] and decide(second, None, NOW) == []
    status = report(second, None, Outcome(), NOW)
    states = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert states[READY] == ("False", groups.IN_USE) and states[STALLED] == ("True", groups.IN_USE)
    # Asked again, nothing changes: no flapping, no write.
    assert groups.check([first, second], {A: KAFKA, B: KAFKA}) == []


def test_the_connect_that_recorded_the_connector_keeps_the_group_whatever_its_age() -> None:
    """The order survives a restart and a re-created resource: the recorded owner first, then the oldest."""
    newer_owner = _target("team-a", A, created="2026-11-05T00:00:00Z", recorded=True)
    older = _target("team-b", B, created="2026-11-01T00:00:00Z")
    groups.check([older, newer_owner], {A: KAFKA, B: KAFKA})
    assert newer_owner.group_problem is None and older.group_problem is not None


def test_a_holder_being_deleted_keeps_its_group_until_it_is_gone() -> None:
    holder = _target("team-a", A, created="2026-11-01T00:00:00Z", recorded=True)
    holder.deleting = True
    waiting = _target("team-b", B, created="2026-11-02T00:00:00Z")
    groups.check([holder, waiting], {A: KAFKA, B: KAFKA})
    assert waiting.group_problem is not None
    assert groups.check([waiting], {A: KAFKA, B: KAFKA}) == [waiting]  # gone: the group is free
    assert waiting.group_problem is None


def test_topics_in_secret_config_still_make_a_sink() -> None:
    ref = {"topics": {"secretKeyRef": {"name": "s", "key": "topics"}}}
    first = _target("team-a", A, created="2026-11-01T00:00:00Z")
    hidden = _target("team-b", B, created="2026-11-02T00:00:00Z", config={"x": "1"}, secret_config=ref)
    groups.check([first, hidden], {A: KAFKA, B: KAFKA})
    assert hidden.group_problem is not None and hidden.group_problem.reason == groups.IN_USE


def test_other_kafkas_sources_and_one_cluster_are_not_contested() -> None:
    first = _target("team-a", A, created="2026-11-01T00:00:00Z")
    other_kafka = _target("team-b", B, created="2026-11-02T00:00:00Z")
    groups.check([first, other_kafka], {A: KAFKA, B: "kafka-cluster-id-2"})
    assert other_kafka.group_problem is None
    source = _target("team-b", B, created="2026-11-02T00:00:00Z", config={"file": "/tmp/in", "topic": "t"})
    groups.check([first, source], {A: KAFKA, B: KAFKA})
    assert source.group_problem is None
    # On one Connect cluster a connector name is one connector: ownership's to settle, not this.
    same_cluster = _target("team-b", A, created="2026-11-02T00:00:00Z")
    groups.check([first, same_cluster], {A: KAFKA, B: KAFKA})
    assert same_cluster.group_problem is None


def test_a_sink_waits_for_its_clusters_kafka_to_be_known_where_another_cluster_exists() -> None:
    new = _target("team-b", B, created="2026-11-02T00:00:00Z")
    groups.check([new], {A: KAFKA, B: None})
    assert new.group_problem is not None and new.group_problem.reason == groups.KAFKA_UNKNOWN
    assert decide(new, None, NOW) == []
    status = report(new, None, Outcome(), NOW)
    states = {c["type"]: c["status"] for c in status["conditions"]}
    assert states[RECONCILING] == "True" and states[STALLED] == "False"  # waited for, not given up on
    groups.check([new], {B: None})  # the only cluster: nothing to check against
    assert new.group_problem is None
    recorded = _target("team-b", B, created="2026-11-02T00:00:00Z", recorded=True)
    groups.check([recorded], {A: KAFKA, B: None})  # created before: it goes on
    assert recorded.group_problem is None


def _body(namespace: str, cluster: str, created: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": namespace,
            "name": "orders",
            "uid": f"uid-{namespace}",
            "generation": 1,
            "creationTimestamp": created,
        },
        "spec": {
            "cluster": cluster,
            "class": "io.example.OrdersSink",
            "connectorName": "orders-sink",
            "config": {"topics": "orders"},
            **spec,
        },
    }


def test_the_sync_creates_the_group_holder_only_and_refuses_the_others_seek() -> None:
    """Two teams, each on its own ConnectCluster, both on one Kafka, both asking for connector
    orders-sink: the first is created on its cluster; the second is not created, and its seek (which
    would move team A's offsets) ends Failed without a call to its Kafka Connect."""

    async def scenario() -> tuple[RecordingKube, dict[str, LaggingConnect]]:
        kube = RecordingKube()
        connects = {A: LaggingConnect(), B: LaggingConnect()}
        clusters = ConnectClusters(kube, ClusterSettings())  # type: ignore[arg-type]
        for name, connect in connects.items():
            known = Known(ClusterSpec(name, f"http://{name}:8083"), f"uid-{name}", client=connect)  # type: ignore[arg-type]
            known.status = {"kafkaClusterId": KAFKA}
            clusters.known[name] = known
            kube.cluster_objects[name] = {"metadata": {"name": name}}
        clusters.namespace_labels.update({"team-a": {}, "team-b": {}})
        sync = ConnectSync(kube, SyncSettings(fast_interval=0.05), clusters)  # type: ignore[arg-type]
        seek = {"seek": {"nonce": "1", "startFrom": {"position": "earliest"}}}
        await sync.observe("ADDED", _body("team-a", A, "2026-11-01T00:00:00Z"))  # type: ignore[arg-type]
        await sync.observe("ADDED", _body("team-b", B, "2026-11-02T00:00:00Z", **seek))  # type: ignore[arg-type]
        sync.check_groups()
        for name in (A, B):
            await sync._sync_cluster(name, [t for t in sync.targets.values() if t.cluster == name])
            await asyncio.gather(*sync._in_flight.values())
        return kube, connects

    kube, connects = asyncio.run(scenario())
    assert connects[A].creates == ["orders-sink"]
    assert connects[B].creates == [] and connects[B].puts == []
    ready = {c["type"]: c for c in kube.statuses["orders"]["conditions"]}  # the last written: team-b's
    assert ready[READY]["reason"] == groups.IN_USE and "namespace team-a" in ready[READY]["message"]
    assert ready["Offsets"]["reason"] == "SeekFailed" and "connect-orders-sink" in ready["Offsets"]["message"]
    assert kube.statuses["orders"]["lastSeekNonce"] == "1"
