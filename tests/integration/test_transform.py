"""Transform resources on the real stack: the real Spark Operator (chart-installed, webhook on) runs each
SparkApplication as a driver pod and executor pods from the job image, on the node's kubelet.

Files reach the pods through a hostPath volume the Transform declares (`spark.volumes`), mounted at
/data in the driver and the executors; the directory is opened to the job image's user.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kubernetes import client
from kubernetes.client import ApiClient

from fibers import kubeapi
from fibers.conditions import parse_time
from fibers.jobs import report
from fibers.jobs.spec import LABEL_TRANSFORM, result_config_map
from fibers.kube import Kube
from fibers.transform.sparkapp import (
    FINISHED_FAILED,
    GROUP,
    PLURAL,
    VERSION,
    SparkApplications,
    finished,
    state_of,
)
from fibers_stack import StackInfo, spark_operator
from tests.helpers import Resources, lineage_events, produce, read_all, read_topic, spark_apps, wait_for
from tests.integration.conftest import JOBS_SERVICE_ACCOUNT, OperatorProcess, lineage_env

pytestmark = pytest.mark.transform

DATA = "/data"
APP_LABEL = "sparkoperator.k8s.io/app-name"
KEEP_EXECUTORS = {"spark.kubernetes.executor.deleteOnTermination": "false"}  # to inspect them afterwards


@pytest.fixture(scope="module")
def operator_env(lineage_topic: str) -> dict[str, str]:
    """Every run here also reports its OpenLineage events (checked beside the run they describe)."""
    return lineage_env(lineage_topic)


@pytest.fixture(scope="module")
def transforms(kube: ApiClient, namespace: str, operator: OperatorProcess) -> Resources:
    return Resources(kube, "transforms", namespace)


def lineage_of(bootstrap: str, topic: str, job: str, count: int) -> list[dict[str, Any]]:
    """The job's first `count` lineage events, once there are that many."""
    return wait_for(
        lambda: (e := lineage_events(bootstrap, topic, job)) and len(e) >= count and e[:count],
        timeout=60,
        what=f"{count} lineage events of {job}",
    )


def data_volume(path: Path, **spark: Any) -> dict[str, Any]:
    """spec.spark for a Transform whose driver and executors see `path` at /data."""
    os.chmod(path, 0o777)  # the pods run as the job image's user
    return {
        "volumes": [{"name": "data", "hostPath": {"path": str(path), "type": "Directory"}}],
        "volumeMounts": [{"name": "data", "mountPath": DATA}],
        **spark,
    }


def spark_pods(kube: ApiClient, namespace: str, run: str) -> list[client.V1Pod]:
    return list(client.CoreV1Api(kube).list_namespaced_pod(namespace, label_selector=f"{APP_LABEL}={run}").items)


def succeeded_pods(kube: ApiClient, namespace: str, run: str) -> dict[str, client.V1Pod] | None:
    """The run's driver and executor pod by role, once both have Succeeded."""
    pods = {p.metadata.labels["spark-role"]: p for p in spark_pods(kube, namespace, run)}
    done = set(pods) == {"driver", "executor"} and all(p.status.phase == "Succeeded" for p in pods.values())
    return pods if done else None


def run_to_mongodb(
    transforms: Resources,
    kube: ApiClient,
    namespace: str,
    stack_info: StackInfo,
    secret: str,
    mongo: Any,
    name: str,
    *,
    records: int,
) -> None:
    """Kafka → MongoDB (upserts written by the executors with the Secret's URI); checks the pods."""
    produce(stack_info.kafka_bootstrap, f"{name}-in", orders(records), key="id")
    transforms.create(
        name,
        {
            "inputs": [{"name": "orders", "kafka": {"topics": [f"{name}-in"], "schema": "id INT, amount DOUBLE"}}],
            "sql": "SELECT id, amount FROM orders",
            "output": {
                "mongodb": {
                    "uriSecretRef": {"name": secret, "key": "uri"},
                    "database": name,
                    "collection": "orders",
                    "idColumn": "id",
                }
            },
            "spark": {"sparkConf": KEEP_EXECUTORS},
        },
    )
    transforms.wait_condition(name, "True", "Succeeded", timeout=300)
    assert mongo[name]["orders"].count_documents({}) == records
    assert transforms.status(name)["currentRun"]["recordsOut"] == records  # counted by the executors as they wrote
    run = transforms.status(name)["currentRun"]["name"]
    pods = spark_pods(kube, namespace, run)
    assert {p.metadata.labels["spark-role"] for p in pods} == {"driver", "executor"}
    for pod in pods:
        assert_runs_as_a_user_would(pod, secret=secret)
    [app] = spark_apps(kube, namespace, name)
    assert "mongodb://" not in json.dumps(app), "a secret value in the SparkApplication"


def orders(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"id": i, "customer": f"c{i % 3}", "amount": float(i)} for i in range(start, start + n)]


def out_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(path.glob("part-*")) for line in f.read_text().splitlines()]


def assert_runs_as_a_user_would(pod: client.V1Pod, *, secret: str | None) -> None:
    """What Fibers asks of every Spark pod, read back from the pod the kubelet runs."""
    container = pod.spec.containers[0]
    assert pod.spec.service_account_name == JOBS_SERVICE_ACCOUNT
    assert container.image_pull_policy == "IfNotPresent"
    assert pod.spec.security_context.run_as_non_root is True
    sc = container.security_context
    assert sc.read_only_root_filesystem is True and sc.allow_privilege_escalation is False
    assert sc.capabilities.drop == ["ALL"] and sc.run_as_non_root is True
    assert "/tmp" in {m.mount_path for m in container.volume_mounts}
    if secret:
        refs = {
            e.name: (e.value_from.secret_key_ref.name, e.value_from.secret_key_ref.key)
            for e in container.env or []
            if e.value_from and e.value_from.secret_key_ref
        }
        assert (secret, "uri") in refs.values(), refs
        assert not any(e.value and "mongodb://" in e.value for e in container.env or []), "a secret value in a pod"


def test_batch_topic_to_topic_with_sql_and_stream_back_on_real_pods(
    transforms: Resources,
    kube: ApiClient,
    namespace: str,
    stack_info: StackInfo,
    lineage_topic: str,
    unique: str,
) -> None:
    """A batch run: Kafka in, SQL, Kafka out and streamed back, on a real driver pod and executor pod. Its
    OpenLineage events say START then COMPLETE with its datasets, row counts and the offsets it read. A
    second Transform reads its output through `transformRef`."""
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
            "spark": {"sparkConf": KEEP_EXECUTORS},
        },
    )
    transforms.wait_condition(unique, "True", "Succeeded", timeout=300)
    status = transforms.status(unique)
    assert status["phase"] == "Succeeded"
    run = status["currentRun"]
    assert run["applicationState"] == "COMPLETED"
    assert run["recordsOut"] == 3 and run["streamedBack"] == 3
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
    row = transforms.printed(unique)
    assert (row["Mode"], row["Phase"], row["Run"], row["Ready"], row["Reason"]) == (
        "batch",
        "Succeeded",
        run["name"],
        "True",
        "Succeeded",
    )

    # A real driver pod and a real executor pod ran the job, from the job image, as the chart's user.
    # The kubelet reports the pods' phase a moment after the Spark Operator saw the driver end.
    pods = wait_for(lambda: succeeded_pods(kube, namespace, run["name"]), timeout=60, what="pods Succeeded")
    assert run["driverPod"] == pods["driver"].metadata.name
    for pod in pods.values():
        assert pod.spec.containers[0].image == stack_info.images["job"]
        assert_runs_as_a_user_would(pod, secret=None)

    bootstrap = stack_info.kafka_bootstrap
    start, complete = lineage_of(bootstrap, lineage_topic, f"{namespace}.transform.{unique}", 2)
    assert (start["eventType"], complete["eventType"]) == ("START", "COMPLETE")
    assert start["run"]["runId"] == complete["run"]["runId"] == run["submissionId"]
    assert complete["job"]["namespace"] == "fibers-test"
    [source] = complete["inputs"]
    assert (source["namespace"], source["name"]) == (f"kafka://{bootstrap.split(',')[0]}", f"{unique}-orders")
    assert source["inputFacets"]["inputStatistics"]["rowCount"] == 9
    outputs = {o["name"]: o["outputFacets"]["outputStatistics"]["rowCount"] for o in complete["outputs"]}
    assert outputs == {f"{unique}-totals": 3, f"{unique}-report": 3}
    ingestion = complete["run"]["facets"]["fibers_ingestion"]
    assert (ingestion["kind"], ingestion["rowsIn"], ingestion["rowsOut"], ingestion["streamedBack"]) == (
        "Transform",
        9,
        3,
        3,
    )
    assert ingestion["offsets"] == [{"topic": f"{unique}-orders", "partition": 0, "first": 0, "last": 8}]

    # A Transform reading this one's output by naming it (transformRef), not its topic.
    downstream = f"{unique}-sum"
    transforms.create(
        downstream,
        {
            "inputs": [{"name": "totals", "transformRef": {"name": unique, "schema": "customer STRING, n BIGINT"}}],
            # Distinct customers, not a sum: a Kafka write is at least once, a record may be there twice.
            "sql": "SELECT count(DISTINCT customer) AS n FROM totals",
            "output": {"kafka": {"topic": downstream}},
        },
    )
    transforms.wait_condition(downstream, "True", "Succeeded", timeout=300)
    assert transforms.condition(downstream, "UpstreamReady")["status"] == "True"
    assert transforms.status(downstream)["inputs"] == [{"name": "totals", "topics": [f"{unique}-totals"]}]
    assert [json.loads(v) for v in read_topic(bootstrap, downstream, 1)] == [{"n": 3}]


def test_a_batch_run_reads_its_input_once_so_its_writes_and_lineage_count_the_same_records(
    transforms: Resources, namespace: str, stack_info: StackInfo, lineage_topic: str, unique: str
) -> None:
    """Records keep arriving while the run runs. Each read of the input used to resolve `latest` again, so
    the lineage's `rowsIn` (read last) counted records the output never had; now the run pins the offsets
    it reads before the first read, and every read sees those."""
    bootstrap, source = stack_info.kafka_bootstrap, f"{unique}-orders"
    produce(bootstrap, source, orders(20), key="id")
    writing = threading.Event()

    def keep_writing() -> None:
        producer = Producer({"bootstrap.servers": bootstrap})
        i = 1000
        while not writing.wait(0.05):
            producer.produce(source, key=str(i).encode(), value=json.dumps(orders(1, i)[0]).encode())
            producer.poll(0)
            i += 1
        producer.flush(30)

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        transforms.create(
            unique,
            {
                "inputs": [{"name": "orders", "kafka": {"topics": [source], "schema": "id INT"}}],
                "sql": "SELECT id FROM orders",
                "output": {"kafka": {"topic": f"{unique}-out"}},
                "streamBack": {"topic": f"{unique}-back"},
            },
        )
        transforms.wait_condition(unique, "True", "Succeeded", timeout=300)
    finally:
        writing.set()
        writer.join()
    run = transforms.status(unique)["currentRun"]
    _, complete = lineage_of(bootstrap, lineage_topic, f"{namespace}.transform.{unique}", 2)
    ingestion = complete["run"]["facets"]["fibers_ingestion"]
    [read] = ingestion["offsets"]
    assert (read["first"], ingestion["rowsIn"]) == (0, read["last"] + 1)
    assert run["recordsOut"] == run["streamedBack"] == ingestion["rowsIn"] >= 20, (run, ingestion)


def test_bad_sql_fails_with_sparks_message(
    transforms: Resources,
    kube: ApiClient,
    namespace: str,
    stack_info: StackInfo,
    lineage_topic: str,
    tmp_path: Path,
    unique: str,
) -> None:
    """Spark's own words on Ready, on the driver's termination message, and in the run's FAIL lineage event."""
    (tmp_path / "in.json").write_text('{"id": 1}\n')
    transforms.create(
        unique,
        {
            "inputs": [{"name": "things", "files": {"path": f"{DATA}/in.json", "format": "json"}}],
            "sql": "SELECT * FROM no_such_view",
            "output": {"files": {"path": f"{DATA}/out", "format": "json"}},
            "spark": data_volume(tmp_path),
        },
    )
    cond = transforms.wait_condition(unique, "False", "RunFailed", timeout=300)
    assert "TABLE_OR_VIEW_NOT_FOUND" in cond["message"]
    assert transforms.condition(unique, "Stalled")["status"] == "True"
    assert transforms.status(unique)["phase"] == "Failed"
    # The driver also left its error as the pod's termination message (read when no ConfigMap has it).
    driver = client.CoreV1Api(kube).read_namespaced_pod(transforms.status(unique)["currentRun"]["driverPod"], namespace)
    status = next(s for s in driver.status.container_statuses if s.name == "spark-kubernetes-driver")
    assert "TABLE_OR_VIEW_NOT_FOUND" in status.state.terminated.message
    assert driver.spec.containers[0].termination_message_policy == "FallbackToLogsOnError"

    start, fail = lineage_of(stack_info.kafka_bootstrap, lineage_topic, f"{namespace}.transform.{unique}", 2)
    assert (start["eventType"], fail["eventType"]) == ("START", "FAIL")
    error = fail["run"]["facets"]["errorMessage"]
    assert "TABLE_OR_VIEW_NOT_FOUND" in error["message"] and error["programmingLanguage"] == "python"


def test_a_batch_run_starts_from_a_time_a_seek_runs_it_again_and_never_before_what_kafka_keeps(
    transforms: Resources, stack_info: StackInfo, unique: str
) -> None:
    """An input's startFrom {timestamp: T} over records on both sides of T (their timestamps set by the
    producer): the run reads exactly those at or after T. A seek to earliest runs it again over every record.
    Once Kafka no longer keeps the first records, a seek to a time before them fails the run naming
    StartBeforeRetention, instead of Spark moving it up unseen."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from confluent_kafka.cimpl import TopicPartition

    from fibers.startfrom import format_time

    topic = f"{unique}-stamped"
    admin = AdminClient({"bootstrap.servers": stack_info.kafka_bootstrap})  # held: its futures die with it
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    t = int(time.time() * 1000) - 60_000
    producer = Producer({"bootstrap.servers": stack_info.kafka_bootstrap})
    for i, stamp in enumerate([t - 30_000 + i for i in range(4)] + [t + 1_000 * i for i in range(6)]):
        producer.produce(topic, key=str(i).encode(), value=json.dumps({"id": i}).encode(), timestamp=stamp)
    assert producer.flush(30) == 0
    spec = {
        "inputs": [{"name": "stamped", "kafka": {"topics": [topic], "schema": "id INT"}}],
        "sql": "SELECT id FROM stamped",
        "output": {"kafka": {"topic": f"{unique}-ids"}},
        "rerunNonce": "1",
    }
    spec["inputs"][0]["startFrom"] = {"timestamp": format_time(t)}
    transforms.create(unique, spec)
    transforms.wait_condition(unique, "True", "Succeeded", timeout=300)
    assert transforms.status(unique)["currentRun"]["recordsOut"] == 6
    ids = sorted(json.loads(r)["id"] for r in read_topic(stack_info.kafka_bootstrap, f"{unique}-ids", 6))
    assert ids == [4, 5, 6, 7, 8, 9]

    # A seek runs it again from where it says, whatever the input says: from the oldest record here.
    transforms.patch(unique, {"spec": {"seek": {"nonce": "1", "startFrom": {"position": "earliest"}}}})
    transforms.wait_status(
        unique,
        lambda s: s.get("lastSeekNonce") == "1" and (s.get("currentRun") or {}).get("recordsOut") == 10,
        timeout=300,
        what="the seek's run over every record",
    )

    [deleted] = admin.delete_records([TopicPartition(topic, 0, 2)]).values()
    deleted.result(30)  # Kafka keeps offsets from 2 now
    before = format_time(t - 60_000)
    seek = {"nonce": "2", "startFrom": {"position": None, "timestamp": before}}  # a merge patch: the old one out
    transforms.patch(unique, {"spec": {"seek": seek}})
    cond = transforms.wait_condition(unique, "False", "RunFailed", timeout=300)
    assert f"StartBeforeRetention: startFrom.timestamp {before}" in cond["message"], cond
    assert "offsets from 2" in cond["message"], cond


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"schedule": "61 * * * *"}, "spec.schedule: '61 * * * *' is not a usable cron expression"),
        ({"schedule": "0 0 30 2 *"}, "spec.schedule: '0 0 30 2 *' is not a usable cron expression"),
        (  # Spark's view names ignore case: the second one would replace the first
            {
                "inputs": [
                    {"name": "orders", "kafka": {"topics": ["t"]}},
                    {"name": "ORDERS", "kafka": {"topics": ["u"]}},
                ]
            },
            "two inputs are named 'ORDERS'",
        ),
    ],
)
def test_what_passes_admission_but_cannot_run_is_invalid_spec_at_once(
    transforms: Resources,
    kube: ApiClient,
    namespace: str,
    operator: OperatorProcess,
    spec: dict[str, Any],
    message: str,
    unique: str,
) -> None:
    base = {
        "inputs": [{"name": "t", "kafka": {"topics": ["t"]}}],
        "sql": "SELECT 1",
        "output": {"kafka": {"topic": "o"}},
    }
    transforms.create(unique, {**base, **spec})
    cond = transforms.wait_condition(unique, "False", "InvalidSpec", timeout=30)
    assert cond["message"].startswith(message)
    assert transforms.condition(unique, "Stalled")["status"] == "True"
    assert not spark_apps(kube, namespace, unique)
    log = operator.log()
    assert "Traceback" not in log and "CroniterBadCronError" not in log


def test_rerun_nonce_starts_a_new_run_over_a_connects_topic_and_delete_removes_runs(
    transforms: Resources,
    kube: ApiClient,
    namespace: str,
    stack_info: StackInfo,
    tmp_path: Path,
    unique: str,
    operator: OperatorProcess,
) -> None:
    """A batch Transform reading a Connect's topic (`connectRef`, resolved to the topics the Connect reports):
    a new `rerunNonce` starts a new run over what the topic holds by then, and one asked while the Connect is
    gone waits for it; deleting the Transform removes its runs and their pods, and its metric series."""
    source = tmp_path / "lines.txt"
    source.write_text("".join(f"line {i}\n" for i in range(6)))
    spark = data_volume(tmp_path)  # also opens the directory to the Connect worker
    connects = Resources(kube, "connects", namespace)
    connects.create(f"{unique}-src", {"class": "FileStreamSource", "config": {"file": str(source), "topic": unique}})
    connects.wait_status(f"{unique}-src", lambda s: s.get("topics") == [unique], timeout=90, what="topics reported")
    transforms.create(
        unique,
        {
            "inputs": [{"name": "lines", "connectRef": {"name": f"{unique}-src"}}],
            "sql": "SELECT count(*) AS n FROM lines",
            "output": {"files": {"path": f"{DATA}/out", "format": "json"}},
            "spark": spark,
        },
    )
    transforms.wait_condition(unique, "True", "Succeeded", timeout=300)
    first = transforms.status(unique)["currentRun"]["name"]
    assert transforms.status(unique)["currentRun"]["recordsOut"] == 1
    # What it reads, as resolved through the Connect (what a Replay counts and moves for it).
    assert transforms.status(unique)["inputs"] == [{"name": "lines", "topics": [unique]}]
    assert out_rows(tmp_path / "out") == [{"n": 6}]
    with source.open("a") as more:
        more.write("".join(f"line {i}\n" for i in range(6, 9)))
    read_topic(stack_info.kafka_bootstrap, unique, 9)  # the Connect has carried the new lines over
    transforms.patch(unique, {"spec": {"rerunNonce": "again"}})

    def second_run_succeeded(status: dict[str, Any]) -> bool:
        run = status.get("currentRun") or {}
        if run.get("name") in (None, first):
            return False
        # The new run is never shown under the last run's phase (it once was, between write-ahead and report).
        succeeded = status.get("phase") == "Succeeded"
        assert not succeeded or run.get("applicationState") == "COMPLETED", status
        return succeeded

    status = transforms.wait_status(unique, second_run_succeeded, timeout=300, what="second run succeeded")
    assert status["currentRun"]["trigger"] == "rerun"
    assert status["lastRerunNonce"] == "again"
    assert out_rows(tmp_path / "out") == [{"n": 9}]
    assert len(spark_apps(kube, namespace, unique)) == 2
    # Each run counted once, as the Spark Operator counts SparkApplications; the age of the output.
    labels = {"namespace": namespace, "name": unique}
    assert operator.metric("fibers_transform_submit_count_total", **labels) == [2.0]
    assert operator.metric("fibers_transform_success_count_total", **labels) == [2.0]
    assert operator.metric("fibers_transform_failure_count_total", **labels) == [0.0]  # there from the start
    assert operator.metric("fibers_transform_success_execution_time_seconds_count", **labels) == [2.0]
    finished = parse_time(status["currentRun"]["finishedAt"]).timestamp()
    assert operator.metric("fibers_transform_last_success_timestamp_seconds", **labels) == [finished]

    # A rerun asked while its input is gone waits for it, and is carried out once it is back: never dropped.
    connects.delete(f"{unique}-src")
    wait_for(lambda: not connects.exists(f"{unique}-src"), timeout=60, what="the Connect deleted")
    transforms.patch(unique, {"spec": {"rerunNonce": "once-it-is-back"}})
    waiting = transforms.wait_condition(unique, "False", "InputsNotReady", timeout=60)
    assert f"{unique}-src" in waiting["message"] and "does not exist" in waiting["message"]
    assert transforms.status(unique)["lastRerunNonce"] == "again"
    assert len(spark_apps(kube, namespace, unique)) == 2  # nothing started, the last run kept
    connects.create(f"{unique}-src", {"class": "FileStreamSource", "config": {"file": str(source), "topic": unique}})
    with source.open("a") as more:  # a Connect's topics are known once it writes (Kafka Connect's active topics)
        more.write("".join(f"line {i}\n" for i in range(9, 12)))
    status = transforms.wait_status(
        unique,
        lambda s: s.get("lastRerunNonce") == "once-it-is-back" and s.get("phase") == "Succeeded",
        timeout=300,
        what="the rerun carried out once its Connect is back",
    )
    assert status["currentRun"]["trigger"] == "rerun" and len(spark_apps(kube, namespace, unique)) == 3

    # No finalizer: its deletion (and its namespace's) never waits for the operator; the series go on DELETED.
    assert not transforms.get(unique)["metadata"].get("finalizers")
    transforms.delete(unique)
    wait_for(
        lambda: not operator.metric("fibers_transform_success_count_total", **labels),
        timeout=60,
        what="the deleted Transform's series gone",
    )
    wait_for(lambda: not spark_apps(kube, namespace, unique), timeout=60, what="runs garbage-collected")
    wait_for(lambda: not spark_pods(kube, namespace, first), timeout=60, what="the runs' pods garbage-collected")


def test_streaming_keeps_up_suspends_resumes_and_restarts_for_its_secret_without_loss(
    transforms: Resources, kube: ApiClient, namespace: str, stack_info: StackInfo, tmp_path: Path, unique: str
) -> None:
    """A streaming run follows its topic, says on Ready an executor it lost (Spark replaces it), is suspended
    and resumed from its checkpoint, and, asked to (restartOnSecretChange), is restarted from it when a Secret
    it mounts changes: nothing lost throughout."""
    core = client.CoreV1Api(kube)
    secret = f"{unique}-extra"
    core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name=secret), string_data={"token": "one"})
    )
    spark = data_volume(tmp_path)
    spark["volumes"].append({"name": "extra", "secret": {"secretName": secret}})
    spark["volumeMounts"].append({"name": "extra", "mountPath": "/etc/extra", "readOnly": True})
    produce(stack_info.kafka_bootstrap, f"{unique}-in", orders(5), key="id")
    transforms.create(
        unique,
        {
            "mode": "streaming",
            "inputs": [{"name": "orders", "kafka": {"topics": [f"{unique}-in"], "schema": "id INT, amount DOUBLE"}}],
            "sql": "SELECT id, amount * 2 AS doubled FROM orders",
            "output": {"kafka": {"topic": f"{unique}-out", "keyColumn": "id"}},
            # On the node's disk, so the next driver pod resumes where the last one stopped.
            "checkpoint": {"location": f"{DATA}/checkpoint"},
            "spark": spark,
            "restartOnSecretChange": True,
        },
    )

    def every_id(count: int) -> bool:
        # A micro-batch under way when a run or an executor stopped is written again (at least once): ids count.
        ids = {json.loads(v)["id"] for v in read_all(stack_info.kafka_bootstrap, f"{unique}-out")}
        return ids == set(range(count))

    transforms.wait_condition(unique, "True", "Running", timeout=300)
    read_topic(stack_info.kafka_bootstrap, f"{unique}-out", 5, timeout=180)
    produce(stack_info.kafka_bootstrap, f"{unique}-in", orders(3, start=5), key="id")
    read_topic(stack_info.kafka_bootstrap, f"{unique}-out", 8, timeout=60)  # keeps up with new records

    # An executor lost under the running query is said on Ready; Spark's replacement carries on.
    run = transforms.status(unique)["currentRun"]["name"]
    [executor] = [
        p
        for p in spark_pods(kube, namespace, run)
        if p.metadata.labels["spark-role"] == "executor" and p.status.phase == "Running"
    ]
    core.delete_namespaced_pod(executor.metadata.name, namespace, grace_period_seconds=0)
    # (The Spark Operator says UNKNOWN of it; the unit test's hand-made FAILED was never what it says.)
    wait_for(lambda: "1 lost" in transforms.condition(unique)["message"], timeout=120, what="the executor lost")
    ready = transforms.condition(unique)
    assert ready["status"] == "True" and run in ready["message"] and "executors: " in ready["message"]
    produce(stack_info.kafka_bootstrap, f"{unique}-in", orders(1, start=8), key="id")
    wait_for(lambda: every_id(9), timeout=180, what="the record after the executor's loss")

    transforms.patch(unique, {"spec": {"state": "suspended"}})
    transforms.wait_condition(unique, "True", "Suspended", timeout=60)
    wait_for(lambda: not spark_apps(kube, namespace, unique), timeout=90, what="streaming run stopped")
    produce(stack_info.kafka_bootstrap, f"{unique}-in", orders(3, start=9), key="id")

    transforms.patch(unique, {"spec": {"state": "running"}})
    transforms.wait_condition(unique, "True", "Running", timeout=300)
    assert transforms.status(unique)["currentRun"]["trigger"] == "resume"
    wait_for(lambda: every_id(12), timeout=180, what="every record after the resume")  # from its checkpoint

    resumed = transforms.status(unique)["currentRun"]
    core.patch_namespaced_secret(secret, namespace, {"stringData": {"token": "two"}})
    restarted = transforms.wait_status(
        unique, lambda s: (s.get("currentRun") or {}).get("trigger") == "secret-change", timeout=60
    )["currentRun"]
    assert restarted["name"] != resumed["name"] and restarted["secretsDigest"] != resumed["secretsDigest"]
    # Whoever reads the status but not the Secret knows its name and key: a plain hash of a guessed value
    # matched the recorded digest (a way to test guesses of a password offline); it is keyed by the Secret's uid.
    guess = json.dumps({"token": base64.b64encode(b"two").decode()}, sort_keys=True)
    plain = hashlib.sha256(f"{secret}\0\0+{guess}\0".encode()).hexdigest()[:16]
    assert restarted["secretsDigest"] != plain
    event = transforms.wait_event(unique, "SecretChanged")
    assert secret in event["message"] and "two" not in event["message"]
    transforms.wait_condition(unique, "True", "Running", timeout=300)
    produce(stack_info.kafka_bootstrap, f"{unique}-in", orders(2, start=12), key="id")
    wait_for(lambda: every_id(14), timeout=180, what="every record after the restart")  # nothing lost
    transforms.delete(unique)


def test_a_schedule_fires_runs_overlapping_as_its_concurrency_policy_says_and_trims_its_history(
    transforms: Resources, kube: ApiClient, namespace: str, tmp_path: Path, unique: str, operator: OperatorProcess
) -> None:
    """Runs every 20 s: successful and failed runs beyond their history limits go; then runs whose driver
    cannot be placed (1,000 CPUs) stay going, so slots come due while one goes: Forbid skips the slot, Allow
    runs them side by side, Replace deletes the run going for the new one (only unit tests with hand-made
    SparkApplications covered the policies and the failed limit). Parked drivers cost the 2-core machine
    nothing, where overlapping real runs slowed each other for minutes."""
    (tmp_path / "in.json").write_text('{"id": 1}\n')
    transforms.create(
        unique,
        {
            "inputs": [{"name": "things", "files": {"path": f"{DATA}/in.json", "format": "json"}}],
            "sql": "SELECT count(*) AS n FROM things",
            "output": {"files": {"path": f"{DATA}/out", "format": "json"}},
            "schedule": "* * * * * */20",  # every 20 seconds (sixth field: seconds)
            "successfulRunsHistoryLimit": 1,
            "failedRunsHistoryLimit": 0,
            "submissionDeadlineSeconds": 600,
            "spark": data_volume(tmp_path),
        },
    )

    def names() -> list[str]:
        return [a["metadata"]["name"] for a in spark_apps(kube, namespace, unique)]  # oldest first

    def going() -> list[str]:
        return [
            a["metadata"]["name"]
            for a in spark_apps(kube, namespace, unique)
            if not finished(a) and not a["metadata"].get("deletionTimestamp")
        ]

    def current() -> str | None:
        return (transforms.status(unique).get("currentRun") or {}).get("name")

    # With a history of one, the first run goes once a later one has succeeded (the current run counts).
    first = wait_for(lambda: names() and names()[0], timeout=120, what="a scheduled run", interval=1)
    assert first.startswith(unique)
    wait_for(
        lambda: transforms.status(unique).get("lastSuccessfulRun") not in (None, first) and first not in names(),
        timeout=300,
        what="a later run succeeded and the first trimmed",
        interval=1,
    )
    # When the schedule last fired, for the overdue alert (a run that completes ends after it).
    fired = parse_time(transforms.status(unique)["lastScheduleTime"]).timestamp()
    labels = {"namespace": namespace, "name": unique}
    assert operator.metric("fibers_transform_last_schedule_timestamp_seconds", **labels)[0] >= fired

    # Runs that fail: with failedRunsHistoryLimit 0 a failed run goes once it is not the current one.
    transforms.patch(unique, {"spec": {"sql": "SELECT no_such_column FROM things"}})
    failed = wait_for(
        lambda: [a["metadata"]["name"] for a in spark_apps(kube, namespace, unique) if state_of(a) in FINISHED_FAILED],
        timeout=180,
        what="a failed run",
        interval=1,
    )[0]
    wait_for(
        lambda: current() not in (None, failed) and failed not in names(),
        timeout=120,
        what="the failed run trimmed once the next one started",
        interval=1,
    )

    # Drivers that cannot be placed: each run goes until its deadline, so every later slot overlaps it.
    before = set(names())
    transforms.patch(unique, {"spec": {"spark": {"driver": {"cores": 1000, "coreRequest": "1000"}}}})
    parked = wait_for(lambda: [n for n in names() if n not in before], timeout=120, what="a parked run", interval=1)[0]
    waited_from = parse_time(transforms.status(unique)["lastScheduleTime"])
    wait_for(  # Forbid (the default): the next slot is skipped while the parked run goes
        lambda: parse_time(transforms.status(unique)["lastScheduleTime"]) > waited_from,
        timeout=60,
        what="the next slot",
        interval=1,
    )
    assert names()[-1] == parked and parked in going()

    transforms.patch(unique, {"spec": {"concurrencyPolicy": "Allow"}})
    side_by_side = wait_for(lambda: len(going()) >= 2 and going(), timeout=60, what="two runs at once", interval=1)
    assert parked in side_by_side

    transforms.patch(unique, {"spec": {"concurrencyPolicy": "Replace"}})
    wait_for(
        lambda: (g := going()) and len(g) == 1 and not set(g) & set(side_by_side),
        timeout=60,
        what="the runs going deleted for the next slot's",
        interval=1,
    )
    assert not set(side_by_side) & set(names())  # deleted, not left to finish
    transforms.delete(unique)


def test_no_driver_past_the_deadline_fails_the_run(
    kube: ApiClient, tmp_path: Path, unique: str, operator: OperatorProcess
) -> None:
    """A namespace the Spark Operator does not watch (no label): the submission never gets a driver."""
    core = client.CoreV1Api(kube)
    namespace = operator.namespace
    label = spark_operator.JOB_NAMESPACE_LABEL
    core.patch_namespace(namespace, {"metadata": {"labels": {label: None}}})
    try:
        transforms = Resources(kube, "transforms", namespace)
        transforms.create(
            unique,
            {
                "inputs": [{"name": "x", "files": {"path": f"{DATA}/in.json", "format": "json"}}],
                "sql": "SELECT 1 AS one",
                "output": {"files": {"path": f"{DATA}/out", "format": "json"}},
                "submissionDeadlineSeconds": 10,
            },
        )
        cond = transforms.wait_condition(unique, "False", "SubmissionDeadlineExceeded", timeout=90)
        assert "did not take up the run within 10s" in cond["message"] and namespace in cond["message"]
        assert transforms.status(unique)["phase"] == "Failed"
        wait_for(lambda: not spark_apps(kube, namespace, unique), timeout=30, what="stuck run deleted")
    finally:
        core.patch_namespace(namespace, {"metadata": {"labels": {label: "enabled"}}})


def test_a_driver_that_cannot_start_is_said_at_once_and_fails_the_run_at_its_deadline_with_why(
    transforms: Resources, kube: ApiClient, namespace: str, stack_info: StackInfo, unique: str
) -> None:
    """Two drivers that will never start: an image that is not in the registry (the kubelet's
    ErrImagePull / ImagePullBackOff) and one asking for 1,000 CPUs (the scheduler's Unschedulable).
    Each Transform says so on Ready well before its deadline, with the kubelet's or scheduler's words,
    and the run then fails naming that reason instead of a bare timeout, and is deleted."""
    base = {
        "inputs": [{"name": "x", "files": {"path": f"{DATA}/in.json", "format": "json"}}],
        "sql": "SELECT 1 AS one",
        "output": {"files": {"path": f"{DATA}/out", "format": "json"}},
        # Past the driver pod's creation (the Spark Operator's spark-submit, slower on a loaded machine) and
        # the 10 s an unschedulable pod is given: the deadline's message then has the reason to name.
        "submissionDeadlineSeconds": 60,
    }
    no_image, too_big = f"{unique}-img", f"{unique}-cpu"
    transforms.create(no_image, {**base, "spark": {"image": f"{stack_info.image_registry}/fibers/no-such-job:0"}})
    transforms.create(too_big, {**base, "spark": {"driver": {"cores": 1000, "coreRequest": "1000"}}})
    created = time.monotonic()

    def said(name: str, reasons: set[str]) -> dict[str, Any] | None:
        ready = transforms.condition(name, "Ready") or {}
        return ready if ready.get("reason") in reasons else None

    pulled = wait_for(lambda: said(no_image, {"ErrImagePull", "ImagePullBackOff"}), timeout=55, what="image error")
    placed = wait_for(lambda: said(too_big, {"Unschedulable"}), timeout=55, what="unschedulable")
    print(f"said why within {time.monotonic() - created:.1f}s of creation")
    assert "no-such-job" in pulled["message"] and "-driver" in pulled["message"]
    assert "Insufficient cpu" in placed["message"]
    trouble = transforms.status(too_big)["currentRun"]["podTrouble"]
    assert trouble["reason"] == "Unschedulable" and trouble["pod"].endswith("-driver")

    for name, words in ((no_image, ("ImagePullBackOff", "ErrImagePull")), (too_big, ("Unschedulable",))):
        cond = transforms.wait_condition(name, "False", "SubmissionDeadlineExceeded", timeout=120)
        assert "no driver started within 60s of submission" in cond["message"]
        assert any(word in cond["message"] for word in words), cond["message"]
        assert transforms.status(name)["phase"] == "Failed"
        wait_for(lambda n=name: not spark_apps(kube, namespace, n), timeout=30, what="stuck run deleted")


@pytest.fixture
def webhook_off(kube: ApiClient, stack_info: StackInfo) -> Iterator[None]:
    """The Spark Operator's chart with `webhook.enable=false`, restored afterwards."""
    image = stack_info.images["spark-operator"]
    run_dir = Path(stack_info.run_dir)
    spark_operator.install(kube, stack_info.kubeconfig, image, webhook=False, run_dir=run_dir)
    try:
        yield
    finally:
        spark_operator.install(kube, stack_info.kubeconfig, image, webhook=True, run_dir=run_dir)


def test_without_the_spark_operators_webhook_pods_still_get_secrets_and_security(
    webhook_off: None,
    transforms: Resources,
    kube: ApiClient,
    namespace: str,
    stack_info: StackInfo,
    mongo_secret: str,
    mongo: Any,
    unique: str,
) -> None:
    """Pod templates carry them: with the webhook off, `driver.env` and security contexts would be dropped."""
    assert not client.AdmissionregistrationV1Api(kube).list_mutating_webhook_configuration().items
    run_to_mongodb(transforms, kube, namespace, stack_info, mongo_secret, mongo, unique, records=4)


@pytest.mark.parametrize("schedule", ["every day", "* * *", "*/5 * * * * * * *", "@sometimes"])
def test_a_schedule_that_is_not_cron_is_refused_by_the_api_server(
    transforms: Resources, schedule: str, unique: str
) -> None:
    spec = {"inputs": [{"name": "t", "kafka": {"topics": ["t"]}}], "sql": "SELECT 1", "schedule": schedule}
    with pytest.raises(client.exceptions.ApiException) as err:
        transforms.create(unique, spec)
    assert err.value.status == 422 and "spec.schedule" in err.value.body


def test_a_result_configmap_of_another_is_never_written_read_or_deleted_as_a_runs(
    kube: ApiClient, namespace: str, stack_info: StackInfo, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's result ConfigMap has a name anyone in the namespace may have taken: the driver writes over
    only one a run of its Transform wrote, and the operator reads and deletes only such a one (its uid)."""
    monkeypatch.setenv("KUBECONFIG", stack_info.kubeconfig)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    report.kube_api.cache_clear()  # the driver's client, made once per process: from this KUBECONFIG
    core = client.CoreV1Api(kube)
    theirs, ours = result_config_map(f"{unique}-1"), result_config_map(f"{unique}-2")
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=theirs), data={"recordsOut": "7"})
    )
    assert not report.write_error_config_map(namespace, theirs, unique, "boom")
    assert report.write_error_config_map(namespace, ours, unique, "first")
    assert report.write_error_config_map(namespace, ours, unique, "second")  # a rerun's driver replaces its own

    async def operator_side() -> tuple[dict[str, str], dict[str, str]]:
        apps = SparkApplications(Kube(kubeapi.Api(kubeapi.from_kubeconfig(stack_info.kubeconfig))))
        found = await apps.result(namespace, unique, f"{unique}-1"), await apps.result(namespace, unique, f"{unique}-2")
        for run in (f"{unique}-1", f"{unique}-2"):
            await apps.delete_result(namespace, unique, run)
        return found

    try:
        assert asyncio.run(operator_side()) == ({}, {"error": "second"})
    finally:
        report.kube_api.cache_clear()  # the next user of the driver's client in this process makes its own
    assert core.read_namespaced_config_map(theirs, namespace).data == {"recordsOut": "7"}
    assert ours not in {cm.metadata.name for cm in core.list_namespaced_config_map(namespace).items}


def test_a_spark_application_only_labelled_for_a_transform_is_never_taken_or_deleted_as_its_run(
    transforms: Resources, kube: ApiClient, namespace: str, unique: str
) -> None:
    """Runs were found by their label alone: a SparkApplication copied by hand to debug a run (or one left by
    an earlier Transform of the name) was the Transform's own to the operator, deleted as an active run when
    it was suspended. Only the runs it owns are its runs."""
    custom = client.CustomObjectsApi(kube)
    copy = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SparkApplication",
        "metadata": {"name": f"{unique}-copy", "labels": {LABEL_TRANSFORM: unique}},
        "spec": {  # suspended: the Spark Operator leaves it as it is
            "type": "Python",
            "mode": "cluster",
            "sparkVersion": "4.0.0",
            "image": "debug:1",
            "mainApplicationFile": "local:///opt/debug.py",
            "suspend": True,
            "driver": {"cores": 1, "memory": "512m"},
            "executor": {"instances": 1, "cores": 1, "memory": "512m"},
        },
    }
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, copy)
    spec = {
        "mode": "streaming",
        "inputs": [{"name": "t", "kafka": {"topics": [f"{unique}-in"], "schema": "id INT"}}],
        "sql": "SELECT * FROM t",
        "output": {"kafka": {"topic": f"{unique}-out"}},
        "checkpoint": {"location": f"{DATA}/{unique}-checkpoint"},
        "state": "suspended",
    }
    transforms.create(unique, spec)
    transforms.wait_condition(unique, "True", "Suspended", timeout=60)
    time.sleep(5)  # a delete of the copy, as an active run of a suspended Transform, came at once
    kept = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, f"{unique}-copy")
    assert kept["metadata"].get("deletionTimestamp") is None
    assert "currentRun" not in transforms.status(unique)
    transforms.delete(unique)
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, f"{unique}-copy")
