"""Connect resources against the real kube-apiserver and the real Kafka Connect worker."""

from __future__ import annotations

import base64
import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

import fibers_stack as stack
from fibers.api import ANNOTATION_OWNED_CONNECTOR, CONNECT_FINALIZER
from fibers.conditions import parse_time
from fibers_stack import StackInfo
from tests.helpers import Resources, read_topic, wait_for
from tests.integration.conftest import OperatorProcess

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
    connects: Resources, connect_http: httpx.Client, source_file: Path, unique: str
) -> None:
    connects.create(unique, source_spec(source_file, unique))
    connects.wait_condition(unique, "True")
    connects.delete(unique)
    wait_for(lambda: not connects.exists(unique), timeout=60, what="resource gone")
    assert live_state(connect_http, unique) == "ABSENT"

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
        ({"config": {"topic": "t"}}, "class"),
        ({"class": "X", "cluster": "kafka-connect:8083"}, "spec.cluster"),
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
    connects: Resources, connect_http: httpx.Client, source_file: Path, unique: str, stack_info: StackInfo
) -> None:
    """Also: a resource deleted while Connect is down stays until its connector could be deleted."""
    doomed = f"{unique}-doomed"
    for name in (unique, doomed):
        connects.create(name, source_spec(source_file, name))
    for name in (unique, doomed):
        connects.wait_condition(name, "True")
    stack.stop_component("kafka-connect")
    try:
        cond = connects.wait_condition(unique, "False", "ConnectUnreachable", timeout=60)
        assert stack_info.connect_url in cond["message"]
        assert connects.status(unique)["phase"] == "Unknown"
        connects.delete(doomed)
        connects.wait_event(doomed, "DeleteFailed", timeout=60)
        assert connects.exists(doomed)  # held by the finalizer: deleting it now would orphan the connector
    finally:
        stack.start_component(
            "kafka-connect", lambda: httpx.get(f"{stack_info.connect_url}/connectors", timeout=2).status_code == 200
        )
    connects.wait_condition(unique, "True", "Running", timeout=120)
    wait_for(lambda: not connects.exists(doomed), timeout=60, what="resource released once its connector is gone")
    assert live_state(connect_http, doomed) == "ABSENT"


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
