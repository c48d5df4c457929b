"""Secret values reach the systems that need them and nowhere anyone else reads, on the real stack.

Guards every value Fibers takes from a Secret — MongoDB URIs with credentials (for Transforms and for
a DatabusConsumer's sink and bootstrap store), one pointing at a closed port, a bare password put where
a URI belongs (pymongo then names it in its errors), and Connect secretConfig values — across Connect,
Transform and DatabusConsumer: none may appear in the resources (status included), Events, the
operator's log, any pod's log or termination message, ConfigMaps, Leases, SparkApplications, pod and
StatefulSet specs (whose environment takes secrets by secretKeyRef only), or the OpenLineage topic. Where an error
that carried one is shown, the value is replaced by *** and the text around it is kept.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from pymongo import MongoClient

from fibers_stack import StackInfo
from tests.helpers import Resources, produce, read_all, wait_for
from tests.integration.conftest import OperatorProcess

SPARK_APPS = ("sparkoperator.k8s.io", "v1beta2", "sparkapplications")
KEEP_EXECUTORS = {"spark.kubernetes.executor.deleteOnTermination": "false"}  # their logs are read too
URI_ENV = re.compile(r"^FIBERS_\w*_URI$")  # the variables that carry MongoDB URIs into pods


# ----- the secrets -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Secrets:
    """The module's Secrets (key `uri`, or `file`/`password` for Connect) and every value that must not surface."""

    token: str
    mongo_address: str  # host:port of the stack's FerretDB
    uris: dict[str, str]  # Secret name → its `uri`
    connect_file: str
    connect_password: str

    @property
    def values(self) -> list[str]:
        """Whole values, and the parts of them that are secret on their own (passwords, query tokens)."""
        parts = [p for uri in self.uris.values() for p in (urlsplit(uri).password, _query_token(uri)) if p]
        return [*self.uris.values(), *parts, self.connect_file, self.connect_password, f"c0nn3ct-{self.token}"]


def _query_token(uri: str) -> str | None:
    """appName=… of a URI: a query parameter can be a secret too (tlsCertificateKeyFilePassword, AWS tokens)."""
    found = re.search(r"appName=([^&]+)", uri)
    return found.group(1) if found else None


def _credentials_uri(user: str, password: str, address: str, app: str) -> str:
    # FerretDB (v1, SQLite) takes any user and password over PLAIN; its default SCRAM is not supported.
    return f"mongodb://{user}:{password}@{address}/?authMechanism=PLAIN&appName={app}"


@pytest.fixture(scope="module")
def secrets(
    kube: ApiClient, namespace: str, stack_info: StackInfo, tmp_path_factory: pytest.TempPathFactory
) -> Secrets:
    token = "k" + uuid.uuid4().hex[:8]
    address = urlsplit(stack_info.mongodb_uri).netloc
    uris = {
        "mongo-spark": _credentials_uri(f"spark-{token}", f"sp4rk-pw-{token}", address, f"sp4rk-app-{token}"),
        "mongo-sink": _credentials_uri(f"sink-{token}", f"s1nk-pw-{token}", address, f"s1nk-app-{token}"),
        "mongo-store": _credentials_uri(f"store-{token}", f"st0re-pw-{token}", address, f"st0re-app-{token}"),
        # Nothing listens on port 1: whatever uses it fails.
        "mongo-closed": _credentials_uri(f"closed-{token}", f"hunter2-{token}", "127.0.0.1:1", f"cl0sed-app-{token}"),
        # The key of a credentials Secret given where the URI was meant: pymongo takes it for a host name
        # and names it in its errors ("hunter3-…:27017: Name or service not known").
        "mongo-wrongkey": f"hunter3-{token}",
    }
    base = tmp_path_factory.mktemp("connect")
    os.chmod(base, 0o755)
    connect_file = str(base / f"c0nn3ct-{token}" / "out.txt")  # under a missing directory: the task fails on it
    core = client.CoreV1Api(kube)
    for name, uri in uris.items():
        core.create_namespaced_secret(
            namespace, client.V1Secret(metadata=client.V1ObjectMeta(name=name), string_data={"uri": uri})
        )
    connect_password = f"c0nn3ct-pw-{token}"
    core.create_namespaced_secret(
        namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="connect"),
            string_data={"file": connect_file, "password": connect_password},
        ),
    )
    return Secrets(token, address, uris, connect_file, connect_password)


def uri_ref(secret: str) -> dict[str, str]:
    return {"name": secret, "key": "uri"}


def events_about(resources: Resources, name: str) -> list[client.CoreV1Event]:
    selector = f"involvedObject.name={name}"
    return list(resources.core.list_namespaced_event(resources.namespace, field_selector=selector).items)


# ----- where they could surface ------------------------------------------------------------------


@pytest.fixture(scope="module")
def operator_env(lineage_topic: str) -> dict[str, str]:
    """Lineage on: the events name MongoDB datasets, and a FAIL event carries the error."""
    return {"FIBERS_LINEAGE_TOPIC": lineage_topic}


@dataclass(frozen=True)
class Surfaces:
    """Everything in the namespace a user, a log collector or a lineage consumer reads."""

    kube: ApiClient
    namespace: str
    operator: OperatorProcess
    kafka_bootstrap: str
    lineage_topic: str

    def gather(self) -> tuple[dict[str, str], list[dict[str, Any]]]:
        """The text of every place, by place; and the pod specs (pods, and workloads' pod templates)."""
        core, apps = client.CoreV1Api(self.kube), client.AppsV1Api(self.kube)
        custom = client.CustomObjectsApi(self.kube)
        ns, as_dict = self.namespace, self.kube.sanitize_for_serialization
        places: dict[str, str] = {"operator log": self.operator.log()}
        for plural in ("connects", "transforms", "databusconsumers"):
            for item in custom.list_namespaced_custom_object("fibers.dev", "v1beta1", ns, plural)["items"]:
                places[f"{plural}/{item['metadata']['name']}"] = json.dumps(item)
        for i, event in enumerate(core.list_namespaced_event(ns).items):
            about = f"{event.involved_object.kind}/{event.involved_object.name}"
            places[f"event {i} about {about}"] = f"{event.reason}: {event.message}"
        for cm in core.list_namespaced_config_map(ns).items:
            places[f"configmaps/{cm.metadata.name}"] = json.dumps(as_dict(cm))
        for lease in client.CoordinationV1Api(self.kube).list_namespaced_lease(ns).items:  # consumers' partitions
            places[f"leases/{lease.metadata.name}"] = json.dumps(as_dict(lease))
        for app in custom.list_namespaced_custom_object(*SPARK_APPS[:2], ns, SPARK_APPS[2])["items"]:
            places[f"sparkapplications/{app['metadata']['name']}"] = json.dumps(app)
        templates: list[dict[str, Any]] = []
        for kind, items in (
            ("statefulsets", apps.list_namespaced_stateful_set(ns).items),
            ("deployments", apps.list_namespaced_deployment(ns).items),
            ("replicasets", apps.list_namespaced_replica_set(ns).items),
        ):
            for obj in items:
                body = as_dict(obj)
                places[f"{kind}/{obj.metadata.name}"] = json.dumps(body)
                templates.append({"where": f"{kind}/{obj.metadata.name}", **body["spec"]["template"]["spec"]})
        for pod in core.list_namespaced_pod(ns).items:
            name, body = pod.metadata.name, as_dict(pod)
            places[f"pods/{name}"] = json.dumps(body)
            templates.append({"where": f"pods/{name}", **body["spec"]})
            status = pod.status
            for cs in [*(status.init_container_statuses or []), *(status.container_statuses or [])]:
                for when, state in (("", cs.state), ("last ", cs.last_state)):
                    if state and state.terminated and state.terminated.message:
                        places[f"{when}termination message {name}/{cs.name}"] = state.terminated.message
                places[f"log {name}/{cs.name}"] = self._log(core, name, cs.name, previous=False)
                if cs.restart_count:
                    places[f"previous log {name}/{cs.name}"] = self._log(core, name, cs.name, previous=True)
        places["lineage topic"] = "\n".join(self.lineage_events())
        return places, templates

    def _log(self, core: client.CoreV1Api, pod: str, container: str, *, previous: bool) -> str:
        try:
            return str(core.read_namespaced_pod_log(pod, self.namespace, container=container, previous=previous))
        except ApiException as exc:  # a container that has not started (yet), or no longer has that log
            if exc.status in (400, 404):
                return ""
            raise

    def lineage_events(self) -> list[str]:
        """Every record on the lineage topic so far, as text."""
        return [value.decode(errors="replace") for value in read_all(self.kafka_bootstrap, self.lineage_topic)]

    def lineage(self, job: str) -> list[dict[str, Any]]:
        """The lineage events of one job (<namespace>.<kind>.<name>), in order."""
        events = [json.loads(text) for text in self.lineage_events()]
        return [e for e in events if e.get("job", {}).get("name") == f"{self.namespace}.{job}"]


@pytest.fixture(scope="module")
def surfaces(
    kube: ApiClient, namespace: str, operator: OperatorProcess, stack_info: StackInfo, lineage_topic: str
) -> Surfaces:
    return Surfaces(kube, namespace, operator, stack_info.kafka_bootstrap, lineage_topic)


def assert_nowhere(secret_values: list[str], surfaces: Surfaces) -> dict[str, str]:
    """No secret value in any place; pods get URIs only by secretKeyRef. Returns the places, for the
    caller to check that what it ran was looked at."""
    places, pod_specs = surfaces.gather()
    leaks = [
        f"{value!r} in {place}: …{text[max(at - 120, 0) : at + len(value) + 120]}…"
        for place, text in places.items()
        for value in secret_values
        if (at := text.find(value)) >= 0
    ]
    for spec in pod_specs:
        for container in [*(spec.get("initContainers") or []), *spec["containers"]]:
            for env in container.get("env") or []:
                where = f"{spec['where']} container {container['name']} env {env['name']}"
                if URI_ENV.match(env["name"]) and not ((env.get("valueFrom") or {}).get("secretKeyRef")):
                    leaks.append(f"{where} is not a secretKeyRef: {env}")
                if "value" in env and any(value in str(env["value"]) for value in secret_values):
                    leaks.append(f"{where} has a secret value")
    assert not leaks, "secret values surfaced:\n" + "\n".join(leaks)
    return places


# ----- Connect ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def connects(kube: ApiClient, namespace: str, operator: OperatorProcess) -> Resources:
    return Resources(kube, "connects", namespace)


def live_config(connect_http: httpx.Client, connector: str) -> dict[str, str]:
    response = wait_for(
        lambda: (r := connect_http.get(f"/connectors/{connector}/config")).status_code == 200 and r,
        timeout=30,
        what=f"the live config of {connector}",
    )
    return dict(response.json())


@pytest.mark.connect
def test_connect_secret_config_reaches_the_connector_and_its_failure_is_shown_masked(
    connects: Resources, connect_http: httpx.Client, secrets: Secrets, surfaces: Surfaces
) -> None:
    name = f"{secrets.token}-sink"
    connects.create(
        name,
        {
            "class": "FileStreamSink",
            "config": {"topics": name},
            "secretConfig": {
                "file": {"secretKeyRef": {"name": "connect", "key": "file"}},
                "fibers.test.password": {"secretKeyRef": {"name": "connect", "key": "password"}},
            },
            "autoRestart": {"enabled": False},
        },
    )
    cond = connects.wait_condition(name, "False", "TasksFailed", timeout=90)
    live = live_config(connect_http, name)
    assert (live["file"], live["fibers.test.password"]) == (secrets.connect_file, secrets.connect_password)

    # The task's trace named the file; it is masked as a whole, and the trace around it is Connect's own.
    trace = connects.status(name)["tasks"][0]["trace"]
    assert "ConnectException: Couldn't find or create file '***' for FileStreamSinkTask" in trace, trace
    assert "\tat org.apache.kafka.connect." in trace
    assert cond["message"].startswith("task 0 FAILED on "), cond
    assert "ConnectException: Couldn't find or create file '***' for FileStreamSinkTask" in cond["message"]
    wait_for(lambda: any(e.reason == "TasksFailed" for e in events_about(connects, name)), timeout=30, what="an event")
    places = assert_nowhere(secrets.values, surfaces)
    assert f"connects/{name}" in places


# ----- Transform -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def transforms(kube: ApiClient, namespace: str, operator: OperatorProcess) -> Resources:
    return Resources(kube, "transforms", namespace)


def spark_pods(kube: ApiClient, namespace: str, run: str) -> dict[str, client.V1Pod]:
    pods = client.CoreV1Api(kube).list_namespaced_pod(namespace, label_selector=f"sparkoperator.k8s.io/app-name={run}")
    return {p.metadata.labels["spark-role"]: p for p in pods.items}


def uri_env_refs(pod: client.V1Pod) -> dict[str, tuple[str, str]]:
    """The URI variables of a Spark pod's container: name → (Secret, key)."""
    return {
        e.name: (e.value_from.secret_key_ref.name, e.value_from.secret_key_ref.key)
        for e in pod.spec.containers[0].env or []
        if URI_ENV.match(e.name) and e.value_from and e.value_from.secret_key_ref
    }


@pytest.mark.transform
def test_transform_reads_and_writes_mongodb_by_reference_and_its_failure_is_shown_masked(
    transforms: Resources,
    kube: ApiClient,
    namespace: str,
    stack_info: StackInfo,
    secrets: Secrets,
    surfaces: Surfaces,
) -> None:
    ok, bad = f"{secrets.token}-ok", f"{secrets.token}-bad"
    db = f"{secrets.token}spark"
    spark_mongo: MongoClient[dict[str, Any]] = MongoClient(secrets.uris["mongo-spark"])
    spark_mongo[db]["orders"].insert_many([{"_id": i, "id": i, "amount": float(i)} for i in range(5)])
    produce(stack_info.kafka_bootstrap, f"{bad}-in", [{"id": i, "amount": float(i)} for i in range(3)], key="id")
    transforms.create(
        ok,
        {
            "inputs": [
                {
                    "name": "orders",
                    "mongodb": {"uriSecretRef": uri_ref("mongo-spark"), "database": db, "collection": "orders"},
                }
            ],
            "sql": "SELECT id, amount * 2 AS doubled FROM orders",
            "output": {
                "mongodb": {
                    "uriSecretRef": uri_ref("mongo-spark"),
                    "database": db,
                    "collection": "out",
                    "idColumn": "id",
                }
            },
            "spark": {"sparkConf": KEEP_EXECUTORS},
        },
    )
    # The bare password as the output's URI: each executor's writer fails naming it as a host.
    transforms.create(
        bad,
        {
            "inputs": [{"name": "orders", "kafka": {"topics": [f"{bad}-in"], "schema": "id INT, amount DOUBLE"}}],
            "sql": "SELECT id, amount FROM orders",
            "output": {"mongodb": {"uriSecretRef": uri_ref("mongo-wrongkey"), "database": db, "collection": "never"}},
            "spark": {"sparkConf": {**KEEP_EXECUTORS, "spark.task.maxFailures": "1"}},
        },
    )
    transforms.wait_condition(ok, "True", "Succeeded", timeout=300)
    cond = transforms.wait_condition(bad, "False", "RunFailed", timeout=300)

    # The credentials worked: the run read the collection and wrote its result through the Secret's URI.
    assert {d["_id"]: d["doubled"] for d in spark_mongo[db]["out"].find()} == {i: 2.0 * i for i in range(5)}
    # Spark's error keeps pymongo's words around the masked value.
    assert "ServerSelectionTimeoutError: ***:27017: " in cond["message"], cond
    assert "(raised in a Python worker)" in cond["message"]
    error = transforms.status(bad)["currentRun"]["errorMessage"]
    assert "***:27017" in error

    runs = {t: transforms.status(t)["currentRun"]["name"] for t in (ok, bad)}
    refs = {"FIBERS_INPUT_ORDERS_URI": ("mongo-spark", "uri"), "FIBERS_OUTPUT_RESULT_URI": ("mongo-spark", "uri")}
    pods = wait_for(
        lambda: (p := spark_pods(kube, namespace, runs[ok])) and set(p) == {"driver", "executor"} and p,
        timeout=60,
        what="the run's pods",
    )
    for pod in pods.values():
        assert uri_env_refs(pod) == refs, pod.metadata.name
    failed_pods = spark_pods(kube, namespace, runs[bad])
    assert set(failed_pods) == {"driver", "executor"}
    for pod in failed_pods.values():
        assert uri_env_refs(pod) == {"FIBERS_OUTPUT_RESULT_URI": ("mongo-wrongkey", "uri")}

    # Lineage names the MongoDB datasets by host and port only.
    events = wait_for(
        lambda: (e := surfaces.lineage(f"transform.{ok}")) and len(e) >= 2 and e, timeout=60, what="START, COMPLETE"
    )
    complete = events[-1]
    assert complete["eventType"] == "COMPLETE"
    datasets = [(d["namespace"], d["name"]) for d in complete["inputs"] + complete["outputs"]]
    mongo_ns = f"mongodb://{secrets.mongo_address}"
    assert datasets == [(mongo_ns, f"{db}.orders"), (mongo_ns, f"{db}.out")]
    wait_for(
        lambda: [e["eventType"] for e in surfaces.lineage(f"transform.{bad}")] == ["START", "FAIL"],
        timeout=60,
        what="START, FAIL",
    )

    places = assert_nowhere(secrets.values, surfaces)
    for run in runs.values():
        for pod in spark_pods(kube, namespace, run).values():
            assert places[f"log {pod.metadata.name}/{pod.spec.containers[0].name}"], "every Spark pod's log was read"
        assert f"configmaps/{run}-result" in places


# ----- DatabusConsumer -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def consumers(kube: ApiClient, namespace: str, operator: OperatorProcess) -> Resources:
    return Resources(kube, "databusconsumers", namespace)


@pytest.mark.databus
def test_consumer_sink_and_bootstrap_store_uris_are_used_by_reference_and_a_failure_is_shown_masked(
    consumers: Resources,
    kube: ApiClient,
    namespace: str,
    stack_info: StackInfo,
    secrets: Secrets,
    surfaces: Surfaces,
) -> None:
    topic, t = f"{secrets.token}-rows", secrets.token
    produce(stack_info.kafka_bootstrap, topic, [{"id": i, "v": 0} for i in range(6)], key="id")
    consumers.create(
        f"{t}-store",
        {
            "sources": [topic],
            "startPosition": "earliest",
            "sink": {"type": "bootstrap", "uriSecretRef": uri_ref("mongo-store"), "database": f"{t}store"},
        },
    )
    consumers.wait_status(f"{t}-store", lambda s: s.get("lag") == 0, timeout=120, what="the store caught up")
    store_mongo: MongoClient[dict[str, Any]] = MongoClient(secrets.uris["mongo-store"])
    assert store_mongo[f"{t}store"].list_collection_names(), "the store was written through its Secret's URI"
    store = {"enabled": True, "uriSecretRef": uri_ref("mongo-store"), "database": f"{t}store"}
    consumers.create(
        f"{t}-view",
        {
            "sources": [topic],
            "startPosition": "bootstrap",
            "bootstrap": store,
            "sink": {"type": "mongodb", "uriSecretRef": uri_ref("mongo-sink"), "database": t, "collection": "rows"},
        },
    )
    # The sink's URI points at a closed port, the store's is the bare password: bootstrapping fails (10 s).
    consumers.create(
        f"{t}-failing",
        {
            "sources": [topic],
            "startPosition": "bootstrap",
            "bootstrap": {"enabled": True, "uriSecretRef": uri_ref("mongo-wrongkey"), "database": f"{t}none"},
            "sink": {"type": "mongodb", "uriSecretRef": uri_ref("mongo-closed"), "database": t, "collection": "x"},
        },
    )
    produce(stack_info.kafka_bootstrap, topic, [{"id": i, "v": 1} for i in range(4, 8)], key="id")

    # The view was bootstrapped from the store and materialised through the sink's URI.
    sink: MongoClient[dict[str, Any]] = MongoClient(secrets.uris["mongo-sink"])
    expected = {str(i): 0 for i in range(4)} | {str(i): 1 for i in range(4, 8)}
    wait_for(
        lambda: {d["_id"]: d["v"] for d in sink[t]["rows"].find()} == expected, timeout=180, what="the view's rows"
    )
    consumers.wait_condition(f"{t}-view", "True", "Consuming", timeout=60)

    # pymongo named the store's "host" (the password); the condition keeps its words around ***.
    cond = consumers.wait_condition(f"{t}-failing", "False", "ServerSelectionTimeoutError", timeout=180)
    assert cond["message"].startswith(
        "instance 1 of 1 (pod ordinal 0) exited: ServerSelectionTimeoutError: ***:27017: "
    ), cond
    wait_for(
        lambda: any(e.reason == "ServerSelectionTimeoutError" for e in events_about(consumers, f"{t}-failing")),
        timeout=30,
        what="the failure's event",
    )

    apps = client.AppsV1Api(kube)
    for name, wanted in (
        (f"{t}-view", {"FIBERS_SINK_MONGODB_URI": "mongo-sink", "FIBERS_BOOTSTRAP_MONGODB_URI": "mongo-store"}),
        (f"{t}-failing", {"FIBERS_SINK_MONGODB_URI": "mongo-closed", "FIBERS_BOOTSTRAP_MONGODB_URI": "mongo-wrongkey"}),
    ):
        [container] = apps.read_namespaced_stateful_set(name, namespace).spec.template.spec.containers
        refs = {e.name: e.value_from.secret_key_ref.name for e in container.env if URI_ENV.match(e.name)}
        assert refs == wanted

    # Lineage names the sinks by host and port only, the closed one included; the failure sent a FAIL.
    view_start = wait_for(lambda: surfaces.lineage(f"databusconsumer.{t}-view"), timeout=60, what="a START")[0]
    assert [(d["namespace"], d["name"]) for d in view_start["outputs"]] == [
        (f"mongodb://{secrets.mongo_address}", f"{t}.rows")
    ]
    failing = wait_for(
        lambda: (e := surfaces.lineage(f"databusconsumer.{t}-failing")) and len(e) >= 2 and e,
        timeout=60,
        what="START, FAIL",
    )
    assert [(d["namespace"], d["name"]) for d in failing[0]["outputs"]] == [("mongodb://127.0.0.1:1", f"{t}.x")]
    assert "FAIL" in [e["eventType"] for e in failing]

    places = assert_nowhere(secrets.values, surfaces)
    pods = client.CoreV1Api(kube).list_namespaced_pod(
        namespace, label_selector=f"fibers.dev/databusconsumer={t}-failing"
    )
    [pod] = pods.items
    said = [
        text for place, text in places.items() if place.endswith(f"termination message {pod.metadata.name}/consumer")
    ]
    assert said and all("ServerSelectionTimeoutError: ***:27017" in text for text in said), said
    assert places.get(f"previous log {pod.metadata.name}/consumer") or places.get(f"log {pod.metadata.name}/consumer")
