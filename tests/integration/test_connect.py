"""Connect resources against the real kube-apiserver and the real Kafka Connect worker."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
from http.client import HTTPMessage
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

import fibers_stack as stack
from fibers.api import ANNOTATION_DELETION_POLICY, ANNOTATION_OWNED_CONNECTOR, CONNECT_FINALIZER
from fibers.conditions import find, parse_time
from fibers.connect.policy import POLICY
from fibers_stack import StackInfo, platform_resources
from tests.helpers import (
    Resources,
    debezium_connect,
    debezium_spec,
    drop_slot,
    produce,
    produce_around,
    read_all,
    read_topic,
    wait_for,
)
from tests.integration.conftest import OperatorProcess
from tests.integration.proxy import ForwardingProxy

pytestmark = pytest.mark.connect


@pytest.fixture(scope="module")
def connects(kube: ApiClient, namespace: str, operator: OperatorProcess) -> Resources:
    return Resources(kube, "connects", namespace)


@pytest.fixture
def source_file(tmp_path: Path) -> Path:
    path = tmp_path / "source.txt"
    path.write_text("".join(f"record {i}\n" for i in range(3)))
    os.chmod(tmp_path, 0o755)
    return path


def live_config(connect_http: httpx.Client, connector: str) -> dict[str, str]:
    """The connector's live config; a worker busy rebalancing answers 409/5xx for a moment, so ask again."""
    response = wait_for(
        lambda: (r := connect_http.get(f"/connectors/{connector}/config")).status_code not in (409, 500, 503) and r,
        timeout=30,
        what=f"a config answer for {connector}",
    )
    response.raise_for_status()
    return dict(response.json())


def live_state(connect_http: httpx.Client, connector: str) -> str:
    response = connect_http.get(f"/connectors/{connector}/status")
    return str(response.json()["connector"]["state"]) if response.status_code == 200 else "ABSENT"


def source_spec(path: Path, topic: str, **extra: Any) -> dict[str, Any]:
    return {"class": "FileStreamSource", "config": {"file": str(path), "topic": topic}, **extra}


def test_create_runs_the_connector_and_reports_it(
    connects: Resources, connect_http: httpx.Client, stack_info: StackInfo, source_file: Path, unique: str
) -> None:
    connects.create(unique, source_spec(source_file, unique))
    connects.wait_condition(unique, "True", "Running")
    status = connects.status(unique)
    assert status["phase"] == "Running"
    assert status["connectorName"] == unique
    assert status["connectorState"] == "RUNNING"
    assert status["tasksReady"] == "1/1"
    assert status["tasks"][0]["state"] == "RUNNING"
    meta = connects.get(unique)["metadata"]
    assert status["observedGeneration"] == meta["generation"]
    # The claim on the connector name and the finalizer that deletes it, both written before the create.
    assert meta["finalizers"] == [CONNECT_FINALIZER]
    assert meta["annotations"][ANNOTATION_OWNED_CONNECTOR] == unique
    assert live_config(connect_http, unique)["connector.class"] == "FileStreamSource"
    assert [json.loads(v) for v in read_topic(stack_info.kafka_bootstrap, unique, 3)] == [
        f"record {i}" for i in range(3)
    ]
    connects.wait_status(unique, lambda s: s.get("topics") == [unique], what="topics reported", timeout=30)
    row = connects.printed(unique)
    assert (row["Class"], row["State"], row["Tasks"], row["Ready"], row["Reason"]) == (
        "FileStreamSource",
        "RUNNING",
        "1/1",
        "True",
        "Running",
    )
    assert row["Cluster"] == status["cluster"] and row["Cluster"]


def test_spec_update_is_applied_and_drift_is_reverted(
    connects: Resources, connect_http: httpx.Client, source_file: Path, unique: str
) -> None:
    connects.create(unique, source_spec(source_file, unique, config={"file": str(source_file), "topic": unique}))
    connects.wait_condition(unique, "True")

    connects.patch(unique, {"spec": {"config": {"batch.size": 7}, "tasksMax": 2}})
    wait_for(lambda: live_config(connect_http, unique).get("batch.size") == "7", timeout=30, what="config applied")
    assert live_config(connect_http, unique)["tasks.max"] == "2"
    connects.wait_condition(unique, "True")

    drifted = {**live_config(connect_http, unique), "batch.size": "99", "extra.key": "x"}
    assert connect_http.put(f"/connectors/{unique}/config", json=drifted).status_code == 200
    wait_for(
        lambda: (c := live_config(connect_http, unique)).get("batch.size") == "7" and "extra.key" not in c,
        timeout=30,
        what="out-of-band edit reverted",
    )


def test_pause_resume_stop(connects: Resources, connect_http: httpx.Client, source_file: Path, unique: str) -> None:
    connects.create(unique, source_spec(source_file, unique, state="paused"))
    connects.wait_condition(unique, "True", "Paused")
    assert live_state(connect_http, unique) == "PAUSED"  # created directly in the desired state

    connects.patch(unique, {"spec": {"state": "running"}})
    connects.wait_condition(unique, "True", "Running")
    assert live_state(connect_http, unique) == "RUNNING"

    connects.patch(unique, {"spec": {"state": "stopped"}})
    connects.wait_condition(unique, "True", "Stopped")
    assert live_state(connect_http, unique) == "STOPPED"
    assert connects.status(unique)["phase"] == "Stopped"


def sink_spec(path: Path, topic: str, **extra: Any) -> dict[str, Any]:
    return {"class": "FileStreamSink", "config": {"file": str(path), "topics": topic}, **extra}


def test_failing_task_is_reported_and_restart_by_nonce_and_annotation_recovers_it(
    connects: Resources, connect_http: httpx.Client, tmp_path: Path, unique: str
) -> None:
    missing_dir = tmp_path / "not-yet"
    target = missing_dir / "out.txt"
    connects.create(unique, sink_spec(target, unique, autoRestart={"enabled": False}))
    ready = connects.wait_condition(unique, "False", "TasksFailed", timeout=90)
    assert "task 0 FAILED" in ready["message"]
    assert connects.condition(unique, "Stalled")["status"] == "True"
    assert connects.status(unique)["phase"] == "Failed"

    # Without a restart the task stays failed; a new nonce restarts it once the path exists.
    missing_dir.mkdir()
    connects.patch(unique, {"spec": {"restartNonce": "1"}})
    connects.wait_condition(unique, "True", "Running", timeout=60)
    assert connects.status(unique)["lastRestartNonce"] == "1"

    # Break it again, then restart through the annotation, which the operator removes once acted on.
    connects.patch(unique, {"spec": {"config": {"file": str(tmp_path / "gone" / "out.txt")}}})
    connects.wait_condition(unique, "False", "TasksFailed", timeout=90)
    (tmp_path / "gone").mkdir()
    connects.patch(unique, {"metadata": {"annotations": {"fibers.dev/restart": "true"}}})
    connects.wait_condition(unique, "True", "Running", timeout=60)
    wait_for(
        lambda: "fibers.dev/restart" not in (connects.get(unique)["metadata"].get("annotations") or {}),
        timeout=30,
        what="restart annotation removed",
    )


def test_auto_restart_backs_off_and_gives_up(connects: Resources, tmp_path: Path, unique: str) -> None:
    spec = sink_spec(
        tmp_path / "never" / "out.txt",
        unique,
        autoRestart={"enabled": True, "maxRestarts": 3, "backoffSeconds": 1, "maxBackoffSeconds": 60},
    )
    connects.create(unique, spec)
    seen: list[tuple[int, str]] = []

    def restarts() -> bool:
        auto = connects.status(unique).get("autoRestart") or {}
        entry = (auto.get("count", 0), auto.get("lastRestartTime", ""))
        if entry[0] and entry not in seen:
            seen.append(entry)
        return entry[0] >= 3

    wait_for(restarts, timeout=120, what="three automatic restarts", interval=0.25)
    cond = connects.wait_condition(unique, "True", "AutoRestartExhausted", type_="Stalled", timeout=60)
    assert "gave up after 3 automatic restarts" in cond["message"]
    assert [count for count, _ in seen] == [1, 2, 3]
    # backoffSeconds=1: the 2nd restart waits 2 s after the 1st, the 3rd 6 s after the 2nd
    # (timestamps have one-second precision, hence the margin of one).
    first, second, third = (parse_time(stamp) for _, stamp in seen)
    assert (second - first).total_seconds() >= 1
    assert (third - second).total_seconds() >= 5


def test_secret_values_reach_connect_but_not_status_events_or_logs(
    connects: Resources,
    connect_http: httpx.Client,
    kube: ApiClient,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    unique: str,
) -> None:
    secret_value = f"s3cr3t-{unique}"
    core = client.CoreV1Api(kube)
    core.create_namespaced_secret(
        namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=unique),
            data={"path": base64.b64encode(str(tmp_path / secret_value / "out.txt").encode()).decode()},
        ),
    )
    # The secret is the sink path under a missing directory: the task fails and its trace names the path.
    spec = {
        "class": "FileStreamSink",
        "config": {"topics": unique},
        "secretConfig": {"file": {"secretKeyRef": {"name": unique, "key": "path"}}},
        "autoRestart": {"enabled": False},
    }
    connects.create(unique, spec)
    cond = connects.wait_condition(unique, "False", "TasksFailed", timeout=90)
    assert secret_value in live_config(connect_http, unique)["file"]
    trace = connects.status(unique)["tasks"][0].get("trace", "")
    assert "***" in trace or "***" in cond["message"]
    assert secret_value not in json.dumps(connects.get(unique))
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={unique}").items
    assert events, "the operator posts events for the transitions"
    assert all(secret_value not in (e.message or "") for e in events)
    assert secret_value not in operator.log()


def test_missing_secret_is_reported_and_recovers_when_created(
    connects: Resources, kube: ApiClient, namespace: str, source_file: Path, unique: str
) -> None:
    spec = source_spec(source_file, unique)
    del spec["config"]["file"]
    spec["secretConfig"] = {"file": {"secretKeyRef": {"name": unique, "key": "file"}}}
    connects.create(unique, spec)
    cond = connects.wait_condition(unique, "False", "SecretNotFound")
    assert f"{namespace}/{unique}" in cond["message"]
    client.CoreV1Api(kube).create_namespaced_secret(
        namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name=unique), string_data={"file": str(source_file)}),
    )
    connects.wait_condition(unique, "True", "Running", timeout=60)


def test_delete_removes_owned_connector_and_never_a_foreign_one(
    connects: Resources, connect_http: httpx.Client, source_file: Path, operator: OperatorProcess, unique: str
) -> None:
    connects.create(unique, source_spec(source_file, unique))
    connects.wait_condition(unique, "True")
    wait_for(
        lambda: operator.metric("fibers_connector_state", name=unique, state="RUNNING") == [1],
        timeout=30,
        what="its state served",
    )
    connects.delete(unique)
    wait_for(lambda: not connects.exists(unique), timeout=60, what="resource gone")
    assert live_state(connect_http, unique) == "ABSENT"
    # Its series went with it: an alert on connector state never fires on a Connect that no longer exists.
    assert operator.metric("fibers_connector_state", name=unique) == []
    assert operator.metric("fibers_connector_running_tasks", name=unique) == []

    foreign = f"{unique}-foreign"
    config = {"connector.class": "FileStreamSource", "file": str(source_file), "topic": foreign}
    assert connect_http.put(f"/connectors/{foreign}/config", json=config).status_code == 201
    connects.create(unique + "-claim", {**source_spec(source_file, unique), "connectorName": foreign})
    cond = connects.wait_condition(unique + "-claim", "False", "ConnectorNotOwned")
    assert foreign in cond["message"]
    assert live_config(connect_http, foreign)["topic"] == foreign  # untouched
    connects.delete(unique + "-claim")
    wait_for(lambda: not connects.exists(unique + "-claim"), timeout=60, what="resource gone")
    assert live_state(connect_http, foreign) == "RUNNING"
    connect_http.delete(f"/connectors/{foreign}")


def test_a_sink_on_another_connect_cluster_of_the_same_kafka_never_joins_a_group_it_does_not_hold(
    kube: ApiClient,
    connects: Resources,
    connect_http: httpx.Client,
    namespace: str,
    stack_info: StackInfo,
    tmp_path: Path,
    unique: str,
) -> None:
    """Two ConnectClusters on one Kafka (here two declarations of the stack's Kafka Connect, whose probes
    both read the same Kafka cluster id): a sink Connect on the second naming the first one's sink connector
    would share its consumer group connect-<name>, read part of its records and, by a seek, move its
    offsets. It is not created, says which Connect holds the group, and its seek ends Failed."""
    other = f"{unique}-other"
    platform_resources.apply(kube, other, stack_info.connect_url)
    holder, intruder = unique, f"{unique}-b"
    try:
        connects.create(holder, {"class": "FileStreamSink", "config": {"file": str(tmp_path / "a"), "topics": unique}})
        connects.wait_condition(holder, "True", "Running", timeout=90)
        seek = {"nonce": "1", "startFrom": {"position": "earliest"}}
        sink = {"file": str(tmp_path / "b"), "topics": unique}
        spec = {"cluster": other, "connectorName": holder, "class": "FileStreamSink", "config": sink, "seek": seek}
        connects.create(intruder, spec)
        cond = connects.wait_condition(intruder, "False", "ConsumerGroupInUse", timeout=60)
        assert f"consumer group connect-{holder}" in cond["message"]
        assert f"Connect {holder} in namespace {namespace}" in cond["message"]
        status = connects.wait_status(intruder, lambda s: s.get("lastSeekNonce") == "1", what="seek ended")
        offsets = find(status["conditions"], "Offsets")
        assert offsets is not None and (offsets["status"], offsets["reason"]) == ("False", "SeekFailed")
        assert live_config(connect_http, holder)["file"] == str(tmp_path / "a")  # never rewritten
        assert live_state(connect_http, holder) == "RUNNING"
    finally:
        for name in (intruder, holder):
            connects.delete(name)
        wait_for(lambda: not connects.exists(holder), timeout=60, what="holder deleted")
        platform_resources.delete(kube, other)


def test_a_forged_claim_annotation_takes_over_no_connector(
    connects: Resources, connect_http: httpx.Client, source_file: Path, namespace: str, unique: str
) -> None:
    """The claim annotation is written by the resource's editor as easily as by the operator: a second
    Connect that names the first one's connector and copies its annotations must change nothing of it,
    say whose it is, and leave it running when it is deleted. Kafka Connect's record says who owns it."""
    connects.create(unique, source_spec(source_file, unique))
    connects.wait_condition(unique, "True", "Running")
    assert live_config(connect_http, unique)["fibers.owner"] == f"{namespace}/{unique}"
    forged = {k: v for k, v in connects.get(unique)["metadata"]["annotations"].items() if k.startswith("fibers.dev/")}
    intruder = f"{unique}-intruder"
    connects.create(intruder, {**source_spec(source_file, intruder), "connectorName": unique}, annotations=forged)
    cond = connects.wait_condition(intruder, "False", "ConnectorNotOwned")
    assert f"Connect {unique} in namespace {namespace}" in cond["message"]
    assert live_config(connect_http, unique)["topic"] == unique  # never rewritten
    connects.delete(intruder)
    wait_for(lambda: not connects.exists(intruder), timeout=60, what="the intruder gone")
    assert live_state(connect_http, unique) == "RUNNING"  # not deleted with it
    assert connects.condition(unique, "Ready")["status"] == "True"


def test_a_connect_whose_connect_cluster_was_deleted_is_released_with_a_warning(
    connects: Resources,
    kube: ApiClient,
    connect_http: httpx.Client,
    source_file: Path,
    unique: str,
    stack_info: StackInfo,
) -> None:
    """The ConnectCluster goes first (a platform team's clean-up, an uninstall): there is nowhere left to
    delete the connector from, so the Connect is released at once with a Warning naming the connector,
    instead of holding its namespace for ever."""
    cluster = f"gone-{unique}"
    platform_resources.apply(kube, cluster, stack_info.connect_url)
    try:
        connects.create(unique, {**source_spec(source_file, unique), "cluster": cluster})
        connects.wait_condition(unique, "True", "Running", timeout=60)
    finally:
        platform_resources.delete(kube, cluster)
    connects.wait_condition(unique, "False", "ClusterNotFound", timeout=30)  # the operator saw the cluster go
    connects.delete(unique)
    wait_for(lambda: not connects.exists(unique), timeout=30, what="the Connect released without its cluster")
    event = connects.wait_event(unique, "ConnectorLeft", timeout=10)
    assert event["type"] == "Warning"
    assert f"connector {unique}" in event["message"] and f"ConnectCluster {cluster}" in event["message"]
    # Its Kafka Connect is the stack's, which still runs it: the Warning said so, and the test cleans up.
    assert live_state(connect_http, unique) != "ABSENT"
    connect_http.delete(f"/connectors/{unique}")


def test_the_orphan_deletion_policy_releases_the_connect_and_leaves_its_connector(
    connects: Resources, connect_http: httpx.Client, source_file: Path, unique: str
) -> None:
    connects.create(unique, source_spec(source_file, unique))
    connects.wait_condition(unique, "True", "Running")
    connects.patch(unique, {"metadata": {"annotations": {ANNOTATION_DELETION_POLICY: "orphan"}}})
    connects.delete(unique)
    wait_for(lambda: not connects.exists(unique), timeout=30, what="the Connect released")
    event = connects.wait_event(unique, "ConnectorOrphaned", timeout=10)
    assert event["type"] == "Normal" and f"connector {unique}" in event["message"]
    time.sleep(2)  # a DELETE sent anyway would have landed by now
    assert live_state(connect_http, unique) == "RUNNING"
    connect_http.delete(f"/connectors/{unique}")


def test_connect_series_return_to_their_baseline_after_many_creates_and_deletes(
    connects: Resources, source_file: Path, operator: OperatorProcess, unique: str
) -> None:
    """Series follow their resources: 50 Connects made and deleted leave the operator serving what it did before
    (bench/connect_scale checks the same after 500)."""

    def connector_series() -> int:
        return len(operator.metric("fibers_connector_state")) + len(operator.metric("fibers_connector_running_tasks"))

    baseline = connector_series()
    names = [f"{unique}-{i}" for i in range(50)]
    for name in names:
        connects.create(name, source_spec(source_file, f"{unique}-churn"))
    wait_for(lambda: connector_series() >= baseline + 2 * len(names), timeout=300, what="a state per Connect served")
    for name in names:
        connects.delete(name)
    wait_for(lambda: not any(connects.exists(n) for n in names), timeout=300, what="the Connects deleted")
    assert connector_series() == baseline


def test_paused_reconciliation_leaves_drift_alone(
    connects: Resources, connect_http: httpx.Client, source_file: Path, unique: str
) -> None:
    connects.create(unique, source_spec(source_file, unique))
    connects.wait_condition(unique, "True")
    connects.patch(unique, {"metadata": {"annotations": {"fibers.dev/paused-reconciliation": "true"}}})
    connects.wait_condition(unique, "False", "ReconciliationPaused", type_="Reconciling")
    assert connect_http.put(f"/connectors/{unique}/pause").status_code == 202
    connects.wait_status(unique, lambda s: s.get("connectorState") == "PAUSED", what="pause observed")
    assert live_state(connect_http, unique) == "PAUSED"  # not resumed while reconciliation is paused
    connects.patch(unique, {"metadata": {"annotations": {"fibers.dev/paused-reconciliation": None}}})
    connects.wait_condition(unique, "True", "Running", timeout=30)
    assert live_state(connect_http, unique) == "RUNNING"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"class": "FileStreamSource", "tasksMax": 0}, "tasksMax"),
        ({"class": "FileStreamSource", "config": {"name": "x"}}, "must not set name"),
        (
            {"class": "FileStreamSource", "config": {"tasks.max": "2"}},
            "must not set name, connector.class or tasks.max",
        ),
        ({"class": "FileStreamSource", "state": "sleeping"}, "Unsupported value"),
        (  # another team's group: its records read here, its offsets moved by a seek
            {"class": "FileStreamSink", "config": {"topics": "t", "consumer.override.group.id": "connect-b-sink"}},
            "must not set consumer.override.group.id",
        ),
        ({"config": {"topic": "t"}}, "class"),
        ({"class": "X", "cluster": "http://kafka-connect:8083"}, "spec.cluster"),  # a ConnectCluster's name, not a URL
        (
            {
                "class": "X",
                "config": {"password": "a"},
                "secretConfig": {"password": {"secretKeyRef": {"name": "s", "key": "k"}}},
            },
            "not in both",
        ),
    ],
)
def test_invalid_specs_are_rejected_by_the_api_server(
    connects: Resources, spec: dict[str, Any], message: str, unique: str
) -> None:
    with pytest.raises(ApiException) as err:
        connects.create(unique, spec)
    assert err.value.status == 422
    assert message in err.value.body


def test_connector_name_cannot_change(connects: Resources, source_file: Path, unique: str) -> None:
    connects.create(unique, source_spec(source_file, unique))
    with pytest.raises(ApiException) as err:
        connects.patch(unique, {"spec": {"connectorName": "other"}})
    assert "connectorName cannot be changed" in err.value.body


def test_connect_down_is_reported_and_recovered(
    connects: Resources,
    connect_http: httpx.Client,
    source_file: Path,
    unique: str,
    stack_info: StackInfo,
    operator: OperatorProcess,
) -> None:
    """Also: a resource deleted while Connect is down stays until its connector could be deleted, and the
    outage is logged once, not at every poll of every resource."""
    doomed = f"{unique}-doomed"
    for name in (unique, doomed):
        connects.create(name, source_spec(source_file, name))
    for name in (unique, doomed):
        connects.wait_condition(name, "True")
    logged_before = operator.log().count("Kafka Connect unreachable")
    stack.stop_component("kafka-connect")
    try:
        cond = connects.wait_condition(unique, "False", "ConnectUnreachable", timeout=60)
        assert stack_info.connect_url in cond["message"]
        assert connects.status(unique)["phase"] == "Unknown"
        connects.delete(doomed)
        connects.wait_event(doomed, "DeleteFailed", timeout=60)
        assert connects.exists(doomed)  # held by the finalizer: deleting it now would orphan the connector
        time.sleep(5)  # ten more polls at this operator's 0.5 s
        # One line when the outage starts (another if its error changes), not one per poll and resource.
        assert 1 <= operator.log().count("Kafka Connect unreachable") - logged_before <= 2
    finally:
        stack.start_component(
            "kafka-connect", lambda: httpx.get(f"{stack_info.connect_url}/connectors", timeout=2).status_code == 200
        )
    connects.wait_condition(unique, "True", "Running", timeout=120)
    wait_for(lambda: not connects.exists(doomed), timeout=60, what="resource released once its connector is gone")
    assert live_state(connect_http, doomed) == "ABSENT"


class BusyHerder(ForwardingProxy):
    """The stack's Kafka Connect while its herder is busy starting thousands of tasks: a listing with
    configs (`expand=info`, one herder request per connector) is answered only after `HELD_SECONDS`, past
    the operator's call timeout (249-301 s in connect_scale at 5,000), where statuses come at once."""

    HELD_SECONDS = POLICY.call_timeout + 5

    def __init__(self, upstream: str) -> None:
        self.busy = False
        self.held = 0  # config listings asked while busy
        super().__init__(upstream)

    def intercept(self, method: str, path: str, headers: HTTPMessage) -> tuple[int, bytes] | None:
        if self.busy and method == "GET" and "expand=info" in path:
            self.held += 1
            time.sleep(self.HELD_SECONDS)
        return None  # forwarded, late


def test_a_connect_slow_to_list_configs_leaves_its_resources_ready_on_statuses(
    kube: ApiClient,
    connects: Resources,
    source_file: Path,
    stack_info: StackInfo,
    operator: OperatorProcess,
    unique: str,
) -> None:
    """A Kafka Connect that answers statuses but not configs in time is not unreachable: its resources keep
    their Ready (it had turned every one of 5,000 into ConnectUnreachable, asked again every 2 s), and the
    configs are asked again only after `ConnectPolicy.config_read_retry`, not at every sync."""
    herder = BusyHerder(stack_info.connect_url)
    cluster = f"{unique}-busy"
    platform_resources.apply(kube, cluster, herder.url)
    try:
        connects.create(unique, {**source_spec(source_file, unique), "cluster": cluster})
        connects.wait_condition(unique, "True", "Running", timeout=90)
        herder.busy = True
        seen: set[tuple[str, str]] = set()
        deadline = time.monotonic() + BusyHerder.HELD_SECONDS + 10  # a held listing, then more syncs
        while time.monotonic() < deadline:
            ready = connects.condition(unique)
            seen.add((ready.get("status", ""), ready.get("reason", "")))
            time.sleep(0.5)
        assert seen == {("True", "Running")}
        assert herder.held == 1  # this operator syncs every 2 s: configs were asked once, then statuses only
        assert "statuses only for now" in operator.log()
    finally:
        herder.busy = False
        connects.delete(unique)
        wait_for(lambda: not connects.exists(unique), timeout=60, what="the Connect deleted")
        platform_resources.delete(kube, cluster)
        herder.close()


def test_operator_killed_mid_reconcile_converges_to_one_connector_each(
    connects: Resources, connect_http: httpx.Client, operator: OperatorProcess, source_file: Path, unique: str
) -> None:
    names = [f"{unique}-{i}" for i in range(8)]
    for name in names:
        connects.create(name, source_spec(source_file, name))
    wait_for(lambda: any(connects.get(n)["metadata"].get("finalizers") for n in names), timeout=30, what="first claim")
    os.kill(operator.pid, signal.SIGKILL)
    operator.proc.wait()  # type: ignore[union-attr]
    operator.start()
    for name in names:
        connects.wait_condition(name, "True", "Running", timeout=90)
    live = set(connect_http.get("/connectors").json())
    assert {n for n in live if n.startswith(unique)} == set(names)


# ----- offsets (Kafka Connect's offsets API) ---------------------------------------------------------


def _offsets_done(connects: Resources, name: str, operation: str, after: str = "") -> dict[str, Any]:
    """Wait for the operation to end; it must have succeeded, and the annotation must be gone."""
    status = connects.wait_status(
        name,
        lambda s: (
            (last := (s.get("offsets") or {}).get("lastOperation") or {}).get("operation") == operation
            and last.get("time", "") > after
        ),
        what=f"offsets {operation} done",
        timeout=90,
    )
    last = status["offsets"]["lastOperation"]
    assert last["result"] == "Succeeded", last
    # The status is written first, then the annotation removed (so the request is never lost): a moment apart.
    wait_for(
        lambda: "fibers.dev/offsets" not in (connects.get(name)["metadata"].get("annotations") or {}),
        timeout=30,
        what=f"the offsets annotation removed after {operation}",
    )
    return dict(status["offsets"])


def test_offsets_list_reset_and_alter(
    connects: Resources, kube: ApiClient, namespace: str, stack_info: StackInfo, source_file: Path, unique: str
) -> None:
    connects.create(unique, source_spec(source_file, unique))
    connects.wait_condition(unique, "True", "Running")
    read_topic(stack_info.kafka_bootstrap, unique, 3)
    time.sleep(3)  # the worker commits source offsets every second (offset.flush.interval.ms)

    connects.patch(unique, {"metadata": {"annotations": {"fibers.dev/offsets": "list"}}})
    listed = _offsets_done(connects, unique, "list")
    assert listed["configMap"] == f"{unique}-offsets" and listed["listedAt"]
    core = client.CoreV1Api(kube)
    cm = core.read_namespaced_config_map(listed["configMap"], namespace)
    entries = json.loads(cm.data["offsets.json"])["offsets"]
    assert entries == [
        {"partition": {"filename": str(source_file)}, "offset": {"position": source_file.stat().st_size}}
    ]
    assert cm.metadata.owner_references[0].name == unique  # deleted with the resource

    # Reset: the connector is stopped, forgets its position, and reads the file again from the start.
    connects.patch(unique, {"metadata": {"annotations": {"fibers.dev/offsets": "reset"}}})
    reset = _offsets_done(connects, unique, "reset", listed["lastOperation"]["time"])
    connects.wait_condition(unique, "True", "Running", timeout=60)
    again = [json.loads(v) for v in read_topic(stack_info.kafka_bootstrap, unique, 6)]
    assert again == [f"record {i}" for i in range(3)] * 2
    assert connects.condition(unique, "Offsets")["reason"] == "Reset"

    # Alter, from the listed ConfigMap edited: back to the start of the last line, which is read again.
    time.sleep(3)
    line = len("record 0\n")
    entries[0]["offset"]["position"] = 2 * line
    cm.data["offsets.json"] = json.dumps({"offsets": entries})
    core.replace_namespaced_config_map(cm.metadata.name, namespace, cm)
    connects.patch(unique, {"metadata": {"annotations": {"fibers.dev/offsets": "alter"}}})
    _offsets_done(connects, unique, "alter", reset["lastOperation"]["time"])
    connects.wait_condition(unique, "True", "Running", timeout=60)
    values = [json.loads(v) for v in read_topic(stack_info.kafka_bootstrap, unique, 7)]
    assert values[6] == "record 2"


def test_offsets_alter_with_bad_input_fails_before_the_connector_is_touched(
    connects: Resources, connect_http: httpx.Client, source_file: Path, unique: str
) -> None:
    connects.create(unique, source_spec(source_file, unique))
    connects.wait_condition(unique, "True", "Running")
    annotations = {"fibers.dev/offsets": "alter", "fibers.dev/offsets-from": "nowhere"}
    connects.patch(unique, {"metadata": {"annotations": annotations}})
    status = connects.wait_status(
        unique, lambda s: (s.get("offsets") or {}).get("lastOperation"), what="alter ended", timeout=60
    )
    assert status["offsets"]["lastOperation"]["result"] == "Failed"
    cond = connects.condition(unique, "Offsets")
    assert (cond["status"], cond["reason"]) == ("False", "AlterFailed")
    assert f"ConfigMap {connects.namespace}/nowhere not found" in cond["message"]
    assert live_state(connect_http, unique) == "RUNNING"  # never stopped
    assert connects.condition(unique)["status"] == "True"
    meta = connects.get(unique)["metadata"].get("annotations") or {}
    assert "fibers.dev/offsets" not in meta and "fibers.dev/offsets-from" not in meta

    connects.patch(unique, {"metadata": {"annotations": {"fibers.dev/offsets": "rewind"}}})
    cond = connects.wait_status(
        unique,
        lambda s: (c := find(s.get("conditions"), "Offsets")) and c["reason"] == "InvalidRequest" and c,
        what="bad annotation reported",
        timeout=30,
    )
    assert "is not one of list, reset, alter" in str(cond)


def test_a_sink_starts_from_a_time_or_the_end_when_created_and_seeks_back_when_told(
    connects: Resources, stack_info: StackInfo, tmp_path: Path, unique: str
) -> None:
    """Records on both sides of T: a sink created with startFrom T delivers the six since T, one created
    with startFrom latest none of them; then a seek to earliest delivers all of them again."""
    from fibers.startfrom import format_time

    t = produce_around(stack_info.kafka_bootstrap, unique)
    os.chmod(tmp_path, 0o755)
    since, latest = tmp_path / "since.txt", tmp_path / "latest.txt"

    def lines(path: Path) -> list[str]:
        return path.read_text().splitlines() if path.exists() else []

    for name, path, start in (
        (f"{unique}-t", since, {"timestamp": format_time(t)}),
        (f"{unique}-l", latest, {"position": "latest"}),
    ):
        connects.create(
            name, {"class": "FileStreamSink", "config": {"file": str(path), "topics": unique}, "startFrom": start}
        )
    for name in (f"{unique}-t", f"{unique}-l"):
        connects.wait_condition(name, "True", "Running", timeout=90)
        cond = connects.condition(name, "Offsets")
        assert cond["reason"] == "Repositioned", cond
        assert "fibers.dev/offsets" not in (connects.get(name)["metadata"].get("annotations") or {})
    wait_for(lambda: len(lines(since)) == 6, timeout=60, what="the six records since T")
    assert lines(since) == [f"{{id={i}}}" for i in range(4, 10)]
    produce(stack_info.kafka_bootstrap, unique, [{"id": 10}])
    wait_for(lambda: len(lines(latest)) == 1 and len(lines(since)) == 7, timeout=60, what="the record after")
    assert lines(latest) == ["{id=10}"]  # nothing from before it was created

    connects.patch(f"{unique}-l", {"spec": {"seek": {"nonce": "again", "startFrom": {"position": "earliest"}}}})
    wait_for(lambda: len(lines(latest)) == 12, timeout=90, what="everything delivered again")
    status = connects.status(f"{unique}-l")
    assert (status["lastSeekNonce"], status["offsets"]["lastOperation"]["records"]) == ("again", 11)


def test_a_debezium_source_told_to_seek_sends_its_table_again_as_an_incremental_snapshot(
    kube: ApiClient, namespace: str, connects: Resources, stack_info: StackInfo, unique: str
) -> None:
    """A source has no position in time: its seek asks Debezium, through its Kafka signal channel, for an
    incremental snapshot of the table, and every row comes again as it is now; the connector keeps running."""
    from confluent_kafka.admin import AdminClient, NewTopic

    table, prefix = f"snap_{unique.replace('-', '_')}", f"snap{unique.replace('-', '')}"
    with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
        pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int)")
        pg.execute(f"INSERT INTO {table} SELECT g, g FROM generate_series(1, 5) g")
        pg.execute(f"CREATE TABLE {table}_signal (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data text)")
    signals = f"{prefix}-signals"
    admin = AdminClient({"bootstrap.servers": stack_info.kafka_bootstrap})
    admin.create_topics([NewTopic(signals, 1, 1)])[signals].result(30)
    config = {
        "table.include.list": f"public.{table},public.{table}_signal",
        "signal.enabled.channels": "source,kafka",
        "signal.kafka.topic": signals,
        "signal.kafka.bootstrap.servers": stack_info.kafka_bootstrap,
        "signal.data.collection": f"public.{table}_signal",
    }
    with debezium_connect(kube, namespace, stack_info, name=unique, table=table, prefix=prefix, config=config) as topic:
        assert len(read_topic(stack_info.kafka_bootstrap, topic, 5)) == 5  # the initial snapshot
        connects.patch(unique, {"spec": {"seek": {"nonce": "1", "startFrom": {"position": "earliest"}}}})
        status = connects.wait_status(unique, lambda s: s.get("lastSeekNonce") == "1", what="the seek")
        cond = find(status["conditions"], "Offsets")
        assert cond is not None and (cond["status"], cond["reason"]) == ("True", "SnapshotRequested"), cond
        assert f"an incremental snapshot of public.{table} was asked" in cond["message"]
        rows = [json.loads(v) for v in read_topic(stack_info.kafka_bootstrap, topic, 10, timeout=90)]
        again = sorted(r["after"]["id"] for r in rows[5:] if r["op"] == "r")
        assert again == [1, 2, 3, 4, 5]
        assert connects.status(unique)["connectorState"] == "RUNNING"


def test_a_rotated_database_password_reaches_the_running_connector(
    kube: ApiClient, namespace: str, connects: Resources, stack_info: StackInfo, unique: str
) -> None:
    """PostgreSQL's password for the connector's role changes, its Secret with it, and the old connections
    are cut. The operator sees the Secret change (a watch of Secrets' metadata), writes the connector's
    config again, and Debezium goes on streaming with the new password; an Event names the Secret. Without
    that the task could not reconnect: PostgreSQL refuses the old password."""
    role, table = f"rot_{unique.replace('-', '_')}", f"rot_{unique.replace('-', '_')}_t"
    prefix, checked = f"rot{unique.replace('-', '')}", stack_info.postgres_role_checked
    with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
        pg.execute(f"DO $$ BEGIN CREATE ROLE {checked} NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        pg.execute(f"CREATE ROLE {role} LOGIN SUPERUSER PASSWORD 'first-pw' IN ROLE {checked}")
        pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
        pg.execute(f"INSERT INTO {table} VALUES (1), (2), (3)")
    core = client.CoreV1Api(kube)
    secret = client.V1Secret(metadata=client.V1ObjectMeta(name=unique), string_data={"password": "first-pw"})
    core.create_namespaced_secret(namespace, secret)
    spec = debezium_spec(stack_info.postgres_dsn, table=table, prefix=prefix, config={"database.user": role})
    del spec["config"]["database.password"]
    spec["secretConfig"] = {"database.password": {"secretKeyRef": {"name": unique, "key": "password"}}}
    connects.create(unique, spec)
    topic = f"{prefix}.public.{table}"
    try:
        connects.wait_condition(unique, "True", "Running", timeout=120)
        assert len(read_topic(stack_info.kafka_bootstrap, topic, 3)) == 3
        with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
            pg.execute(f"ALTER ROLE {role} PASSWORD 'second-pw'")
            core.patch_namespaced_secret(unique, namespace, {"stringData": {"password": "second-pw"}})
            connects.wait_event(unique, "SecretChanged", timeout=30)
            pg.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
            pg.execute(f"INSERT INTO {table} VALUES (4), (5)")

        # Rewriting the config restarts the task: a snapshot whose offsets were not yet flushed is sent
        # again (Debezium is at-least-once), so the rows are compared as a set, none missing.
        def streamed() -> set[int] | None:
            ids = {json.loads(v)["after"]["id"] for v in read_all(stack_info.kafka_bootstrap, topic)}
            return ids if ids >= {4, 5} else None

        assert wait_for(streamed, timeout=90, what="rows 4 and 5 streamed with the new password") == {1, 2, 3, 4, 5}
        connects.wait_condition(unique, "True", "Running", timeout=60)
        event = connects.wait_event(unique, "SecretChanged")
        assert f"Secret {unique} changed" in event["message"] and "second-pw" not in json.dumps(event)
    finally:
        connects.delete(unique)
        wait_for(lambda: not connects.exists(unique), timeout=60, what="connector deleted")
        drop_slot(stack_info.postgres_dsn, prefix)


def test_a_replay_whose_step_cannot_seek_stops_there_and_says_what_moved_and_what_did_not(
    kube: ApiClient, connects: Resources, connect_http: httpx.Client, source_file: Path, tmp_path: Path, unique: str
) -> None:
    """Two sink connectors replayed in order, the second reading topics that match nothing (no position
    can be looked up) and a source connector told to seek by hand: the Replay fails at the second step,
    names the first as repositioned and the third as untouched, and every connector runs where it was
    (never STOPPED, never at an unknown position)."""
    replays = Resources(kube, "replays", connects.namespace)
    connects.create(f"{unique}-src", source_spec(source_file, unique))
    sinks = {
        f"{unique}-a": {"topics": unique},
        f"{unique}-b": {"topics.regex": f"{unique}-none-.*"},
        f"{unique}-c": {"topics": unique},
    }
    for name, topics in sinks.items():
        connects.create(name, {"class": "FileStreamSink", "config": {"file": str(tmp_path / name), **topics}})
    for name in [f"{unique}-src", *sinks]:
        connects.wait_condition(name, "True", "Running", timeout=90)
    replays.create(
        unique,
        {"resources": [{"kind": "Connect", "name": n} for n in sinks], "startFrom": {"position": "earliest"}},
    )
    cond = replays.wait_condition(unique, "False", "ReplayFailed", timeout=120)
    assert f"Connect/{unique}-b: SeekFailed: no topic matches" in cond["message"]
    assert f"repositioned: Connect/{unique}-a; untouched: Connect/{unique}-c" in cond["message"]
    states = [s["state"] for s in replays.status(unique)["steps"]]
    assert states == ["Repositioned", "Failed", "Waiting"]
    assert "seek" not in connects.get(f"{unique}-c")["spec"]
    for name in sinks:
        connects.wait_condition(name, "True", "Running", timeout=60)
        assert live_state(connect_http, name) == "RUNNING"

    # A source connector has no position in time: its seek is refused before it is stopped.
    connects.patch(f"{unique}-src", {"spec": {"seek": {"nonce": "1", "startFrom": {"position": "earliest"}}}})
    status = connects.wait_status(f"{unique}-src", lambda s: s.get("lastSeekNonce") == "1", what="seek ended")
    cond = find(status["conditions"], "Offsets")
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "SeekFailed")
    assert "a source connector has no position in time" in cond["message"]
    assert live_state(connect_http, f"{unique}-src") == "RUNNING"


def test_offsets_list_never_overwrites_a_configmap_it_did_not_write(
    connects: Resources, kube: ApiClient, namespace: str, source_file: Path, unique: str
) -> None:
    """`<name>-offsets` may already be someone's ConfigMap: replacing it (and giving it our owner
    reference, so it went with the Connect) lost it. The list fails, naming it, and leaves it as it was."""
    core = client.CoreV1Api(kube)
    meta = client.V1ObjectMeta(name=f"{unique}-offsets")
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=meta, data={"mine": "yes"}))
    connects.create(unique, source_spec(source_file, unique))
    connects.wait_condition(unique, "True", "Running")
    connects.patch(unique, {"metadata": {"annotations": {"fibers.dev/offsets": "list"}}})
    status = connects.wait_status(
        unique, lambda s: (s.get("offsets") or {}).get("lastOperation"), what="list ended", timeout=60
    )
    last = status["offsets"]["lastOperation"]
    assert last["result"] == "Failed" and f"ConfigMap {namespace}/{unique}-offsets exists" in last["message"]
    kept = core.read_namespaced_config_map(f"{unique}-offsets", namespace)
    assert kept.data == {"mine": "yes"} and not kept.metadata.owner_references


def test_on_create_reset_starts_a_recreated_debezium_connector_afresh(
    connects: Resources, stack_info: StackInfo, unique: str
) -> None:
    """A connector of the same name ran before and its replication slot was dropped since: resuming from the
    offsets Connect kept fails (the position is gone); onCreate: reset starts from a new snapshot."""
    table, slot = f"{unique}_orders", unique
    with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
        pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, qty int)")
        pg.execute(f"INSERT INTO {table} VALUES (1, 1), (2, 2)")

    def spec(on_create: str) -> dict[str, Any]:
        return debezium_spec(
            stack_info.postgres_dsn,
            table=table,
            prefix=slot,
            offsets={"onCreate": on_create},
            autoRestart={"enabled": False},
        )

    def recreate(on_create: str) -> None:
        connects.delete(unique)
        wait_for(lambda: not connects.exists(unique), timeout=60, what="connector deleted")
        with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
            query = f"SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'"
            wait_for(lambda: not any(a for (a,) in pg.execute(query)), timeout=60, what="slot released")
            if pg.execute(query).fetchall():
                pg.execute(f"SELECT pg_drop_replication_slot('{slot}')")
        connects.create(unique, spec(on_create))

    connects.create(unique, spec("resume"))
    connects.wait_condition(unique, "True", "Running", timeout=120)
    read_topic(stack_info.kafka_bootstrap, f"{slot}.public.{table}", 2)
    with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
        pg.execute(f"INSERT INTO {table} VALUES (3, 3)")
    read_topic(stack_info.kafka_bootstrap, f"{unique}.public.{table}", 3)
    time.sleep(3)  # the position of the streamed change is committed

    recreate("resume")  # Connect's behaviour: the old offsets point into the dropped slot
    cond = connects.wait_condition(unique, "False", "TasksFailed", timeout=120)
    assert "Reconfigure the connector to use a snapshot mode" in cond["message"]

    recreate("reset")
    connects.wait_condition(unique, "True", "Running", timeout=120)
    status = connects.status(unique)
    assert status["offsets"]["lastOperation"]["operation"] == "reset"
    assert status["offsets"]["lastOperation"]["result"] == "Succeeded"
    assert "fibers.dev/offsets" not in (connects.get(unique)["metadata"].get("annotations") or {})
    with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
        pg.execute(f"INSERT INTO {table} VALUES (4, 4)")
    # A new snapshot (3 rows) after the first run's 3 records, then the new change: streaming works.
    values = read_topic(stack_info.kafka_bootstrap, f"{unique}.public.{table}", 7, timeout=90)
    assert [json.loads(v)["after"] for v in values[3:]] == [{"id": i, "qty": i} for i in range(1, 5)]
    time.sleep(5)
    assert connects.condition(unique)["status"] == "True"
    connects.delete(unique)


# ----- ConnectClusters -------------------------------------------------------------------------------------


def _cluster_status(kube: ApiClient, name: str, probe: Any, what: str) -> dict[str, Any]:
    custom = client.CustomObjectsApi(kube)
    return wait_for(
        lambda: (
            probe(
                st := custom.get_cluster_custom_object("fibers.dev", "v1beta1", "connectclusters", name).get("status")
                or {}
            )
            and st
        ),
        timeout=60,
        what=what,
    )


def test_connect_cluster_reports_version_plugins_and_workers(
    connects: Resources,
    kube: ApiClient,
    connect_cluster: str,
    connect_http: httpx.Client,
    source_file: Path,
    unique: str,
    stack_info: StackInfo,
) -> None:
    connects.create(unique, source_spec(source_file, unique))
    connects.wait_condition(unique, "True", "Running")
    assert connects.status(unique)["cluster"] == connect_cluster  # no spec.cluster: the operator's default
    worker = connects.status(unique)["workerId"]
    status = _cluster_status(
        kube, connect_cluster, lambda s: worker in (s.get("workers") or []), "the worker seen in the cluster status"
    )
    assert find(status["conditions"], "Ready")["status"] == "True"
    assert status["version"] == connect_http.get("/").json()["version"]
    plugins = {p["class"]: p for p in status["plugins"]}
    assert plugins["org.apache.kafka.connect.file.FileStreamSourceConnector"]["type"] == "source"
    assert plugins["org.apache.kafka.connect.file.FileStreamSinkConnector"]["type"] == "sink"
    debezium = plugins["io.debezium.connector.postgresql.PostgresConnector"]
    assert debezium["type"] == "source" and debezium["version"].startswith("3.3.2")
    assert status["pluginCount"] == len(status["plugins"])
    assert status["connectors"] >= 1

    kubectl = stack.fetch.kubernetes() / "kubectl"
    env = {**os.environ, **stack_info.env()}
    table = subprocess.run(
        [kubectl, "get", "connectclusters", connect_cluster, "-o", "wide"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    header, row = table.splitlines()[:2]
    assert header.split() == [
        "NAME",
        "URL",
        "DEFAULT",
        "READY",
        "VERSION",
        "PLUGINS",
        "WORKERS",
        "CONNECTORS",
        "REASON",
        "AGE",
    ]
    assert row.split()[:6] == [
        connect_cluster,
        stack_info.connect_url,
        "false",
        "True",
        status["version"],
        str(len(plugins)),
    ]


def test_connect_cluster_is_found_then_allows_the_namespace_by_its_labels(
    connects: Resources,
    kube: ApiClient,
    connect_http: httpx.Client,
    source_file: Path,
    unique: str,
    stack_info: StackInfo,
) -> None:
    """A Connect names a ConnectCluster that does not exist yet, then one that does not allow its namespace:
    nothing is created on Kafka Connect until the namespace gets the label the cluster selects."""
    cluster, label = f"only-{unique}", f"fibers.dev/test-{unique}"
    connects.create(unique, {**source_spec(source_file, unique), "cluster": cluster})
    cond = connects.wait_condition(unique, "False", "ClusterNotFound")
    assert connects.condition(unique, "Reconciling")["status"] == "True"  # waiting for it, not given up
    core = client.CoreV1Api(kube)
    try:
        platform_resources.apply(
            kube, cluster, stack_info.connect_url, namespaceSelector={"matchLabels": {label: "yes"}}
        )
        cond = connects.wait_condition(unique, "False", "ClusterNotAllowed")
        assert f"does not allow namespace {connects.namespace}" in cond["message"]
        assert connects.condition(unique, "Stalled")["status"] == "True"
        assert connects.condition(unique, "Reconciling")["status"] == "False"
        time.sleep(3)
        assert live_state(connect_http, unique) == "ABSENT"  # nothing was created
        core.patch_namespace(connects.namespace, {"metadata": {"labels": {label: "yes"}}})
        connects.wait_condition(unique, "True", "Running", timeout=60)
        assert connects.status(unique)["cluster"] == cluster
        assert connects.get(unique)["metadata"]["annotations"]["fibers.dev/connect-cluster"] == cluster
        connects.delete(unique)
        wait_for(lambda: not connects.exists(unique), timeout=60, what="resource deleted with its connector")
        assert live_state(connect_http, unique) == "ABSENT"
    finally:
        core.patch_namespace(connects.namespace, {"metadata": {"labels": {label: None}}})
        platform_resources.delete(kube, cluster)


# ----- validation before apply ----------------------------------------------------------------------------


def test_invalid_config_is_reported_per_field_and_nothing_is_created(
    connects: Resources, connect_http: httpx.Client, source_file: Path, unique: str
) -> None:
    connects.create(unique, {"class": "FileStreamSource", "config": {"file": str(source_file), "batch.size": "many"}})
    cond = connects.wait_condition(unique, "False", "InvalidConfig")
    assert "spec.config.topic: " in cond["message"]  # required, missing
    assert "spec.config.batch.size: " in cond["message"]  # not a number
    assert connects.condition(unique, "Stalled")["status"] == "True"  # given up until the spec changes
    assert live_state(connect_http, unique) == "ABSENT"

    connects.patch(unique, {"spec": {"config": {"topic": unique, "batch.size": 10}}})
    connects.wait_condition(unique, "True", "Running")

    # A bad update is refused too: the running connector keeps its config.
    connects.patch(unique, {"spec": {"config": {"batch.size": "lots"}}})
    cond = connects.wait_condition(unique, "False", "InvalidConfig")
    assert "spec.config.batch.size: " in cond["message"] and "topic" not in cond["message"]
    assert live_config(connect_http, unique)["batch.size"] == "10"
    assert live_state(connect_http, unique) == "RUNNING"


def test_unknown_class_says_which_plugins_the_cluster_has(
    connects: Resources, connect_http: httpx.Client, unique: str
) -> None:
    connects.create(unique, {"class": "com.example.NoSuchConnector", "config": {"topic": unique}})
    cond = connects.wait_condition(unique, "False", "InvalidConfig")
    assert cond["message"].startswith("spec.class: com.example.NoSuchConnector is not installed on ConnectCluster ")
    assert "org.apache.kafka.connect.file.FileStreamSourceConnector" in cond["message"]
    assert "io.debezium.connector.postgresql.PostgresConnector" in cond["message"]
    assert live_state(connect_http, unique) == "ABSENT"


def test_connect_cluster_over_tls_trusts_the_ca_it_is_given(
    connects: Resources, kube: ApiClient, source_file: Path, unique: str, stack_info: StackInfo
) -> None:
    """The same worker's https listener, whose certificate a CA of its own signed: refused until the
    ConnectCluster names that CA (a Secret), then a Connect runs through it."""
    cluster = f"tls-{unique}"
    core = client.CoreV1Api(kube)
    ca = Path(stack_info.connect_tls_ca).read_text()
    secret = client.V1Secret(metadata=client.V1ObjectMeta(name=f"{unique}-ca"), string_data={"ca.crt": ca})
    core.create_namespaced_secret(connects.namespace, secret)
    try:
        platform_resources.apply(kube, cluster, stack_info.connect_tls_url)
        status = _cluster_status(
            kube,
            cluster,
            lambda s: (find(s.get("conditions"), "Ready") or {}).get("reason") == "Unreachable",
            "refused",
        )
        assert "CERTIFICATE_VERIFY_FAILED" in find(status["conditions"], "Ready")["message"]

        ref = {"namespace": connects.namespace, "name": f"{unique}-ca"}
        platform_resources.apply(kube, cluster, stack_info.connect_tls_url, tls={"caSecretRef": ref})
        status = _cluster_status(
            kube, cluster, lambda s: (find(s.get("conditions"), "Ready") or {}).get("status") == "True", "trusted"
        )
        assert status["pluginCount"] > 0 and status["url"] == stack_info.connect_tls_url
        connects.create(unique, {**source_spec(source_file, unique), "cluster": cluster})
        connects.wait_condition(unique, "True", "Running")
        connects.delete(unique)
        wait_for(lambda: not connects.exists(unique), timeout=60, what="connector deleted over TLS")
    finally:
        platform_resources.delete(kube, cluster)
