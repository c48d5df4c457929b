"""Transform resources on the real stack: kube-apiserver, Kafka, Connect, local Spark.

SparkApplications are run by the stack's local executor (the stand-in for the Spark Operator's
controller), which runs the very job module a driver pod runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiClient

from fibers.stack import StackInfo
from tests.helpers import Resources, produce, read_topic, wait_for
from tests.integration.conftest import OperatorProcess

pytestmark = pytest.mark.transform

SPARK_APPS = ("sparkoperator.k8s.io", "v1beta2", "sparkapplications")


@pytest.fixture(scope="module")
def transforms(kube: ApiClient, namespace: str, operator: OperatorProcess) -> Resources:
    return Resources(kube, "transforms", namespace)


def spark_apps(kube: ApiClient, namespace: str, transform: str) -> list[dict[str, Any]]:
    items = client.CustomObjectsApi(kube).list_namespaced_custom_object(
        *SPARK_APPS[:2], namespace, SPARK_APPS[2], label_selector=f"fibers.dev/transform={transform}"
    )["items"]
    return sorted(items, key=lambda a: a["metadata"]["creationTimestamp"])


def orders(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"id": i, "customer": f"c{i % 3}", "amount": float(i)} for i in range(start, start + n)]


def test_batch_topic_to_topic_with_sql_and_stream_back(
    transforms: Resources, kube: ApiClient, namespace: str, stack_info: StackInfo, unique: str
) -> None:
    produce(stack_info.kafka_bootstrap, f"{unique}-orders", orders(9), key="id")
    transforms.create(
        unique,
        {
            "inputs": [
                {
                    "name": "orders",
                    "kafka": {"topics": [f"{unique}-orders"], "schema": "id INT, customer STRING, amount DOUBLE"},
                }
            ],
            "sql": "SELECT customer, count(*) AS n, sum(amount) AS total FROM orders GROUP BY customer",
            "output": {"kafka": {"topic": f"{unique}-totals", "keyColumn": "customer"}},
            "streamBack": {"topic": f"{unique}-report"},
        },
    )
    transforms.wait_condition(unique, "True", "Succeeded", timeout=180)
    status = transforms.status(unique)
    assert status["phase"] == "Succeeded"
    run = status["currentRun"]
    assert run["applicationState"] == "COMPLETED"
    assert run["recordsOut"] == 3 and run["streamedBack"] == 3
    assert run["driverPod"] == f"{run['name']}-driver"
    totals = {
        r["customer"]: (r["n"], r["total"])
        for r in map(json.loads, read_topic(stack_info.kafka_bootstrap, f"{unique}-totals", 3))
    }
    assert totals == {"c0": (3, 9.0), "c1": (3, 12.0), "c2": (3, 15.0)}
    assert len(read_topic(stack_info.kafka_bootstrap, f"{unique}-report", 3)) == 3
    [app] = spark_apps(kube, namespace, unique)
    owner = app["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("Transform", unique, True)
    assert app["metadata"]["name"] == run["name"]


def test_bad_sql_fails_with_sparks_message(transforms: Resources, tmp_path: Path, unique: str) -> None:
    (tmp_path / "in.json").write_text('{"id": 1}\n')
    os.chmod(tmp_path, 0o755)
    transforms.create(
        unique,
        {
            "inputs": [{"name": "things", "files": {"path": str(tmp_path / "in.json"), "format": "json"}}],
            "sql": "SELECT * FROM no_such_view",
            "output": {"files": {"path": str(tmp_path / "out"), "format": "json"}},
        },
    )
    cond = transforms.wait_condition(unique, "False", "RunFailed", timeout=180)
    assert "TABLE_OR_VIEW_NOT_FOUND" in cond["message"]
    assert transforms.condition(unique, "Stalled")["status"] == "True"
    assert transforms.status(unique)["phase"] == "Failed"


def test_rerun_nonce_starts_a_new_run_and_delete_removes_runs(
    transforms: Resources, kube: ApiClient, namespace: str, tmp_path: Path, unique: str
) -> None:
    (tmp_path / "in.json").write_text("".join(json.dumps(o) + "\n" for o in orders(4)))
    os.chmod(tmp_path, 0o755)
    transforms.create(
        unique,
        {
            "inputs": [{"name": "orders", "files": {"path": str(tmp_path / "in.json"), "format": "json"}}],
            "sql": "SELECT count(*) AS n FROM orders",
            "output": {"files": {"path": str(tmp_path / "out"), "format": "json"}},
        },
    )
    transforms.wait_condition(unique, "True", "Succeeded", timeout=180)
    first = transforms.status(unique)["currentRun"]["name"]
    (tmp_path / "in2.json").write_text("".join(json.dumps(o) + "\n" for o in orders(3, start=10)))
    transforms.patch(
        unique,
        {
            "spec": {
                "rerunNonce": "again",
                "inputs": [{"name": "orders", "files": {"path": str(tmp_path), "format": "json"}}],
            }
        },
    )
    status = transforms.wait_status(
        unique,
        lambda s: (s.get("currentRun") or {}).get("name") not in (None, first) and s.get("phase") == "Succeeded",
        timeout=180,
        what="second run succeeded",
    )
    assert status["currentRun"]["trigger"] == "rerun"
    assert status["lastRerunNonce"] == "again"
    rows = [json.loads(line) for f in (tmp_path / "out").glob("part-*") for line in f.read_text().splitlines()]
    assert rows == [{"n": 7}]
    assert len(spark_apps(kube, namespace, unique)) == 2

    transforms.delete(unique)
    wait_for(lambda: not spark_apps(kube, namespace, unique), timeout=60, what="runs garbage-collected")


def test_input_from_a_connect_resource(
    transforms: Resources, kube: ApiClient, namespace: str, tmp_path: Path, unique: str
) -> None:
    source = tmp_path / "lines.txt"
    source.write_text("".join(f"line {i}\n" for i in range(6)))
    os.chmod(tmp_path, 0o755)
    connects = Resources(kube, "connects", namespace)
    connects.create(f"{unique}-src", {"class": "FileStreamSource", "config": {"file": str(source), "topic": unique}})
    connects.wait_status(f"{unique}-src", lambda s: s.get("topics") == [unique], timeout=90, what="topics reported")
    transforms.create(
        unique,
        {
            "inputs": [{"name": "lines", "connectRef": {"name": f"{unique}-src"}}],
            "sql": "SELECT count(*) AS n FROM lines",
            "output": {"files": {"path": str(tmp_path / "out"), "format": "json"}},
        },
    )
    transforms.wait_condition(unique, "True", "Succeeded", timeout=180)
    assert transforms.status(unique)["currentRun"]["recordsOut"] == 1
    rows = [json.loads(line) for f in (tmp_path / "out").glob("part-*") for line in f.read_text().splitlines()]
    assert rows == [{"n": 6}]


def test_streaming_keeps_up_suspends_and_resumes_without_duplicates(
    transforms: Resources, kube: ApiClient, namespace: str, stack_info: StackInfo, tmp_path: Path, unique: str
) -> None:
    os.chmod(tmp_path, 0o755)
    produce(stack_info.kafka_bootstrap, f"{unique}-in", orders(5), key="id")
    transforms.create(
        unique,
        {
            "mode": "streaming",
            "inputs": [{"name": "orders", "kafka": {"topics": [f"{unique}-in"], "schema": "id INT, amount DOUBLE"}}],
            "sql": "SELECT id, amount * 2 AS doubled FROM orders",
            "output": {"kafka": {"topic": f"{unique}-out", "keyColumn": "id"}},
            "checkpoint": {"location": str(tmp_path / "checkpoint")},
        },
    )
    transforms.wait_condition(unique, "True", "Running", timeout=180)
    read_topic(stack_info.kafka_bootstrap, f"{unique}-out", 5, timeout=120)
    produce(stack_info.kafka_bootstrap, f"{unique}-in", orders(3, start=5), key="id")
    read_topic(stack_info.kafka_bootstrap, f"{unique}-out", 8, timeout=60)  # keeps up with new records

    transforms.patch(unique, {"spec": {"state": "suspended"}})
    transforms.wait_condition(unique, "True", "Suspended", timeout=60)
    wait_for(lambda: not spark_apps(kube, namespace, unique), timeout=60, what="streaming run stopped")
    produce(stack_info.kafka_bootstrap, f"{unique}-in", orders(4, start=8), key="id")

    transforms.patch(unique, {"spec": {"state": "running"}})
    transforms.wait_condition(unique, "True", "Running", timeout=180)
    assert transforms.status(unique)["currentRun"]["trigger"] == "resume"
    values = read_topic(stack_info.kafka_bootstrap, f"{unique}-out", 12, timeout=120)
    ids = sorted(json.loads(v)["id"] for v in values)
    assert ids == list(range(12))  # resumed from the checkpoint: nothing lost, nothing twice
    with pytest.raises(AssertionError):
        read_topic(stack_info.kafka_bootstrap, f"{unique}-out", 13, timeout=10)


def test_schedule_fires_runs_and_trims_history(
    transforms: Resources, kube: ApiClient, namespace: str, tmp_path: Path, unique: str
) -> None:
    (tmp_path / "in.json").write_text('{"id": 1}\n')
    os.chmod(tmp_path, 0o755)
    transforms.create(
        unique,
        {
            "inputs": [{"name": "things", "files": {"path": str(tmp_path / "in.json"), "format": "json"}}],
            "sql": "SELECT count(*) AS n FROM things",
            "output": {"files": {"path": str(tmp_path / "out"), "format": "json"}},
            "schedule": "* * * * * */20",  # every 20 seconds (sixth field: seconds)
            "successfulRunsHistoryLimit": 1,
        },
    )
    seen: set[str] = set()

    def three_runs() -> bool:
        run = (transforms.status(unique).get("currentRun") or {}).get("name")
        if run:
            seen.add(run)
        return len(seen) >= 3

    wait_for(three_runs, timeout=240, what="three scheduled runs", interval=1)
    assert all(r.startswith(unique) for r in seen)
    # Runs may follow each other without a gap (a slot comes due as the previous run ends), so the
    # phase need not show Succeeded in between; lastSuccessfulRun records the completed ones.
    transforms.wait_status(
        unique, lambda s: s.get("lastSuccessfulRun") in seen, timeout=120, what="a scheduled run completed"
    )
    wait_for(lambda: len(spark_apps(kube, namespace, unique)) <= 2, timeout=60, what="history trimmed")
    assert transforms.exists(unique)


def test_no_driver_past_the_deadline_fails_the_run(
    kube: ApiClient, stack_info: StackInfo, tmp_path: Path, unique: str, operator: OperatorProcess
) -> None:
    """A namespace the (stand-in) Spark Operator does not watch: the submission never gets a driver."""
    core = client.CoreV1Api(kube)
    namespace = operator.namespace
    core.patch_namespace(namespace, {"metadata": {"labels": {"fibers.dev/local-executor": "skip"}}})
    try:
        transforms = Resources(kube, "transforms", namespace)
        transforms.create(
            unique,
            {
                "inputs": [{"name": "x", "files": {"path": str(tmp_path), "format": "json"}}],
                "sql": "SELECT 1 AS one",
                "output": {"files": {"path": str(tmp_path / "out"), "format": "json"}},
                "submissionDeadlineSeconds": 10,
            },
        )
        cond = transforms.wait_condition(unique, "False", "SubmissionDeadlineExceeded", timeout=60)
        assert "no driver started within 10s" in cond["message"]
        assert transforms.status(unique)["phase"] == "Failed"
        wait_for(lambda: not spark_apps(kube, namespace, unique), timeout=30, what="stuck run deleted")
    finally:
        core.patch_namespace(namespace, {"metadata": {"labels": {"fibers.dev/local-executor": None}}})
