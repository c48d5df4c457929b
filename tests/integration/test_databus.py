"""DatabusConsumer end to end: PostgreSQL → Debezium (a Connect resource) → Kafka → consumer → MongoDB.

Consumer pods run on the node's kubelet from the job image, as the chart's jobs ServiceAccount; tests
delete them and kill their containers. Some tests also run `fibers consume` (what the pods run) as a
local process, to kill it at will many times over.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import client, watch
from kubernetes.client import ApiClient
from prometheus_client.parser import text_string_to_metric_families
from pymongo import MongoClient

from fibers import conditions
from fibers.consumer.events import decode
from fibers.consumer.ownership import lease_name
from fibers.consumer.positions import next_offset as resume_offset
from fibers.databus.checkpoint import Checkpoint
from fibers.databus.owners import LABEL_CONSUMER
from fibers.databus.workload import METRICS_PORT
from fibers_stack import StackInfo, node
from fibers_stack.namespaces import CONSUMER_SERVICE_ACCOUNT
from tests.helpers import Resources, debezium_connect, latest_rows, produce, read_records, wait_for
from tests.integration.conftest import OperatorProcess, free_port, scrape

pytestmark = pytest.mark.databus
PG = psycopg.Connection[tuple[Any, ...]]


@pytest.fixture(scope="module")
def consumers(kube: ApiClient, namespace: str, operator: OperatorProcess) -> Resources:
    return Resources(kube, "databusconsumers", namespace)


def table_rows(pg: PG, table: str) -> dict[str, dict[str, Any]]:
    return {
        str(r[0]): {"id": r[0], "item": r[1], "qty": r[2]}
        for r in pg.execute(f"SELECT id, item, qty FROM {table} ORDER BY id").fetchall()
    }


def view_rows(mongo: MongoClient[dict[str, Any]], db: str, collection: str) -> dict[str, dict[str, Any]]:
    return {d["_id"]: {k: d[k] for k in ("id", "item", "qty")} for d in mongo[db][collection].find()}


def mutate(pg: PG, table: str, rounds: int, rng: random.Random, start_id: int = 0) -> None:
    """Inserts, updates and deletes, several per transaction."""
    next_id = start_id
    for _ in range(rounds):
        with pg.transaction():
            for _ in range(rng.randint(2, 6)):
                live = [r[0] for r in pg.execute(f"SELECT id FROM {table}").fetchall()]
                choice = rng.random()
                if choice < 0.5 or not live:
                    pg.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)", (next_id, f"item{next_id}", 1))
                    next_id += 1
                elif choice < 0.85:
                    pg.execute(
                        f"UPDATE {table} SET qty = qty + 1, item = %s WHERE id = %s",
                        (f"upd{rng.randint(0, 99)}", rng.choice(live)),
                    )
                else:
                    pg.execute(f"DELETE FROM {table} WHERE id = %s", (rng.choice(live),))


@pytest.fixture(scope="module")
def cdc(kube: ApiClient, namespace: str, operator: OperatorProcess, stack_info: StackInfo) -> Iterator[dict[str, Any]]:
    """A PostgreSQL table and a Debezium Connect resource streaming it into Kafka with transaction metadata."""
    table = f"orders_{namespace.replace('-', '_')}"
    with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
        pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, item text, qty int)")
        for i in range(5):
            pg.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)", (i, f"seed{i}", i))
    prefix = f"cdc{namespace.replace('-', '')}"
    connector = f"orders-cdc-{namespace}"  # connector names are per Connect cluster, not per namespace
    config = {"provide.transaction.metadata": "true"}
    with debezium_connect(
        kube, namespace, stack_info, name=connector, table=table, prefix=prefix, config=config
    ) as topic:
        yield {"table": table, "topic": topic, "slot": prefix}


def mongo_sink(secret: str, db: str, collection: str) -> dict[str, Any]:
    return {"type": "mongodb", "uriSecretRef": {"name": secret, "key": "uri"}, "database": db, "collection": collection}


def test_table_is_materialised_in_mongodb(
    consumers: Resources, cdc: dict[str, Any], mongo_secret: str, stack_info: StackInfo, unique: str
) -> None:
    mongo: MongoClient[dict[str, Any]] = MongoClient(stack_info.mongodb_uri)
    consumers.create(unique, {"sources": [cdc["topic"]], "sink": mongo_sink(mongo_secret, unique, "orders")})
    with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
        mutate(pg, cdc["table"], 15, random.Random(1), start_id=100)
        expected = table_rows(pg, cdc["table"])
    wait_for(lambda: view_rows(mongo, unique, "orders") == expected, timeout=120, what="MongoDB equals the table")
    consumers.wait_condition(unique, "True", "Consuming", timeout=60)
    # The checkpoint reaches status on the operator's next look at it (writes are throttled too).
    status = consumers.wait_status(
        unique, lambda s: s.get("consumptionMode") == "ONLINE_CONSUMPTION", what="checkpoint mirrored", timeout=60
    )
    assert status["windowScn"] > 0 and status["prevScn"] == status["windowScn"]
    assert status["readyInstances"] == 1
    assert status["checkpointConfigMap"] == f"{unique}-checkpoint"
    consumers.wait_status(unique, lambda s: s.get("lag") == 0 and s.get("eventsProcessed", 0) > 0, timeout=30)


def test_one_consumer_feeds_two_sinks_from_one_read(
    consumers: Resources,
    kube: ApiClient,
    cdc: dict[str, Any],
    mongo_secret: str,
    stack_info: StackInfo,
    operator: OperatorProcess,
    unique: str,
) -> None:
    """A MongoDB view and a Kafka feed of the same stream, one checkpoint: both equal the table."""
    mongo: MongoClient[dict[str, Any]] = MongoClient(stack_info.mongodb_uri)
    feed = f"{unique}-feed"
    sinks = [{**mongo_sink(mongo_secret, unique, "orders"), "name": "view"}, {"type": "kafka", "topic": feed}]
    consumers.create(unique, {"sources": [cdc["topic"]], "sinks": sinks})
    with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
        mutate(pg, cdc["table"], 15, random.Random(21), start_id=2000)
        expected = table_rows(pg, cdc["table"])
    wait_for(lambda: view_rows(mongo, unique, "orders") == expected, timeout=120, what="the view equals the table")
    fields = ("id", "item", "qty")
    wait_for(
        lambda: latest_rows(read_records(stack_info.kafka_bootstrap, feed, idle=1), fields) == expected,
        timeout=60,
        what="the Kafka feed equals the table",
    )

    def figures(status: dict[str, Any]) -> bool:
        sinks = status.get("sinks") or []
        return [x["name"] for x in sinks] == ["view", "kafka"] and all(x["windows"] > 0 for x in sinks)

    try:
        status = consumers.wait_status(unique, figures, timeout=60, what="each sink's figures in status")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; status.sinks is {consumers.status(unique).get('sinks')}") from None
    assert all(x["errors"] == 0 and x["timeouts"] == 0 for x in status["sinks"])
    # Ready follows the StatefulSet's ready pods as the reconcile before read them: it may come a look later.
    consumers.wait_condition(unique, "True", "Consuming", timeout=60)
    row, now = consumers.printed(unique), consumers.status(unique)
    assert (row["Sink"], row["Mode"], row["Ready"], row["Upstream"]) == (
        "mongodb, kafka",
        "ONLINE_CONSUMPTION",
        "True",
        "True",
    )
    assert row["SCN"] == now["windowScn"] > 0 and row["Lag"] == now["lag"]
    # The same figures as metrics, for alerts: one series per sink; they go when the consumer goes.
    for sink in ("view", "kafka"):
        [windows] = operator.metric("fibers_databus_sink_windows", name=unique, sink=sink)
        assert windows > 0 and operator.metric("fibers_databus_sink_errors", name=unique, sink=sink) == [0]
    consumers.delete(unique)
    wait_for(lambda: not consumers.exists(unique), timeout=60, what="the consumer deleted")
    for series in ("fibers_databus_sink_windows", "fibers_databus_consumer_lag", "fibers_databus_events_processed"):
        assert operator.metric(series, name=unique) == [], f"{series} still served for a deleted consumer"


def test_consumer_series_return_to_their_baseline_after_twenty_consumers_come_and_go(
    consumers: Resources, stack_info: StackInfo, operator: OperatorProcess, unique: str
) -> None:
    """Twenty consumers, five at a time (each runs a pod on the node): while they run the operator serves
    their lag, events and sink figures; once they are deleted, exactly the series it served before."""

    def consumer_series() -> set[tuple[str, frozenset[tuple[str, str]]]]:
        text = httpx.get(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5).text
        return {
            (s.name, frozenset(s.labels.items()))
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("fibers_databus_")
        }

    topic = f"{unique}-relay"
    produce(stack_info.kafka_bootstrap, topic, [{"id": i} for i in range(3)], key="id")
    baseline = consumer_series()
    for batch in range(4):
        names = [f"{unique}-{batch}-{i}" for i in range(5)]
        for name in names:
            consumers.create(name, {"sources": [topic], "sink": {"type": "log"}, "startPosition": "earliest"})
        wait_for(
            lambda n=names: all(operator.metric("fibers_databus_events_processed", name=x) == [3] for x in n),
            timeout=180,
            what=f"batch {batch}: every consumer's events served",
        )
        assert len(consumer_series() - baseline) == 5 * 6  # lag, events and the sink's four figures
        for name in names:
            consumers.delete(name)
        wait_for(lambda n=names: not any(consumers.exists(x) for x in n), timeout=120, what="the consumers deleted")
        assert consumer_series() == baseline, f"batch {batch}"


def consumer_pod(kube: ApiClient, namespace: str, name: str) -> client.V1Pod | None:
    """The running, ready pod of a one-instance consumer (None while there is none)."""
    pods = client.CoreV1Api(kube).list_namespaced_pod(namespace, label_selector=f"fibers.dev/databusconsumer={name}")
    for pod in pods.items:
        if (
            pod.metadata.deletion_timestamp is None
            and pod.status.phase == "Running"
            and all(c.ready for c in pod.status.container_statuses or [])
        ):
            return pod
    return None


def test_consumer_pods_deleted_and_killed_lose_nothing(
    consumers: Resources,
    cdc: dict[str, Any],
    mongo_secret: str,
    stack_info: StackInfo,
    kube: ApiClient,
    namespace: str,
    unique: str,
) -> None:
    """A real pod from the job image: deleted (the StatefulSet makes another), then its container killed
    (the kubelet restarts it). Each time the view catches up with the table from the checkpoint."""
    mongo: MongoClient[dict[str, Any]] = MongoClient(stack_info.mongodb_uri)
    consumers.create(unique, {"sources": [cdc["topic"]], "sink": mongo_sink(mongo_secret, unique, "orders")})
    rng = random.Random(7)
    pod = wait_for(lambda: consumer_pod(kube, namespace, unique), timeout=120, what="a ready consumer pod")
    container = pod.spec.containers[0]
    assert container.image == stack_info.images["job"] and container.image_pull_policy == "IfNotPresent"
    assert pod.spec.service_account_name == CONSUMER_SERVICE_ACCOUNT  # not the Spark drivers' (pods, services)
    assert container.security_context.read_only_root_filesystem is True
    assert pod.spec.security_context.run_as_non_root is True
    [uri_env] = [e for e in container.env if e.name == "FIBERS_SINK_MONGODB_URI"]
    assert uri_env.value is None and uri_env.value_from.secret_key_ref.name == mongo_secret  # by reference only

    def converged(what: str) -> None:
        with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
            mutate(pg, cdc["table"], 8, rng, start_id=500 + 100 * len(what))
            expected = table_rows(pg, cdc["table"])
        wait_for(lambda: view_rows(mongo, unique, "orders") == expected, timeout=180, what=f"MongoDB = table {what}")

    converged("at first")
    client.CoreV1Api(kube).delete_namespaced_pod(pod.metadata.name, namespace)
    converged("after the pod was deleted")
    replacement = wait_for(
        lambda: (p := consumer_pod(kube, namespace, unique)) and p.metadata.uid != pod.metadata.uid and p,
        timeout=120,
        what="the StatefulSet's new pod",
    )
    container_id = replacement.status.container_statuses[0].container_id.removeprefix("containerd://")
    node.ctr(Path(stack_info.run_dir), "tasks", "kill", "-s", "SIGKILL", container_id)
    restarted = wait_for(
        lambda: (
            (p := consumer_pod(kube, namespace, unique)) and p.status.container_statuses[0].restart_count >= 1 and p
        ),
        timeout=120,
        what="the kubelet to restart the killed container",
    )
    assert restarted.metadata.uid == replacement.metadata.uid
    assert restarted.status.container_statuses[0].last_state.terminated.exit_code != 0
    converged("after the container was killed")
    consumers.wait_condition(unique, "True", "Consuming", timeout=60)


def checkpoint_modes(kube: ApiClient, namespace: str, name: str, seen: list[str], stop: threading.Event) -> None:
    """Every consumption_mode written to a checkpoint ConfigMap, in order, through a watch."""
    core = client.CoreV1Api(kube)
    w = watch.Watch()
    while not stop.is_set():
        for event in w.stream(
            core.list_namespaced_config_map, namespace, field_selector=f"metadata.name={name}", timeout_seconds=2
        ):
            for key, value in (event["object"].data or {}).items():
                if key != "sources.sha256":
                    mode = Checkpoint.parse(value).consumption_mode.value
                    if not seen or seen[-1] != mode:
                        seen.append(mode)
            if stop.is_set():
                break


def test_a_later_consumer_bootstraps_from_the_store(
    consumers: Resources,
    cdc: dict[str, Any],
    mongo_secret: str,
    stack_info: StackInfo,
    kube: ApiClient,
    namespace: str,
    unique: str,
) -> None:
    mongo: MongoClient[dict[str, Any]] = MongoClient(stack_info.mongodb_uri)
    store = {"enabled": True, "uriSecretRef": {"name": mongo_secret, "key": "uri"}, "database": f"{unique}store"}
    consumers.create(
        f"{unique}-store",
        {
            "sources": [cdc["topic"]],
            "sink": {
                "type": "bootstrap",
                "uriSecretRef": {"name": mongo_secret, "key": "uri"},
                "database": f"{unique}store",
            },
        },
    )
    with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
        mutate(pg, cdc["table"], 10, random.Random(2), start_id=300)
    consumers.wait_condition(f"{unique}-store", "True", "Consuming", timeout=90)
    consumers.wait_status(f"{unique}-store", lambda s: s.get("lag") == 0, timeout=60, what="store caught up")

    seen: list[str] = []
    stop = threading.Event()
    watcher = threading.Thread(
        target=checkpoint_modes, args=(kube, namespace, f"{unique}-view-checkpoint", seen, stop), daemon=True
    )
    watcher.start()
    consumers.create(
        f"{unique}-view",
        {
            "sources": [cdc["topic"]],
            "sink": mongo_sink(mongo_secret, unique, "orders"),
            "bootstrap": store,
            "startPosition": "bootstrap",
        },
    )
    with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
        mutate(pg, cdc["table"], 5, random.Random(3), start_id=400)  # changes while it bootstraps
        expected = table_rows(pg, cdc["table"])
    wait_for(lambda: view_rows(mongo, unique, "orders") == expected, timeout=120, what="bootstrapped view equals table")
    consumers.wait_condition(f"{unique}-view", "True", "Consuming", timeout=60)
    stop.set()
    watcher.join(10)
    assert seen[:3] == ["BOOTSTRAP_SNAPSHOT", "BOOTSTRAP_CATCHUP", "ONLINE_CONSUMPTION"], seen


def test_malformed_checkpoint_is_reported_not_reset(
    consumers: Resources, cdc: dict[str, Any], mongo_secret: str, kube: ApiClient, namespace: str, unique: str
) -> None:
    core = client.CoreV1Api(kube)
    data = {"sources.sha256": "0" * 64, f"{cdc['topic']}.0": "{not json"}
    labels = {LABEL_CONSUMER: unique}  # the consumer's own ConfigMap (any other is not read: see below)
    meta = client.V1ObjectMeta(name=f"{unique}-checkpoint", labels=labels)
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=meta, data=data))
    consumers.create(unique, {"sources": [cdc["topic"]], "sink": mongo_sink(mongo_secret, unique, "orders")})
    cond = consumers.wait_condition(unique, "False", "CheckpointInvalid", timeout=60)
    assert f"{unique}-checkpoint" in cond["message"]
    assert consumers.condition(unique, "Stalled")["status"] == "True"
    time.sleep(3)
    assert core.read_namespaced_config_map(f"{unique}-checkpoint", namespace).data == data  # untouched


def test_a_configmap_or_statefulset_the_consumer_did_not_create_is_never_read_written_or_deleted(
    consumers: Resources, kube: ApiClient, namespace: str, unique: str
) -> None:
    """`checkpoint.configMapName` is the user's word: naming another consumer's checkpoints (which would
    resume from its offsets and skip records) or any other ConfigMap runs nothing and says whose it is,
    and neither a seek nor `retention: Delete` deletes it. Nor is another workload's StatefulSet that
    has the consumer's name patched to run consumer pods, or deleted by a seek, nor a Lease made by
    someone else under the name of one of the consumer's partitions taken over."""
    core, apps = client.CoreV1Api(kube), client.AppsV1Api(kube)
    theirs = f"{unique}-theirs"
    labelled = {LABEL_CONSUMER: "another-consumer"}
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=theirs, labels=labelled), data={"k": "v"})
    )
    plain = f"{unique}-plain"
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=plain), data={"k": "v"})
    )

    database = f"{unique}-c"  # someone's StatefulSet, of the name the next consumer gets
    labels = {"app": "db"}
    template = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels=labels),
        spec=client.V1PodSpec(containers=[client.V1Container(name="db", image="db.example/db:1")]),
    )
    sts_spec = client.V1StatefulSetSpec(
        replicas=0, service_name="", selector=client.V1LabelSelector(match_labels=labels), template=template
    )
    apps.create_namespaced_stateful_set(
        namespace, client.V1StatefulSet(metadata=client.V1ObjectMeta(name=database), spec=sts_spec)
    )

    planted = lease_name(f"{unique}-d", "t", 0)  # a Lease someone made, of the name of a consumer's partition
    coordination = client.CoordinationV1Api(kube)
    holder = client.V1LeaseSpec(holder_identity="someone", lease_duration_seconds=1)
    coordination.create_namespaced_lease(
        namespace, client.V1Lease(metadata=client.V1ObjectMeta(name=planted), spec=holder)
    )

    def spec(configmap: str) -> dict[str, Any]:
        seek = {"to": "earliest", "nonce": "1"}
        checkpoint = {"configMapName": configmap, "retention": "Delete"}
        return {"sources": ["t"], "sink": {"type": "log"}, "checkpoint": checkpoint, "seek": seek}

    cases = (
        (f"{unique}-a", theirs, f"ConfigMap {theirs} belongs to consumer another-consumer"),
        (f"{unique}-b", plain, f"ConfigMap {plain} was not created for a consumer"),
        (database, f"{unique}-own", f"StatefulSet {database} was not created for a consumer"),
        (f"{unique}-d", f"{unique}-d-own", f"Lease {planted} was not created for a consumer"),
    )
    for name, configmap, whose in cases:
        consumers.create(name, spec(configmap))
        cond = consumers.wait_condition(name, "False", "Conflict", timeout=30)
        assert whose in cond["message"]
        selector = f"fibers.dev/databusconsumer={name}"
        assert not apps.list_namespaced_stateful_set(namespace, label_selector=selector).items  # nothing runs
        consumers.delete(name)
        wait_for(lambda name=name: not consumers.exists(name), timeout=30, what="the consumer gone")
    for configmap in (theirs, plain):  # neither the seek nor the deletion took them
        assert core.read_namespaced_config_map(configmap, namespace).data == {"k": "v"}
    assert coordination.read_namespaced_lease(planted, namespace).spec.holder_identity == "someone"
    kept = apps.read_namespaced_stateful_set(database, namespace)  # neither patched nor deleted
    assert kept.spec.replicas == 0 and kept.spec.template.spec.containers[0].image == "db.example/db:1"
    apps.delete_namespaced_stateful_set(database, namespace)


# ----- the runtime on its own: killed, failing callbacks, falling off the relay ------------------


def run_consumer(
    stack_info: StackInfo,
    config: dict[str, Any],
    log_file: Path,
    extra_env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        **stack_info.env(),
        "FIBERS_SINK_MONGODB_URI": stack_info.mongodb_uri,
        "FIBERS_BOOTSTRAP_MONGODB_URI": stack_info.mongodb_uri,
        **(extra_env or {}),
    }
    with open(log_file, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "fibers", "consume", "--config", json.dumps(config), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def consumer_config(
    name: str, namespace: str, topic: str, stack_info: StackInfo, sink: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "relay": {"bootstrapServers": stack_info.kafka_bootstrap, "topics": [topic]},
        "sink": sink,
        "checkpoint": {"configMapName": f"{name}-checkpoint", "minIntervalSeconds": 0.2},
        "startPosition": "earliest",
        **extra,
    }


def stored_checkpoint(kube: ApiClient, namespace: str, name: str, key: str) -> Checkpoint | None:
    try:
        cm = client.CoreV1Api(kube).read_namespaced_config_map(f"{name}-checkpoint", namespace)
    except client.exceptions.ApiException:
        return None
    text = (cm.data or {}).get(key)
    return Checkpoint.parse(text) if text else None


def record_at(bootstrap: str, topic: str, offset: int) -> Any:
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "enable.auto.commit": False})
    reader.assign([TopicPartition(topic, 0, offset)])
    try:
        for _ in range(40):
            message = reader.poll(0.5)
            if message is not None and not message.error():
                return decode(message.topic(), message.partition(), message.offset(), message.key(), message.value())
    finally:
        reader.close()
    raise AssertionError(f"no record at {topic}@{offset}")


def deleted_after(bootstrap: str, topic: str, key: str, offset: int) -> bool:
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "enable.auto.commit": False})
    reader.assign([TopicPartition(topic, 0, offset)])
    try:
        while (message := reader.poll(2)) is not None:
            if message.error():
                continue
            event = decode(message.topic(), message.partition(), message.offset(), message.key(), message.value())
            if event is not None and event.key == key and event.op == "d":
                return True
    finally:
        reader.close()
    return False


def test_sigkill_twenty_times_loses_nothing_and_checkpoints_never_run_ahead(
    cdc: dict[str, Any], stack_info: StackInfo, kube: ApiClient, namespace: str, tmp_path: Path, unique: str
) -> None:
    mongo: MongoClient[dict[str, Any]] = MongoClient(stack_info.mongodb_uri)
    collection = mongo[unique]["orders"]
    config = consumer_config(
        unique,
        namespace,
        cdc["topic"],
        stack_info,
        {"type": "mongodb", "uriEnv": "FIBERS_SINK_MONGODB_URI", "database": unique, "collection": "orders"},
    )
    writer_done = threading.Event()

    def write() -> None:
        with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
            mutate(pg, cdc["table"], 60, random.Random(7), start_id=1000)
        writer_done.set()

    threading.Thread(target=write, daemon=True).start()
    rng = random.Random(11)
    key = f"{cdc['topic']}.0"
    for _ in range(20):
        proc = run_consumer(stack_info, config, tmp_path / "consumer.log")
        time.sleep(rng.uniform(1.5, 3.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        cp = stored_checkpoint(kube, namespace, unique, key)
        next_offset = cp.get("kafka_next_offset") if cp else None
        if isinstance(next_offset, int) and next_offset > 0:
            # The last event the checkpoint covers must be in MongoDB already (or, for a delete, gone).
            event = record_at(stack_info.kafka_bootstrap, cdc["topic"], next_offset - 1)
            if event is not None and event.document is not None:
                stored = collection.find_one({"_id": event.key})
                applied = stored is not None and stored["_scn"] >= event.scn
                # Absent is fine only if a later delete of that key was applied (events past the checkpoint).
                assert applied or (
                    stored is None and deleted_after(stack_info.kafka_bootstrap, cdc["topic"], event.key, next_offset)
                ), f"checkpoint at offset {next_offset} is ahead of MongoDB for key {event.key}"
    writer_done.wait(120)
    proc = run_consumer(stack_info, config, tmp_path / "consumer.log")
    try:
        with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
            expected = table_rows(pg, cdc["table"])
        wait_for(
            lambda: view_rows(mongo, unique, "orders") == expected,
            timeout=120,
            what="MongoDB equals the table after 20 kills",
        )
    finally:
        proc.terminate()
        proc.wait(30)


def test_callback_error_rolls_back_and_retries(
    stack_info: StackInfo, namespace: str, tmp_path: Path, unique: str
) -> None:
    module = tmp_path / "flaky_callback.py"
    module.write_text(
        "import json, pathlib\n"
        "from fibers.consumer.callbacks import Callback, Result\n"
        "class Flaky(Callback):\n"
        "    def __init__(self, journal):\n"
        "        self.journal = pathlib.Path(journal)\n"
        "        self.failures = 0\n"
        "    def note(self, *entry):\n"
        "        with self.journal.open('a') as f:\n"
        "            f.write(json.dumps(entry) + '\\n')\n"
        "    def on_data_event(self, event):\n"
        "        if event.key == '3' and self.failures < 2:\n"
        "            self.failures += 1\n"
        "            self.note('error', event.key)\n"
        "            return Result.ERROR\n"
        "        self.note('event', event.key)\n"
        "        return Result.SUCCESS\n"
        "    def on_rollback(self, scn):\n"
        "        self.note('rollback', scn)\n"
        "        return Result.SUCCESS\n"
    )
    journal = tmp_path / "journal.jsonl"
    produce(stack_info.kafka_bootstrap, unique, [{"id": i, "v": i} for i in range(6)], key="id")
    config = consumer_config(
        unique,
        namespace,
        unique,
        stack_info,
        {"type": "callback", "callback": "flaky_callback:Flaky", "options": {"journal": str(journal)}},
        callback={"retries": 3, "retryBackoffSeconds": 0.2},
    )
    port = free_port()
    proc = run_consumer(
        stack_info, config, tmp_path / "consumer.log", {"PYTHONPATH": str(tmp_path)}, args=("--metrics-port", str(port))
    )
    try:
        wait_for(
            lambda: journal.exists() and journal.read_text().count('"event"') >= 6,
            timeout=60,
            what="all events delivered",
        )
        # What the pod serves for the PodMonitor tells the same story: two rollbacks, each a sink error, and
        # every event applied once; the partition's checkpoint caught up with the relay.
        wait_for(
            lambda: scrape(port, "fibers_consumer_lag", topic=unique, partition="0") == [0], timeout=30, what="lag 0"
        )
        assert scrape(port, "fibers_consumer_events_total", name=unique) == [6]
        assert scrape(port, "fibers_consumer_rollbacks_total", phase="online") == [2]
        assert scrape(port, "fibers_consumer_callback_errors_total", sink="callback") == [2]
        assert scrape(port, "fibers_consumer_retry_attempt") == [0]
        assert scrape(port, "fibers_consumer_mode", mode="ONLINE_CONSUMPTION") == [1]
        assert scrape(port, "fibers_consumer_timelines") == [1]
        assert scrape(port, "fibers_consumer_checkpoint_writes_total")[0] >= 1
        (age,) = scrape(port, "fibers_consumer_checkpoint_age_seconds", topic=unique, partition="0")
        assert 0 <= age < 60
        assert scrape(port, "fibers_consumer_callback_seconds_count", sink="callback")[0] >= 3
    finally:
        proc.terminate()
        proc.wait(30)
    entries = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [e[0] for e in entries].count("rollback") == 2
    assert [e[1] for e in entries if e[0] == "event"] == ["0", "1", "2", "3", "4", "5"]  # each once, in order


def low_watermark(bootstrap: str, topic: str) -> int:
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    try:
        return int(probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[0])
    finally:
        probe.close()


def test_falling_off_the_relay_bootstraps(
    stack_info: StackInfo, kube: ApiClient, namespace: str, tmp_path: Path, unique: str
) -> None:
    admin = AdminClient({"bootstrap.servers": stack_info.kafka_bootstrap})
    admin.create_topics(
        [NewTopic(unique, 1, 1, config={"retention.ms": "3000", "segment.ms": "500", "segment.bytes": "1048576"})]
    )[unique].result(30)
    mongo: MongoClient[dict[str, Any]] = MongoClient(stack_info.mongodb_uri)
    store_cfg = consumer_config(
        f"{unique}-store",
        namespace,
        unique,
        stack_info,
        {"type": "bootstrap", "uriEnv": "FIBERS_SINK_MONGODB_URI", "database": f"{unique}s"},
    )
    view_cfg = consumer_config(
        f"{unique}-view",
        namespace,
        unique,
        stack_info,
        {"type": "mongodb", "uriEnv": "FIBERS_SINK_MONGODB_URI", "database": unique, "collection": "rows"},
        bootstrap={"uriEnv": "FIBERS_BOOTSTRAP_MONGODB_URI", "database": f"{unique}s"},
    )
    store = run_consumer(stack_info, store_cfg, tmp_path / "store.log")
    view = run_consumer(stack_info, view_cfg, tmp_path / "view.log")
    try:
        produce(stack_info.kafka_bootstrap, unique, [{"id": i, "v": 0} for i in range(5)], key="id")
        wait_for(lambda: mongo[unique]["rows"].count_documents({}) == 5, timeout=60, what="view has the rows")
        view.terminate()
        view.wait(30)
        # Row 2 deleted while the view is down: the store's snapshot no longer has it, so only its log can
        # tell the view (a catch-up from where the store stood left row 2 in the view for good).
        delete = {"op": "d", "before": {"id": 2}, "after": None, "source": {}}
        produce(stack_info.kafka_bootstrap, unique, [delete | {"id": 2}], key="id")
        for round_ in range(1, 4):  # more changes while the view is down, spread over several segments
            produce(stack_info.kafka_bootstrap, unique, [{"id": i, "v": round_} for i in range(5, 8)], key="id")
            time.sleep(1)
        wait_for(
            lambda: low_watermark(stack_info.kafka_bootstrap, unique) > 5,
            timeout=60,
            what="old records deleted from the relay",
        )
        view = run_consumer(stack_info, view_cfg, tmp_path / "view.log")
        expected = {str(i): 0 for i in (0, 1, 3, 4)} | {str(i): 3 for i in range(5, 8)}
        wait_for(
            lambda: {d["_id"]: d["v"] for d in mongo[unique]["rows"].find()} == expected,
            timeout=90,
            what="view converged through a bootstrap",
        )
        assert "fell off the relay" in (tmp_path / "view.log").read_text()
    finally:
        for proc in (store, view):
            proc.terminate()
            proc.wait(30)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"sources": ["t", "t"], "sink": {"type": "log"}}, "spec.sources[1]"),
        ({"sources": ["t"], "sink": {"type": "log"}, "checkpoint": {"configMapName": "Bad_Name!"}}, "configMapName"),
        ({"sources": ["t"], "sink": mongo_sink("mongo", "a.b", "c")}, "spec.sink.database"),
        ({"sources": ["t"], "sink": mongo_sink("Not_A_Secret", "d", "c")}, "spec.sink.uriSecretRef.name"),
        ({"sources": ["t"], "sink": {"type": "log"}, "relay": {"bootstrapServers": "kafka"}}, "bootstrapServers"),
    ],
)
def test_duplicate_sources_and_bad_names_are_refused_by_the_api_server(
    consumers: Resources, spec: dict[str, Any], field: str, unique: str
) -> None:
    with pytest.raises(client.exceptions.ApiException) as err:
        consumers.create(unique, spec)
    assert err.value.status == 422 and field in err.value.body


def test_a_collection_mongodb_refuses_is_invalid_spec_and_nothing_runs(
    consumers: Resources, kube: ApiClient, namespace: str, mongo_secret: str, operator: OperatorProcess, unique: str
) -> None:
    """Admission lets it through (any string); the operator answers on the resource before any pod exists."""
    consumers.create(unique, {"sources": ["t"], "sink": mongo_sink(mongo_secret, "shop", "system.users")})
    cond = consumers.wait_condition(unique, "False", "InvalidSpec", timeout=30)
    assert cond["message"].startswith("spec.sink.collection: 'system.users' is not a collection name")
    assert consumers.condition(unique, "Stalled")["status"] == "True"
    apps = client.AppsV1Api(kube)
    assert not apps.list_namespaced_stateful_set(namespace, label_selector=f"fibers.dev/databusconsumer={unique}").items
    assert "Traceback" not in operator.log()


def test_a_consumer_that_exits_says_why_on_the_resource(
    consumers: Resources, kube: ApiClient, namespace: str, unique: str
) -> None:
    """The pod's termination message (written by the consumer) becomes the condition, not an exit code."""
    consumers.create(unique, {"sources": ["t"], "sink": {"type": "callback", "callback": "no_such_module:Sink"}})
    cond = consumers.wait_condition(unique, "False", "ModuleNotFoundError", timeout=120)
    assert "No module named 'no_such_module'" in cond["message"]
    assert "exited with code" not in cond["message"]
    pods = client.CoreV1Api(kube).list_namespaced_pod(namespace, label_selector=f"fibers.dev/databusconsumer={unique}")
    container = pods.items[0].spec.containers[0]
    assert container.termination_message_policy == "FallbackToLogsOnError"


def test_a_paused_consumer_is_left_as_it_runs_until_the_pause_ends(
    consumers: Resources, kube: ApiClient, namespace: str, unique: str, stack_info: StackInfo
) -> None:
    """fibers.dev/paused-reconciliation, as the README gives it for every kind: a DatabusConsumer ignored it
    and applied every spec change to its StatefulSet."""
    apps = client.AppsV1Api(kube)
    admin = AdminClient({"bootstrap.servers": stack_info.kafka_bootstrap})
    admin.create_topics([NewTopic(unique, 1, 1)])[unique].result(30)
    consumers.create(unique, {"sources": [unique], "sink": {"type": "log"}})
    wait_for(lambda: consumers.status(unique).get("readyInstances") == 1, timeout=120, what="one instance ready")
    consumers.patch(unique, {"metadata": {"annotations": {"fibers.dev/paused-reconciliation": "true"}}})
    consumers.patch(unique, {"spec": {"instances": 2}})
    consumers.wait_paused(unique)
    assert apps.read_namespaced_stateful_set(unique, namespace).spec.replicas == 1  # looked at, left as it ran
    consumers.patch(unique, {"metadata": {"annotations": {"fibers.dev/paused-reconciliation": None}}})
    wait_for(
        lambda: apps.read_namespaced_stateful_set(unique, namespace).spec.replicas == 2,
        timeout=60,
        what="two instances once the pause ended",
    )
    consumers.delete(unique)


def test_a_consumer_applied_before_its_topic_waits_unready_says_why_and_consumes_once_it_exists(
    consumers: Resources, kube: ApiClient, namespace: str, unique: str, stack_info: StackInfo
) -> None:
    """A consumer is often applied before what writes its topic (a Connect, a Transform, in one Argo CD sync):
    its instance exited with "relay topic … does not exist (yet)" and was restarted by the kubelet with a
    growing back-off: a crash loop, and records written meanwhile waited for the next restart.

    Its first topic lookup is held 8 s (a failpoint; a loaded machine's slow Kafka did it in CI): the first
    look at the instance hears "looking up its relay topics", and the operator, which asked again only an
    instance that had said nothing, kept that answer and never told of the missing topic."""
    spec = {"sources": [unique], "sink": {"type": "log"}, "startPosition": "earliest", "state": "suspended"}
    consumers.create(unique, spec)
    consumers.wait_status(unique, lambda s: s.get("phase") == "Suspended", timeout=90, what="suspended")
    held = [{"name": "consumer", "env": [{"name": "FIBERS_FAILPOINTS", "value": "relay.lookup=1*sleep(8)"}]}]
    client.AppsV1Api(kube).patch_namespaced_stateful_set(
        unique, namespace, {"spec": {"template": {"spec": {"containers": held}}}}
    )
    consumers.patch(unique, {"spec": {"state": "running"}})
    cond = wait_for(
        lambda: (c := consumers.condition(unique)) and "does not exist yet" in c.get("message", "") and c,
        timeout=120,
        what="the missing topic on Ready",
    )
    assert cond["status"] == "False" and f"{unique}-0: relay topic {unique} does not exist yet" in cond["message"]
    pods = client.CoreV1Api(kube).list_namespaced_pod(namespace, label_selector=f"{LABEL_CONSUMER}={unique}")
    assert [cs.restart_count for p in pods.items for cs in p.status.container_statuses or []] == [0]
    admin = AdminClient({"bootstrap.servers": stack_info.kafka_bootstrap})
    admin.create_topics([NewTopic(unique, 1, 1)])[unique].result(30)
    produce(stack_info.kafka_bootstrap, unique, [{"id": i} for i in range(3)], key="id")
    consumers.wait_status(unique, lambda s: s.get("eventsProcessed") == 3, timeout=120, what="the records")
    consumers.wait_condition(unique, "True", timeout=60)
    pods = client.CoreV1Api(kube).list_namespaced_pod(namespace, label_selector=f"{LABEL_CONSUMER}={unique}")
    assert [cs.restart_count for p in pods.items for cs in p.status.container_statuses or []] == [0]
    consumers.delete(unique)


def test_a_live_consumer_throttles_checkpoints_restarts_suspends_falls_off_its_relay_and_is_sought_back(
    consumers: Resources, kube: ApiClient, namespace: str, unique: str, stack_info: StackInfo
) -> None:
    """One consumer through its life: checkpoint writes throttled under a stream of windows, a restartNonce,
    suspended and running again while it runs (not only created suspended), its relay aging out the records
    it had not read with no bootstrap store (it stops and says RelayFallOff, never resets its offset
    silently, and waits instead of exiting into a crash loop as it did), then a seek with a nonce."""
    core, apps = client.CoreV1Api(kube), client.AppsV1Api(kube)
    bootstrap, key = stack_info.kafka_bootstrap, f"{unique}.0"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    short = {"retention.ms": "3000", "segment.ms": "500", "segment.bytes": "1048576"}
    admin.create_topics([NewTopic(unique, 1, 1, config=short)])[unique].result(30)
    spec = {"sources": [unique], "sink": {"type": "log"}, "checkpoint": {"minIntervalSeconds": 2}}
    consumers.create(unique, spec)
    wait_for(lambda: consumers.status(unique).get("readyInstances") == 1, timeout=120, what="one instance ready")

    def pod() -> client.V1Pod:
        return wait_for(lambda: consumer_pod(kube, namespace, unique), timeout=120, what="a ready pod")

    def figure(series: str) -> float:
        text = httpx.get(f"http://{pod().status.pod_ip}:{METRICS_PORT}/metrics", timeout=5).text
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == series
        )

    def next_offset() -> int | None:
        return resume_offset(stored_checkpoint(kube, namespace, unique, key))

    # A record every 150 ms, each its own window: one checkpoint write per 2 s, not one per window.
    windows, writes = figure("fibers_consumer_windows_total"), figure("fibers_consumer_checkpoint_writes_total")
    for i in range(20):
        produce(bootstrap, unique, [{"id": i}], key="id")
        time.sleep(0.15)
    wait_for(lambda: next_offset() == 20, timeout=30, what="the 20 records checkpointed")
    windows = figure("fibers_consumer_windows_total") - windows
    writes = figure("fibers_consumer_checkpoint_writes_total") - writes
    print(f"{windows:.0f} windows, {writes:.0f} checkpoint writes")
    assert windows >= 10 and 1 <= writes <= windows / 3

    first = pod().metadata.uid
    consumers.patch(unique, {"spec": {"restartNonce": "1"}})
    wait_for(
        lambda: (p := consumer_pod(kube, namespace, unique)) and p.metadata.uid != first, timeout=120, what="a new pod"
    )
    consumers.wait_status(unique, lambda s: s.get("lastRestartNonce") == "1", timeout=30, what="the nonce acted on")
    assert next_offset() == 20  # resumed from its checkpoint

    consumers.patch(unique, {"spec": {"state": "suspended"}})
    consumers.wait_status(unique, lambda s: s.get("phase") == "Suspended", timeout=90, what="suspended")
    assert apps.read_namespaced_stateful_set(unique, namespace).spec.replicas == 0
    for round_ in range(3):  # records it misses, over several segments, which the relay then drops
        produce(bootstrap, unique, [{"id": 100 + round_}], key="id")
        time.sleep(1)
    wait_for(lambda: low_watermark(bootstrap, unique) > 20, timeout=60, what="the unread records aged out")

    consumers.patch(unique, {"spec": {"state": "running"}})
    cond = wait_for(
        lambda: (c := consumers.condition(unique)) and "RelayFallOff" in c.get("message", "") and c,
        timeout=120,
        what="the fall-off on Ready",
    )
    assert cond["status"] == "False" and "configure a bootstrap store or seek" in cond["message"]
    time.sleep(15)  # a crash loop would have restarted it by now
    pods = core.list_namespaced_pod(namespace, label_selector=f"{LABEL_CONSUMER}={unique}").items
    assert [cs.restart_count for p in pods for cs in p.status.container_statuses or []] == [0]
    assert next_offset() == 20  # never reset silently

    consumers.patch(unique, {"spec": {"seek": {"to": "earliest", "nonce": "1"}}})
    high = 23
    wait_for(lambda: next_offset() == high, timeout=120, what="consumed again from what Kafka keeps")
    consumers.wait_condition(unique, "True", timeout=60)

    consumers.patch(unique, {"spec": {"state": "stopped"}})  # the older word
    consumers.wait_status(unique, lambda s: s.get("phase") == "Stopped", timeout=90, what="stopped")
    assert core.list_namespaced_pod(namespace, label_selector=f"{LABEL_CONSUMER}={unique}").items == []
    consumers.delete(unique)


def test_a_consumer_whose_pod_cannot_pull_its_image_says_so_at_once(
    consumers: Resources, stack_info: StackInfo, unique: str
) -> None:
    """An image that is not in the registry: the kubelet's ErrImagePull / ImagePullBackOff and its message
    on Ready within seconds, not "0/1 instances ready" for as long as nobody looks at the pod."""
    image = f"{stack_info.image_registry}/fibers/no-such-consumer:0"
    consumers.create(unique, {"sources": ["t"], "sink": {"type": "log"}, "image": image})
    created = time.monotonic()
    cond = wait_for(
        lambda: (c := consumers.condition(unique)) and c.get("reason") in ("ErrImagePull", "ImagePullBackOff") and c,
        timeout=55,
        what="the image error on Ready",
    )
    print(f"said why within {time.monotonic() - created:.1f}s of creation: {cond['message']}")
    assert cond["status"] == "False" and "no-such-consumer" in cond["message"] and f"{unique}-0" in cond["message"]
    consumers.delete(unique)


def test_an_instance_the_api_server_does_not_answer_waits_unready_and_the_consumer_says_why(
    consumers: Resources, kube: ApiClient, namespace: str, unique: str, stack_info: StackInfo
) -> None:
    """Checkpoint writes refused for about 25 s (a failpoint in the pod, as an API server restart or
    priority-and-fairness throttling would refuse them): the pod turns NotReady and is not restarted, the
    consumer's condition says the instance waits for the API server, and it consumes again afterwards."""
    admin = AdminClient({"bootstrap.servers": stack_info.kafka_bootstrap})  # held: its futures die with it
    admin.create_topics([NewTopic(unique, 1, 1)])[unique].result(30)
    produce(stack_info.kafka_bootstrap, unique, [{"id": i} for i in range(3)], key="id")
    consumers.create(unique, {"sources": [unique], "sink": {"type": "log"}, "startPosition": "earliest"})
    consumers.wait_status(unique, lambda s: s.get("eventsProcessed") == 3, timeout=180, what="the first records")
    # The pod template edited by hand, as one would to debug (the operator keeps what it did not render):
    # every checkpoint write after the claim fails six times, through the store's whole backoff.
    failing = [{"name": "consumer", "env": [{"name": "FIBERS_FAILPOINTS", "value": "checkpoint.write=1+6*error"}]}]
    client.AppsV1Api(kube).patch_namespaced_stateful_set(
        unique, namespace, {"spec": {"template": {"spec": {"containers": failing}}}}
    )

    def faulty_pod() -> client.V1Pod | None:
        pod = consumer_pod(kube, namespace, unique)
        env = {e.name for e in pod.spec.containers[0].env or []} if pod else set()
        return pod if "FIBERS_FAILPOINTS" in env else None

    pod = wait_for(faulty_pod, timeout=180, what="the pod with the failpoint ready")
    produce(stack_info.kafka_bootstrap, unique, [{"id": i} for i in range(3, 6)], key="id")
    cond = consumers.wait_condition(unique, "False", "InstancesWaiting", timeout=90)
    assert f"{pod.metadata.name}: waiting for the API server to take its checkpoints since" in cond["message"], cond
    consumers.wait_condition(unique, "True", "Consuming", timeout=120)
    # Every record checkpointed (a record's SCN is its offset here: no Debezium source position).
    consumers.wait_status(unique, lambda s: s.get("windowScn") == 5, timeout=60, what="every record checkpointed")
    again = consumer_pod(kube, namespace, unique)
    assert again is not None and again.metadata.uid == pod.metadata.uid
    assert again.status.container_statuses[0].restart_count == 0


def test_an_undecodable_record_stops_a_pod_without_a_crash_loop_and_skip_goes_past_it(
    consumers: Resources, kube: ApiClient, namespace: str, unique: str, stack_info: StackInfo
) -> None:
    """The default policy (fail) stops on the record with a condition naming it, and the pod waits instead of
    being restarted into the same record; changing the policy to skip replaces the pod, which goes on."""
    from confluent_kafka import Producer

    admin = AdminClient({"bootstrap.servers": stack_info.kafka_bootstrap})  # held: its futures die with it
    admin.create_topics([NewTopic(unique, 1, 1)])[unique].result(30)
    producer = Producer({"bootstrap.servers": stack_info.kafka_bootstrap})
    for key, value in ((b"1", b'{"id": 1}'), (b"2", b"\xffnot json"), (b"3", b'{"id": 3}')):
        producer.produce(unique, key=key, value=value)
    assert producer.flush(30) == 0
    consumers.create(unique, {"sources": [unique], "sink": {"type": "log"}, "startPosition": "earliest"})
    cond = consumers.wait_condition(unique, "False", "UndecodableRecord", timeout=180)
    assert f"{unique}/0 offset 1" in cond["message"] and "waits to be replaced" in cond["message"], cond
    time.sleep(15)  # a restart would have come by now (the kubelet's first backoff is 10 s)
    pod = consumer_pod(kube, namespace, unique)
    assert pod is not None and pod.status.container_statuses[0].restart_count == 0
    consumers.patch(unique, {"spec": {"onUndecodable": {"action": "skip"}}})
    consumers.wait_status(
        unique, lambda s: (s.get("undecodable") or {}).get("skipped") == 1, timeout=180, what="the record skipped"
    )
    consumers.wait_condition(unique, "True", "Consuming", timeout=60)


def test_start_from_a_time_at_creation_through_a_seek_and_never_before_what_kafka_keeps(
    consumers: Resources, namespace: str, unique: str, stack_info: StackInfo
) -> None:
    """Records on both sides of T (their timestamps set by the producer). Created with startFrom {timestamp: T},
    a consumer takes exactly those at or after T; a seek to a time before all of them takes them all again
    (its checkpoints dropped, the new position resolved by the instance). Once Kafka no longer keeps the
    first records, a time before them is refused (StartBeforeRetention) rather than moved up unseen."""
    from confluent_kafka import Producer

    from fibers.startfrom import format_time

    admin = AdminClient({"bootstrap.servers": stack_info.kafka_bootstrap})  # held: its futures die with it
    admin.create_topics([NewTopic(unique, 1, 1)])[unique].result(30)
    t = int(time.time() * 1000) - 60_000
    producer = Producer({"bootstrap.servers": stack_info.kafka_bootstrap})
    stamps = [t - 30_000 + i for i in range(4)] + [t + 1_000 * i for i in range(6)]  # 4 before T, 6 at or after
    for i, stamp in enumerate(stamps):
        producer.produce(unique, key=str(i).encode(), value=json.dumps({"id": i}).encode(), timestamp=stamp)
    assert producer.flush(30) == 0

    name = f"{unique}-t"
    consumers.create(name, {"sources": [unique], "sink": {"type": "log"}, "startFrom": {"timestamp": format_time(t)}})
    done = consumers.wait_status(name, lambda s: s.get("windowScn") == 9, timeout=180, what="the records from T")
    assert done["eventsProcessed"] == 6, done

    consumers.patch(name, {"spec": {"seek": {"nonce": "1", "startFrom": {"timestamp": format_time(t - 60_000)}}}})
    again = consumers.wait_status(
        name,
        lambda s: s.get("lastSeekNonce") == "1" and s.get("windowScn") == 9 and s.get("eventsProcessed") == 10,
        timeout=180,
        what="every record again after the seek",
    )
    assert again["eventsProcessed"] == 10, again

    [deleted] = admin.delete_records([TopicPartition(unique, 0, 2)]).values()
    deleted.result(30)  # Kafka keeps offsets from 2 now
    late, before = f"{unique}-r", format_time(t - 60_000)
    consumers.create(late, {"sources": [unique], "sink": {"type": "log"}, "startFrom": {"timestamp": before}})
    cond = consumers.wait_condition(late, "False", "StartBeforeRetention", timeout=180)
    assert f"spec.startFrom.timestamp {before}" in cond["message"] and "offsets from 2" in cond["message"], cond


def test_a_seek_told_to_reapply_puts_right_a_view_changed_since_and_never_applies_an_older_change(
    consumers: Resources, mongo: MongoClient[dict[str, Any]], mongo_secret: str, unique: str, stack_info: StackInfo
) -> None:
    """The view as a buggy callback or a hand edit left it (a document changed, its SCN kept): a seek back to
    the start with sinks: reapply writes each key's latest change again, so the view equals the stream's
    last state; the older change of key 1 is never written over the newer one."""
    admin = AdminClient({"bootstrap.servers": stack_info.kafka_bootstrap})  # held: its futures die with it
    admin.create_topics([NewTopic(unique, 1, 1)])[unique].result(30)
    produce(stack_info.kafka_bootstrap, unique, [{"id": 1, "v": 1}, {"id": 2, "v": 1}, {"id": 1, "v": 2}], key="id")
    spec = {
        "sources": [unique],
        "sink": mongo_sink(mongo_secret, unique, "view"),
        "startFrom": {"position": "earliest"},
    }
    consumers.create(unique, spec)
    consumers.wait_status(unique, lambda s: s.get("windowScn") == 2, timeout=180, what="every record applied")
    view = mongo[unique]["view"]
    assert {d["_id"]: d["v"] for d in view.find()} == {"1": 2, "2": 1}
    view.update_one({"_id": "1"}, {"$set": {"v": 99}})  # changed since; its _scn (2) kept
    view.update_one({"_id": "2"}, {"$set": {"v": 98}})

    seek = {"nonce": "1", "startFrom": {"position": "earliest"}, "sinks": "reapply"}
    consumers.patch(unique, {"spec": {"seek": seek}})
    consumers.wait_status(
        unique,
        lambda s: s.get("lastSeekNonce") == "1" and s.get("windowScn") == 2 and s.get("eventsProcessed") == 3,
        timeout=180,
        what="the replay applied",
    )
    assert {d["_id"]: (d["v"], d["_scn"]) for d in view.find()} == {"1": (2, 2), "2": (1, 1)}


def test_a_rotated_mongodb_uri_replaces_the_instances_one_at_a_time_and_loses_nothing(
    kube: ApiClient, namespace: str, consumers: Resources, cdc: dict[str, Any], stack_info: StackInfo, unique: str
) -> None:
    """The Secret with the sink's URI changes (the same server, another appName) while the table takes
    writes: the operator sees it (a watch of Secrets' metadata), the StatefulSet replaces its pods one at a
    time to take the new value (pods read it at start only), an Event names the Secret, and the view still
    equals the table. Without the watch the pods would run on the old value until something else restarted them."""
    core = client.CoreV1Api(kube)
    uri = stack_info.mongodb_uri
    secret = client.V1Secret(metadata=client.V1ObjectMeta(name=unique), string_data={"uri": uri})
    core.create_namespaced_secret(namespace, secret)
    mongo: MongoClient[dict[str, Any]] = MongoClient(uri)
    consumers.create(unique, {"sources": [cdc["topic"]], "instances": 2, "sink": mongo_sink(unique, unique, "orders")})

    seen: list[str] = []  # what Ready said on the way, shown if it never gets there

    def both_ready(s: dict[str, Any]) -> bool:
        ready = conditions.find(s.get("conditions"), "Ready") or {}
        said = f"{s.get('readyInstances')} ready: {ready.get('reason')}: {ready.get('message')}"
        if not seen or seen[-1] != said:
            seen.append(said)
            print(f"{time.strftime('%T')} {said}")
        return s.get("readyInstances") == 2

    consumers.wait_status(unique, both_ready, timeout=180, what="two instances ready")

    def pods() -> dict[str, str]:
        found = core.list_namespaced_pod(namespace, label_selector=f"{LABEL_CONSUMER}={unique}").items
        return {p.metadata.name: p.metadata.uid for p in found if p.metadata.deletion_timestamp is None}

    before = pods()
    rotated = f"{uri}{'&' if '?' in uri else '?'}appName=rotated"
    core.patch_namespaced_secret(unique, namespace, {"stringData": {"uri": rotated}})
    with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
        mutate(pg, cdc["table"], 10, random.Random(77), start_id=7000)
        event = consumers.wait_event(unique, "SecretChanged", timeout=30)
        assert f"Secret {unique} changed" in event["message"] and "appName" not in event["message"]
        mutate(pg, cdc["table"], 10, random.Random(78), start_id=7100)
        expected = table_rows(pg, cdc["table"])

    def replaced() -> bool:
        now = pods()
        return len(now) == 2 and not set(now.values()) & set(before.values())

    wait_for(replaced, timeout=180, what="both instances replaced")
    consumers.wait_status(unique, both_ready, timeout=180, what="two instances ready again")
    wait_for(lambda: view_rows(mongo, unique, "orders") == expected, timeout=120, what="the view equals the table")
    sts = client.AppsV1Api(kube).read_namespaced_stateful_set(unique, namespace)
    assert sts.spec.update_strategy.type == "RollingUpdate"  # one pod at a time
    assert rotated not in json.dumps(kube.sanitize_for_serialization(sts))  # a digest, never the value
