"""One piece of real work per local-stack component."""

from __future__ import annotations

import json
import os
import ssl
import struct
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg
import pytest
from kubernetes import client as k8s
from kubernetes import config
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from pymongo import MongoClient

from fibers_stack import StackInfo, audit, fetch, images, node
from tests.helpers import avro_converter, drop_slot, read_topic, wait_for

# What buildah pushes (Docker's schema 2) and what an OCI client would: a registry answers a HEAD by either.
MANIFEST_TYPES = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"

pytestmark = pytest.mark.smoke

SMOKE_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.smoke.fibers.dev"},
    "spec": {
        "group": "smoke.fibers.dev",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                        },
                    }
                },
            }
        ],
    },
}


def test_kubernetes_configmap_crd_and_garbage_collection(kube: ApiClient, unique: str) -> None:
    core = k8s.CoreV1Api(kube)
    core.create_namespaced_config_map(
        "default", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=unique), data={"hello": "world"})
    )
    assert core.read_namespaced_config_map(unique, "default").data == {"hello": "world"}

    ext = k8s.ApiextensionsV1Api(kube)
    try:
        ext.create_custom_resource_definition(SMOKE_CRD)
    except ApiException as exc:
        if exc.status != 409:  # a reused stack already has it
            raise
    wait_for(
        lambda: any(
            c.type == "Established" and c.status == "True"
            for c in ext.read_custom_resource_definition("widgets.smoke.fibers.dev").status.conditions or []
        ),
        timeout=30,
        what="CRD established",
    )
    custom = k8s.CustomObjectsApi(kube)
    body = {
        "apiVersion": "smoke.fibers.dev/v1",
        "kind": "Widget",
        "metadata": {"name": unique},
        "spec": {"size": 3},
    }
    wait_for(lambda: _create_when_served(custom, body), timeout=30, what="Widget created")
    assert custom.get_namespaced_custom_object("smoke.fibers.dev", "v1", "default", "widgets", unique)["spec"] == {
        "size": 3
    }

    owner = core.read_namespaced_config_map(unique, "default")
    dependent = k8s.V1ConfigMap(
        metadata=k8s.V1ObjectMeta(
            name=f"{unique}-dep",
            owner_references=[
                k8s.V1OwnerReference(api_version="v1", kind="ConfigMap", name=unique, uid=owner.metadata.uid)
            ],
        )
    )
    core.create_namespaced_config_map("default", dependent)
    core.delete_namespaced_config_map(unique, "default", propagation_policy="Background")
    wait_for(
        lambda: not _exists(lambda: core.read_namespaced_config_map(f"{unique}-dep", "default")),
        timeout=60,
        what="dependent garbage-collected",
    )


def test_the_api_server_counts_a_clients_requests_in_its_audit_log(stack_info: StackInfo, unique: str) -> None:
    """What the scale benchmark counts the operator's requests with: the API server's own record, by agent."""
    since = datetime.now(UTC)
    with config.new_client_from_config(config_file=stack_info.kubeconfig) as api:
        api.user_agent = f"audit-smoke/{unique}"
        core = k8s.CoreV1Api(api)
        core.create_namespaced_config_map("default", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=unique)))
        for _ in range(3):
            core.read_namespaced_config_map(unique, "default")
        core.delete_namespaced_config_map(unique, "default")

    def counted() -> dict[str, int] | None:
        found = audit.requests(Path(stack_info.audit_log), since, datetime.now(UTC), agents=(f"audit-smoke/{unique}",))
        calls = dict(audit.by_call(found))
        return calls if sum(calls.values()) == 5 else None

    calls = wait_for(counted, timeout=30, what="five requests in the audit log")
    assert calls == {"create configmaps": 1, "get configmaps": 3, "delete configmaps": 1}


def _create_when_served(custom: k8s.CustomObjectsApi, body: dict[str, object]) -> bool:
    try:
        custom.create_namespaced_custom_object("smoke.fibers.dev", "v1", "default", "widgets", body)
    except ApiException as exc:
        if exc.status == 404:  # discovery not refreshed yet
            return False
        raise
    return True


def _exists(read: object) -> bool:
    try:
        read()  # type: ignore[operator]
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _connector_running(connect_http: httpx.Client, name: str) -> bool:
    response = connect_http.get(f"/connectors/{name}/status")
    if response.status_code != 200:
        return False
    status = response.json()
    return status["connector"]["state"] == "RUNNING" and any(t["state"] == "RUNNING" for t in status["tasks"])


def test_filestream_source_connector(
    stack_info: StackInfo, connect_http: httpx.Client, tmp_path: Path, unique: str
) -> None:
    lines = [f"line {i} of {unique}" for i in range(5)]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n")
    response = connect_http.post(
        "/connectors",
        json={
            "name": unique,
            "config": {
                "connector.class": "FileStreamSource",
                "tasks.max": "1",
                "file": str(source),
                "topic": unique,
            },
        },
    )
    assert response.status_code == 201, response.text
    try:
        wait_for(lambda: _connector_running(connect_http, unique), timeout=60, what="connector RUNNING")
        values = read_topic(stack_info.kafka_bootstrap, unique, len(lines))
        assert [json.loads(v) for v in values] == lines
    finally:
        connect_http.delete(f"/connectors/{unique}")


def test_debezium_postgres_change_event(
    stack_info: StackInfo, connect_http: httpx.Client, pg: psycopg.Connection[tuple[object, ...]], unique: str
) -> None:
    pg.execute(f"CREATE TABLE {unique} (id int PRIMARY KEY, name text)")
    dsn = psycopg.conninfo.conninfo_to_dict(stack_info.postgres_dsn)
    response = connect_http.post(
        "/connectors",
        json={
            "name": unique,
            "config": {
                "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
                "tasks.max": "1",
                "plugin.name": "pgoutput",
                "database.hostname": dsn["host"],
                "database.port": str(dsn["port"]),
                "database.user": "postgres",
                "database.password": "unused",
                "database.dbname": "postgres",
                "topic.prefix": unique,
                "table.include.list": f"public.{unique}",
                "slot.name": unique,
                "publication.name": unique,
                "publication.autocreate.mode": "filtered",
                "snapshot.mode": "no_data",
            },
        },
    )
    assert response.status_code == 201, response.text
    try:
        wait_for(lambda: _connector_running(connect_http, unique), timeout=90, what="Debezium RUNNING")
        wait_for(
            lambda: (
                pg.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (unique,)).fetchone()
                == (True,)
            ),
            timeout=60,
            what="replication slot active",
        )
        pg.execute(f"INSERT INTO {unique} VALUES (1, 'ada')")
        [value] = read_topic(stack_info.kafka_bootstrap, f"{unique}.public.{unique}", 1, timeout=90)
        event = json.loads(value)
        assert event["op"] == "c"
        assert event["after"] == {"id": 1, "name": "ada"}
        assert int(event["source"]["lsn"]) > 0
    finally:
        connect_http.delete(f"/connectors/{unique}")
        drop_slot(stack_info.postgres_dsn, unique)


def test_apicurio_registers_and_looks_up_a_schema_through_the_confluent_api(stack_info: StackInfo, unique: str) -> None:
    schema = json.dumps({"type": "record", "name": "Row", "fields": [{"name": "id", "type": "int"}]})
    with httpx.Client(base_url=stack_info.env()["FIBERS_SCHEMA_REGISTRY_URL"], timeout=10) as registry:
        registered = registry.post(f"/subjects/{unique}-value/versions", json={"schema": schema})
        assert registered.status_code == 200, registered.text
        schema_id = registered.json()["id"]
        found = registry.post(f"/subjects/{unique}-value", json={"schema": schema}).json()
        assert (found["id"], found["subject"], found["version"]) == (schema_id, f"{unique}-value", 1)
        assert registry.get(f"/schemas/ids/{schema_id}").json()["schema"] == schema
        assert unique + "-value" in registry.get("/subjects").json()


def test_apicurio_avro_converter_writes_confluent_framed_records(
    stack_info: StackInfo, connect_http: httpx.Client, tmp_path: Path, unique: str
) -> None:
    """Connect's Apicurio converter, set up Confluent-style: magic byte 0, then the ccompat API's 4-byte id."""
    source = tmp_path / "in.txt"
    source.write_text("hello\n")
    response = connect_http.post(
        "/connectors",
        json={
            "name": unique,
            "config": {
                "connector.class": "FileStreamSource",
                "tasks.max": "1",
                "file": str(source),
                "topic": unique,
                **avro_converter(stack_info.registry_url),
            },
        },
    )
    assert response.status_code == 201, response.text
    try:
        wait_for(lambda: _connector_running(connect_http, unique), timeout=60, what="connector RUNNING")
        [value] = read_topic(stack_info.kafka_bootstrap, unique, 1)
        latest = httpx.get(f"{stack_info.env()['FIBERS_SCHEMA_REGISTRY_URL']}/subjects/{unique}-value/versions/latest")
        assert value[0] == 0 and struct.unpack(">I", value[1:5])[0] == latest.json()["id"]
        assert value[5:] == b"\x0ahello"  # Avro: a string of length 5 (zig-zag 10), then its bytes
    finally:
        connect_http.delete(f"/connectors/{unique}")


def test_ferretdb_insert_upsert_find(mongo: MongoClient[dict[str, object]], unique: str) -> None:
    people = mongo["smoke"][unique]
    people.insert_one({"_id": 1, "name": "ada", "langs": ["en"]})
    people.update_one({"_id": 2}, {"$set": {"name": "grace"}}, upsert=True)
    people.update_one({"_id": 1}, {"$set": {"name": "ada lovelace"}}, upsert=True)
    assert list(people.find({}, sort=[("_id", 1)])) == [
        {"_id": 1, "name": "ada lovelace", "langs": ["en"]},
        {"_id": 2, "name": "grace"},
    ]


def test_spark_reads_one_topic_and_writes_another(stack_info: StackInfo, unique: str) -> None:
    from confluent_kafka import Producer

    from fibers.spark import session

    producer = Producer({"bootstrap.servers": stack_info.kafka_bootstrap})
    for i in range(10):
        producer.produce(f"{unique}-in", key=str(i).encode(), value=f"word{i}".encode())
    assert producer.flush(30) == 0

    spark = session("fibers-smoke", jars_dir=Path(stack_info.spark_kafka_jars))
    try:
        source = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", stack_info.kafka_bootstrap)
            .option("subscribe", f"{unique}-in")
            .load()
        )
        upper = source.selectExpr("key", "upper(CAST(value AS STRING)) AS value")
        (
            upper.write.format("kafka")
            .option("kafka.bootstrap.servers", stack_info.kafka_bootstrap)
            .option("topic", f"{unique}-out")
            .save()
        )
    finally:
        spark.stop()
    values = read_topic(stack_info.kafka_bootstrap, f"{unique}-out", 10)
    assert sorted(v.decode() for v in values) == sorted(f"WORD{i}" for i in range(10))


# ----- the node --------------------------------------------------------------------------------------


def test_the_node_is_ready_and_runs_the_system_pods(kube: ApiClient) -> None:
    [node] = k8s.CoreV1Api(kube).list_node().items
    conditions = {c.type: c.status for c in node.status.conditions}
    assert conditions["Ready"] == "True" and not node.spec.taints
    assert node.status.node_info.kubelet_version.startswith("v1.")
    assert node.status.node_info.container_runtime_version.startswith("containerd://")
    pods = k8s.CoreV1Api(kube).list_pod_for_all_namespaces().items
    running = {
        p.metadata.namespace
        + "/"
        + p.metadata.labels.get("app.kubernetes.io/component", p.metadata.labels.get("k8s-app", ""))
        for p in pods
        if p.status.phase == "Running"
    }
    assert {"kube-system/kube-dns", "spark-operator/controller", "spark-operator/webhook"} <= running, running


def test_a_pod_resolves_cluster_names_reaches_the_api_and_nothing_outside(
    kube: ApiClient, stack_info: StackInfo, unique: str
) -> None:
    """From inside a pod of the job image: DNS (cluster names only: nothing outside resolves), the API
    through the `kubernetes` Service with the pod's own token, and the stack's servers on the node IP."""
    host, port = stack_info.kafka_bootstrap.split(":")
    script = (
        "import json, socket, ssl, urllib.request\n"
        "out = {'api': socket.gethostbyname('kubernetes.default.svc.cluster.local')}\n"
        "try:\n    socket.gethostbyname('example.com'); out['external'] = 'resolved'\n"
        "except OSError:\n    out['external'] = 'no such name'\n"
        "token = open('/var/run/secrets/kubernetes.io/serviceaccount/token').read()\n"
        "ctx = ssl.create_default_context(cafile='/var/run/secrets/kubernetes.io/serviceaccount/ca.crt')\n"
        "req = urllib.request.Request('https://kubernetes.default.svc/version',\n"
        "                             headers={'Authorization': 'Bearer ' + token})\n"
        "out['version'] = json.load(urllib.request.urlopen(req, context=ctx, timeout=10))['gitVersion']\n"
        f"socket.create_connection(('{host}', {port}), 5).close()\n"
        "out['kafka'] = 'reached'\n"
        "print(json.dumps(out))\n"
    )
    core = k8s.CoreV1Api(kube)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": unique},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "probe",
                    "image": stack_info.images["job"],
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c", script],
                }
            ],
        },
    }
    core.create_namespaced_pod("default", pod)
    try:
        wait_for(
            lambda: core.read_namespaced_pod(unique, "default").status.phase in ("Succeeded", "Failed"),
            timeout=120,
            what="the probe pod to finish",
        )
        log = core.read_namespaced_pod_log(unique, "default")
        assert core.read_namespaced_pod(unique, "default").status.phase == "Succeeded", log
        result = json.loads(log.strip().splitlines()[-1])
        assert result == {"api": "10.0.0.1", "external": "no such name", "version": "v1.35.4", "kafka": "reached"}
    finally:
        core.delete_namespaced_pod(unique, "default", grace_period_seconds=0)


def test_the_node_runs_the_images_of_the_code_as_it_is(stack_info: StackInfo) -> None:
    """A reused stack (`FIBERS_STACK_REUSE=1`, or one left running) takes the images of the current code: pods
    of a stack started before an edit ran the old code, and images built FROM the job image failed."""
    built = images.build_all().refs()
    assert stack_info.built == built
    for role, ref in stack_info.images.items():
        host, name, tag, digest = images.parse(ref)
        assert (host, name, tag) == (stack_info.image_registry, *images.parse(built[role])[1:3]), ref
        # The registry serves exactly that digest under the build's tag.
        manifest = httpx.head(
            f"https://{host}/v2/{name}/manifests/{tag}",
            headers={"Accept": MANIFEST_TYPES},
            verify=ssl.create_default_context(cafile=stack_info.image_registry_ca),
            timeout=10,
        )
        assert manifest.status_code == 200 and manifest.headers["Docker-Content-Digest"] == digest, ref


def test_every_pod_pulls_its_image_from_the_registry_by_digest(stack_info: StackInfo, kube: ApiClient) -> None:
    """As on a real cluster: no image is put on the node by hand and none is run unpulled (`Never`)."""
    pods = k8s.CoreV1Api(kube).list_pod_for_all_namespaces().items
    containers = [(p, c) for p in pods for c in [*p.spec.containers, *(p.spec.init_containers or [])]]
    assert containers
    for pod, container in containers:
        where = f"{pod.metadata.namespace}/{pod.metadata.name} {container.name}"
        assert container.image.startswith(stack_info.image_registry + "/") and "@sha256:" in container.image, where
        assert container.image_pull_policy == "IfNotPresent", where
    listed = node.ctr(Path(stack_info.run_dir), "images", "ls", "-q").stdout.split()
    assert not [ref for ref in listed if ref.startswith("localhost/")]  # nothing imported by hand


@pytest.mark.parametrize(
    ("field", "words"),
    [
        ("connectclusters.spec.namespaceSelector.matchExpressions", "label requirement"),
        ("connects.status.tasks", "One task of the connector"),
        ("databusconsumers.spec.sourceRefs.connectRef.name", "Name of a Connect in this namespace"),
        ("transforms.spec.inputs", "One input, a view the SQL reads"),
        ("schemas.spec.references", "One schema this one references"),
        ("schemaregistries.spec.auth.bearer.secretRef", "The Secret holding the token"),
        ("replays.spec.sinks", "reapply"),
    ],
)
def test_kubectl_explain_describes_the_fields_of_each_kind(
    stack_info: StackInfo, crds: None, field: str, words: str
) -> None:
    """What a user reads first about a field, from the API server's published schema (list items and
    nested references included: they had no description)."""
    explained = subprocess.run(
        [str(fetch.kubernetes() / "kubectl"), "explain", field, "--api-version", "fibers.dev/v1beta1"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **stack_info.env()},
    ).stdout
    assert words in explained, explained
    assert "<empty>" not in explained.split("FIELDS:")[0], explained
