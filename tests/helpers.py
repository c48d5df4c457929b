"""Small test helpers shared by integration tests."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml
from confluent_kafka import Consumer, KafkaException

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.5) -> T:
    """Poll probe() until it returns something truthy; fail with `what` after the timeout."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def read_topic(bootstrap: str, topic: str, count: int, *, timeout: float = 60) -> list[bytes]:
    """Read the first `count` record values of a topic from the beginning."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-reader-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().retriable() or "UNKNOWN_TOPIC" in msg.error().name():
                    continue
                raise KafkaException(msg.error())
            values.append(msg.value() or b"")
    finally:
        consumer.close()
    if len(values) < count:
        raise AssertionError(f"read {len(values)} of {count} records from {topic} in {timeout:.0f}s")
    return values


def read_all(bootstrap: str, topic: str, *, idle: float = 3.0) -> list[bytes]:
    """Every record value on a topic so far, from the beginning: read until it has been quiet for `idle` s."""
    return [value or b"" for _, value in read_records(bootstrap, topic, idle=idle)]


def lineage_events(bootstrap: str, topic: str, job: str) -> list[dict[str, Any]]:
    """Every OpenLineage event of `job` on the lineage topic so far, in order."""
    found = [json.loads(value or b"{}") for value in read_all(bootstrap, topic)]
    return [event for event in found if event.get("job", {}).get("name") == job]


def read_records(bootstrap: str, topic: str, *, idle: float = 3.0) -> list[tuple[bytes | None, bytes | None]]:
    """Every record (key, value) on a topic so far, in order: read until it has been quiet for `idle` s."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"test-all-{time.monotonic_ns()}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    records: list[tuple[bytes | None, bytes | None]] = []
    idle_since = time.monotonic()
    try:
        while time.monotonic() - idle_since < idle:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            idle_since = time.monotonic()
            records.append((message.key(), message.value()))
    finally:
        consumer.close()
    return records


def latest_rows(records: list[tuple[bytes | None, bytes | None]], fields: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """What a keyed topic of JSON rows says now: the last value per key, a tombstone removing the key."""
    rows: dict[str, dict[str, Any]] = {}
    for key, value in records:
        name = (key or b"").decode()
        if value is None:
            rows.pop(name, None)
        else:
            row = json.loads(value)
            rows[name] = {f: row.get(f) for f in fields}
    return rows


class Resources:
    """Create, read, patch and wait on fibers.dev objects of one kind in one namespace."""

    def __init__(self, api: Any, plural: str, namespace: str) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.plural, self.namespace = plural, namespace
        self.kind = {
            "connects": "Connect",
            "transforms": "Transform",
            "databusconsumers": "DatabusConsumer",
            "schemas": "Schema",
            "replays": "Replay",
        }[plural]

    def create(
        self,
        name: str,
        spec: dict[str, Any],
        annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        body = {
            "apiVersion": "fibers.dev/v1beta1",
            "kind": self.kind,
            "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}},
            "spec": spec,
        }
        result: dict[str, Any] = self.custom.create_namespaced_custom_object(
            "fibers.dev", "v1beta1", self.namespace, self.plural, body
        )
        return result

    def printed(self, name: str) -> dict[str, Any]:
        """The row `kubectl get -o wide` prints for it."""
        return printed(self.custom.api_client, self.plural, self.namespace, name)

    def get(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.custom.get_namespaced_custom_object(
            "fibers.dev", "v1beta1", self.namespace, self.plural, name
        )
        return result

    def patch(self, name: str, patch: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object("fibers.dev", "v1beta1", self.namespace, self.plural, name, patch)

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object("fibers.dev", "v1beta1", self.namespace, self.plural, name)

    def exists(self, name: str) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            self.get(name)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.get(name).get("status") or {})

    def condition(self, name: str, type_: str = "Ready") -> dict[str, Any]:
        for cond in self.status(name).get("conditions") or []:
            if cond["type"] == type_:
                return dict(cond)
        return {}

    def wait_condition(
        self, name: str, status: str, reason: str | None = None, *, type_: str = "Ready", timeout: float = 60
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            cond = self.condition(name, type_)
            ok = cond.get("status") == status and (reason is None or cond.get("reason") == reason)
            return cond if ok else None

        return wait_for(probe, timeout=timeout, what=f"{self.kind} {name} {type_}={status} {reason or ''}")

    def wait_event(self, name: str, reason: str, *, timeout: float = 60) -> dict[str, Any]:
        """The first Kubernetes Event with this reason about the named object."""

        def probe() -> dict[str, Any] | None:
            events = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={name}")
            found = [e for e in events.items if e.reason == reason]
            return {"message": found[0].message, "type": found[0].type} if found else None

        return wait_for(probe, timeout=timeout, what=f"a {reason} event about {self.kind} {name}")

    def wait_paused(self, name: str, *, timeout: float = 60) -> dict[str, Any]:
        """The status once the operator has looked at the current generation and said it acts on nothing
        (`fibers.dev/paused-reconciliation`: Reconciling=False ReconciliationPaused)."""
        generation = self.get(name)["metadata"]["generation"]

        def paused(status: dict[str, Any]) -> bool:
            reconciling = next((c for c in status.get("conditions") or [] if c["type"] == "Reconciling"), {})
            return (
                status.get("observedGeneration") == generation and reconciling.get("reason") == "ReconciliationPaused"
            )

        return self.wait_status(
            name, paused, timeout=timeout, what="the pause said on Reconciling for the changed spec"
        )

    def wait_status(
        self, name: str, check: Callable[[dict[str, Any]], bool], *, timeout: float = 60, what: str = ""
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            status = self.status(name)
            return status if check(status) else None

        return wait_for(probe, timeout=timeout, what=what or f"{self.kind} {name} status")


def printed(api: Any, plural: str, namespace: str | None, name: str) -> dict[str, Any]:
    """The row `kubectl get -o wide` prints for one Fibers object, column name → cell (the API server's
    Table); `namespace` None for a cluster-scoped kind."""
    where = f"namespaces/{namespace}/" if namespace else ""
    request = api.param_serialize(
        "GET",
        f"/apis/fibers.dev/v1beta1/{where}{plural}/{name}",
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*request)
    response.read()
    answer = json.loads(response.data)
    names = [column["name"] for column in answer["columnDefinitions"]]
    return dict(zip(names, answer["rows"][0]["cells"], strict=True))


def spark_apps(kube: Any, namespace: str, transform: str) -> list[dict[str, Any]]:
    """A Transform's runs (the SparkApplications labelled with it), oldest first."""
    from kubernetes import client

    items = client.CustomObjectsApi(kube).list_namespaced_custom_object(
        "sparkoperator.k8s.io",
        "v1beta2",
        namespace,
        "sparkapplications",
        label_selector=f"fibers.dev/transform={transform}",
    )["items"]
    return sorted(items, key=lambda a: a["metadata"]["creationTimestamp"])


def produce(bootstrap: str, topic: str, values: list[Any], *, key: str | None = None) -> None:
    """Write JSON values to a topic and wait until Kafka has them all."""

    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        record_key = str(value[key]).encode() if key else None
        producer.produce(topic, key=record_key, value=json.dumps(value).encode())
    assert producer.flush(30) == 0


def produce_around(bootstrap: str, topic: str) -> int:
    """A one-partition topic of ten records {"id": i}: four timestamped before a time T a minute ago, six at
    or after it; T (ms since the epoch), for tests of where reading starts."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # held: its futures die with it
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    t = int(time.time() * 1000) - 60_000
    producer = Producer({"bootstrap.servers": bootstrap})
    for i, stamp in enumerate([t - 30_000 + i for i in range(4)] + [t + 1_000 * i for i in range(6)]):
        producer.produce(topic, value=json.dumps({"id": i}).encode(), timestamp=stamp)
    assert producer.flush(30) == 0
    return t


def debezium_spec(postgres_dsn: str, *, table: str, prefix: str, **extra: Any) -> dict[str, Any]:
    """A Connect spec streaming one table of the stack's PostgreSQL with Debezium (slot and publication `prefix`)."""
    import psycopg

    dsn = psycopg.conninfo.conninfo_to_dict(postgres_dsn)
    config = {
        "plugin.name": "pgoutput",
        "database.hostname": dsn["host"],
        "database.port": int(str(dsn["port"])),
        "database.user": "postgres",
        "database.password": "unused",
        "database.dbname": "postgres",
        "topic.prefix": prefix,
        "table.include.list": f"public.{table}",
        "slot.name": prefix,
        "publication.name": prefix,
        "publication.autocreate.mode": "filtered",
        **extra.pop("config", {}),
    }
    return {"class": "io.debezium.connector.postgresql.PostgresConnector", "config": config, **extra}


def drop_slot(postgres_dsn: str, slot: str) -> None:
    """Drop a replication slot once its connector's task has let go of it (a moment after the delete)."""
    import psycopg

    with psycopg.connect(postgres_dsn, autocommit=True) as pg:
        query = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s AND active"
        wait_for(lambda: pg.execute(query, (slot,)).fetchone() == (0,), timeout=30, what=f"slot {slot} released")
        pg.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


@contextmanager
def debezium_connect(
    kube: Any, namespace: str, stack: Any, *, name: str, table: str, prefix: str, config: dict[str, Any]
) -> Iterator[str]:
    """A Debezium Connect resource streaming `table` (slot `prefix`); yields its topic once the snapshot made it.
    On exit the resource is deleted and the slot dropped."""
    from confluent_kafka.admin import AdminClient

    connects = Resources(kube, "connects", namespace)
    connects.create(name, debezium_spec(stack.postgres_dsn, table=table, prefix=prefix, config=config))
    connects.wait_condition(name, "True", "Running", timeout=120)
    topic = f"{prefix}.public.{table}"
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    wait_for(lambda: topic in admin.list_topics(timeout=10).topics, timeout=60, what=f"{topic} created by the snapshot")
    try:
        yield topic
    finally:
        connects.delete(name)
        wait_for(lambda: not connects.exists(name), timeout=60, what="connector deleted")
        drop_slot(stack.postgres_dsn, prefix)


def avro_converter(registry_url: str) -> dict[str, str]:
    """Apicurio's AvroConverter writing the Confluent framing with the ids the ccompat API serves."""
    prefix = "value.converter"
    return {
        prefix: "io.apicurio.registry.utils.converter.AvroConverter",
        f"{prefix}.apicurio.registry.url": f"{registry_url}/apis/registry/v2",
        f"{prefix}.apicurio.registry.auto-register": "true",
        f"{prefix}.apicurio.registry.find-latest": "true",
        f"{prefix}.apicurio.registry.as-confluent": "true",
        f"{prefix}.apicurio.registry.use-id": "contentId",
        f"{prefix}.apicurio.registry.headers.enabled": "false",
    }


CHART = Path(__file__).resolve().parents[1] / "charts" / "fibers"


def render_chart(helm: Path, namespace: str, values: dict[str, Any], tmp_path: Path) -> list[dict[str, Any]]:
    """`helm template rel charts/fibers` with these values: the objects it renders."""
    values_file = tmp_path / f"values-{uuid.uuid4().hex[:6]}.json"
    values_file.write_text(json.dumps(values))  # JSON is YAML
    argv = [str(helm), "template", "rel", str(CHART), "--namespace", namespace, "--values", str(values_file)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise AssertionError(f"helm template failed:\n{result.stdout}\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


STATUS_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "status"

# What Argo CD shows for each status fixture with the chart's health check: (health, part of the message).
HEALTH = {
    "connect-running": ("Healthy", "connector is RUNNING"),
    "connect-paused": ("Suspended", "connector is PAUSED"),
    "connect-creating": ("Progressing", "Waiting for creating connector"),
    "connect-tasks-failed": ("Degraded", "task 0 FAILED"),
    "connect-not-owned": ("Degraded", "is the connector of Connect orders in namespace team-a"),
    "connect-unreachable": ("Progressing", "Waiting for cannot reach Kafka Connect"),
    "connect-generation-behind": ("Progressing", "Waiting for the operator to observe generation"),
    "connect-no-status": ("Progressing", "report a status"),
    "connect-invalid-config": ("Degraded", "spec.config.topic: Missing required configuration"),
    "connectcluster-ready": ("Healthy", "Kafka Connect 4.1.1 answers"),
    "connectcluster-unreachable": ("Progressing", "cannot reach Kafka Connect"),
    "transform-batch-succeeded": ("Healthy", "completed: 3 records"),
    "transform-batch-running": ("Progressing", "is running"),
    "transform-streaming-running": ("Healthy", "streaming run"),
    "transform-streaming-ended": ("Degraded", "ended"),
    "transform-run-failed": ("Degraded", "TABLE_OR_VIEW_NOT_FOUND"),
    "transform-deadline": ("Degraded", "no driver after 600s"),
    "transform-submitted": ("Progressing", "waiting for its driver"),
    "transform-suspended": ("Suspended", "suspended"),
    "transform-inputs-not-ready": ("Progressing", "Connect orders-src does not exist"),
    "databusconsumer-online": ("Healthy", "consuming online"),
    "databusconsumer-bootstrapping": ("Progressing", "BOOTSTRAP_SNAPSHOT"),
    "databusconsumer-checkpoint-invalid": ("Degraded", "is not valid JSON"),
    "databusconsumer-failing": ("Degraded", "instance 1 of 1 (pod ordinal 0) exited"),
    "databusconsumer-stopped": ("Suspended", "no instance runs"),
    "schema-registered": ("Healthy", "orders-value version 2 (id 12)"),
    "schema-incompatible": ("Degraded", "nothing was registered"),
    "schema-drifted": ("Degraded", "registered outside this resource"),
    "replay-running": ("Progressing", "1/3 steps repositioned"),
    "replay-succeeded": ("Healthy", "every step runs from"),
    "replay-failed": ("Degraded", "untouched: none"),
    "schema-registry-unreachable": ("Progressing", "connection refused"),
}


def status_fixture(name: str) -> dict[str, Any]:
    """A fibers.dev object with the status the operator writes in one situation (tests/fixtures/status)."""
    loaded: dict[str, Any] = json.loads((STATUS_FIXTURES / f"{name}.json").read_text())
    return loaded


def token_kubeconfig(kube: Any, stack: Any, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig whose credentials are a fresh token of that ServiceAccount (TokenRequest API)."""
    from kubernetes import client

    spec = client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    token = client.CoreV1Api(kube).create_namespaced_service_account_token(
        account, namespace, client.AuthenticationV1TokenRequest(spec=spec)
    )
    assert token.status is not None
    admin = yaml.safe_load(Path(stack.kubeconfig).read_text())
    cluster = admin["clusters"][0]["cluster"]  # the stack's server and CA; not its admin token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "stack", "cluster": cluster}],
        "users": [{"name": account, "user": {"token": token.status.token}}],
        "contexts": [{"name": account, "context": {"cluster": "stack", "user": account, "namespace": namespace}}],
        "current-context": account,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path
