"""`make demo`: the sample pipeline of examples/ on the local stack, with a live view of it converging.

PostgreSQL `orders` → Connects (Debezium, as JSON and as Avro through the schema registry) → Kafka →
Transforms (a streaming aggregation; a batch report that reads the Avro topic and writes Avro under a
Schema, streamed back as JSON) and DatabusConsumers (the bootstrap store, and a MongoDB view of the
table that bootstraps from it). The operator is installed as a user installs it, `helm install
charts/fibers`, and runs as a pod with the chart's RBAC; Spark drivers and executors and the consumers
run as pods on the node. It writes orders, shows every resource and pod converging, and checks the
MongoDB view against the table.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import httpx
import psycopg
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from pymongo import MongoClient

import fibers_stack as stack
from fibers import pipeline
from fibers.api import LABEL_PIPELINE
from fibers.wire import AvroDecoder, Registry
from fibers_stack import StackInfo, crds, fetch
from fibers_stack.apicurio import CCOMPAT

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
PREREQUISITES = EXAMPLES / "00-shop.yaml"
NAMESPACE = "shop"
PIPELINE = "shop-orders"  # the fibers.dev/pipeline label of the examples' resources
RELEASE, RELEASE_NAMESPACE = "fibers", "fibers-system"
CONNECTORS = {"orders-cdc": "shop_orders", "orders-avro": "shop_orders_avro"}  # examples 01 and 06: their slots
DATA_DIR = Path("/tmp/fibers-demo")  # on the node: the Transforms' hostPath volume (checkpoints, reports)
PLURALS = {
    "Connect": "connects",
    "Transform": "transforms",
    "DatabusConsumer": "databusconsumers",
    "Schema": "schemas",
}
REPORT_TOPIC = "shop.orders-report-avro"  # examples/05-transform-orders-report.yaml, Avro under the Schema of 07
LINEAGE_TOPIC = "shop.lineage"  # the chart's lineage.topic; examples/08 keeps its events in MongoDB shop.lineage


class Screen:
    """Prints steps; on a terminal it redraws the resource table in place."""

    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self.last_table = ""
        self.drawn_lines = 0

    def step(self, message: str) -> None:
        self._clear()
        print(f"▸ {message}", flush=True)

    def table(self, text: str) -> None:
        if text == self.last_table:
            return
        self._clear()
        print(text, flush=True)
        self.last_table = text
        self.drawn_lines = text.count("\n") + 1 if self.tty else 0

    def _clear(self) -> None:
        if self.tty and self.drawn_lines:
            sys.stdout.write(f"\x1b[{self.drawn_lines}F\x1b[J")
        self.drawn_lines = 0


def _wait(probe: Callable[[], bool], timeout: float, what: str, tick: Callable[[], None] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if tick:
            tick()
        if probe():
            return
        time.sleep(1)
    raise TimeoutError(f"timed out waiting for {what}")


def _helm(info: StackInfo, *args: str, check: bool = True) -> None:
    argv = [str(fetch.helm()), "--kubeconfig", info.kubeconfig, *args]
    result = subprocess.run(argv, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"helm {args[0]} failed: {result.stderr.strip()}")


def remove(api: client.ApiClient, info: StackInfo, screen: Screen | None = None) -> None:
    """Remove the demo from the stack (the stack keeps running): its resources while its operator still
    runs, then the operator, then the namespace; then what its connectors left in Kafka, the registry,
    PostgreSQL (replication slots, publications) and MongoDB. Deleting the namespace first would delete the
    operator's Role in it (namespace deletion takes RBAC first) and leave the resources' finalizers with no
    one allowed to remove them. The suite removes the demo after its test: its streaming job would
    otherwise take a CPU's worth from every test after it."""
    core = client.CoreV1Api(api)
    try:
        core.read_namespace(NAMESPACE)
    except ApiException as exc:
        if exc.status != 404:
            raise
    else:
        if screen is not None:
            screen.step(f"removing the previous demo (namespace {NAMESPACE})")
        _delete_resources(api)
        _helm(info, "uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait", check=False)
        core.delete_namespace(NAMESPACE)
        _wait(
            lambda: not any(ns.metadata and ns.metadata.name == NAMESPACE for ns in core.list_namespace().items),
            180,
            "the old namespace to go",
        )
    # A connector whose resource lost its operator (a demo stopped half-way) would hold the slot.
    for connector in CONNECTORS:
        httpx.delete(f"{info.connect_url}/connectors/{connector}", timeout=30)
    _delete_topics(info)
    _delete_subjects(info)
    with psycopg.connect(info.postgres_dsn, autocommit=True) as pg:
        for slot in CONNECTORS.values():
            slot_query = f"SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'"

            def slot_free(query: str = slot_query) -> bool:
                return not any(active for (active,) in pg.execute(query))

            # A deleted connector's task lets go of the slot a moment after the DELETE returns.
            _wait(slot_free, 60, f"the slot {slot} to be free")
            if pg.execute(slot_query).fetchall():
                pg.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            pg.execute(f"DROP PUBLICATION IF EXISTS {slot}")
        pg.execute("DROP TABLE IF EXISTS orders")
    mongo: MongoClient[dict[str, Any]] = MongoClient(info.mongodb_uri)
    mongo.drop_database("shop")
    mongo.drop_database("shop_store")
    shutil.rmtree(DATA_DIR, ignore_errors=True)


def _clean_slate(api: client.ApiClient, info: StackInfo, screen: Screen) -> None:
    """The previous demo removed, and the table and the pods' data directory made afresh."""
    remove(api, info, screen)
    with psycopg.connect(info.postgres_dsn, autocommit=True) as pg:
        pg.execute("CREATE TABLE orders (id int PRIMARY KEY, item text, qty int, price double precision)")
        pg.execute("ALTER TABLE orders REPLICA IDENTITY FULL")
        for i in range(20):
            pg.execute("INSERT INTO orders VALUES (%s, %s, %s, %s)", (i, f"item{i % 5}", 1 + i % 3, 9.5))
    for sub in ("checkpoints", "reports"):
        (DATA_DIR / sub).mkdir(parents=True)
    for path in (DATA_DIR, DATA_DIR / "checkpoints", DATA_DIR / "reports"):
        path.chmod(0o777)  # the Spark pods run as the job image's user


def _delete_topics(info: StackInfo) -> None:
    """The previous demo's topics (`shop.…`): the new run's consumers and report start from nothing."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": info.kafka_bootstrap})
    topics = [t for t in admin.list_topics(timeout=30).topics if t.startswith(f"{NAMESPACE}.")]
    if not topics:
        return
    for future in admin.delete_topics(topics, operation_timeout=30).values():
        future.result()
    _wait(lambda: not set(topics) & set(admin.list_topics(timeout=30).topics), 60, "the old topics to go")


def _delete_subjects(info: StackInfo) -> None:
    """The previous demo's schema registry subjects (`shop.…`), deleted for good: the new run registers afresh."""
    with httpx.Client(base_url=info.registry_url + CCOMPAT, timeout=30) as registry:
        for subject in registry.get("/subjects", params={"deleted": "true"}).json():
            if subject.startswith(f"{NAMESPACE}."):
                registry.delete(f"/subjects/{subject}")  # soft first: the registry refuses a permanent one before
                registry.delete(f"/subjects/{subject}", params={"permanent": "true"})


def _create_topic(info: StackInfo, topic: str) -> None:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": info.kafka_bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)]).values():
        future.result()


def _delete_resources(api: client.ApiClient, timeout: float = 90) -> None:
    """Delete the demo's Fibers resources and wait for the operator to finish them (connector deleted).

    An operator that is gone (a demo stopped half-way) cannot: after the timeout the finalizers are
    dropped, which leaves at most the demo's own connector behind on Kafka Connect.
    """
    custom = client.CustomObjectsApi(api)

    def items() -> list[tuple[str, dict[str, Any]]]:
        found = []
        for plural in PLURALS.values():
            listing = cast(
                dict[str, Any], custom.list_namespaced_custom_object("fibers.dev", "v1beta1", NAMESPACE, plural)
            )
            found += [(plural, item) for item in listing["items"]]
        return found

    for plural, item in items():
        custom.delete_namespaced_custom_object("fibers.dev", "v1beta1", NAMESPACE, plural, item["metadata"]["name"])
    try:
        _wait(lambda: not items(), timeout, "the operator to delete the previous demo's resources")
    except TimeoutError:
        for plural, item in items():
            patch = {"metadata": {"finalizers": None}}
            custom.patch_namespaced_custom_object(
                "fibers.dev", "v1beta1", NAMESPACE, plural, item["metadata"]["name"], patch
            )


def _install(api: client.ApiClient, info: StackInfo) -> str:
    """What the platform team sets up before the operator and the pipeline: the CRDs, the lineage topic,
    and examples/00 (the namespace, which the chart's RBAC goes into, its Secrets, ConnectCluster and
    SchemaRegistry)."""
    crds.apply(api)
    _create_topic(info, LINEAGE_TOPIC)
    return _apply(info, PREREQUISITES)


def _install_operator(info: StackInfo) -> None:
    """`helm install` from the stack's registry, as a user installs it, with the images the stack pushed there."""
    values = info.chart_values([NAMESPACE])
    values["lineage"] = {"topic": LINEAGE_TOPIC}
    # The stack serves the Prometheus Operator's CRDs, and its Prometheus scrapes what they select.
    values["metrics"] = {
        "serviceMonitor": {"enabled": True, "interval": "5s"},
        "podMonitor": {"enabled": True, "interval": "5s"},
        "grafanaDashboards": {"enabled": True},
        "prometheusRule": {"enabled": True},
    }
    values_file = Path(info.run_dir) / "demo-values.json"
    values_file.write_text(json.dumps(values, indent=2))
    _helm(
        info,
        "upgrade",
        "--install",
        RELEASE,
        *info.chart_source(),
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "--values",
        str(values_file),
        "--wait",
        "--timeout",
        "3m",
    )


def _apply(info: StackInfo, path: Path) -> str:
    """`kubectl apply -f` as a user runs it; what it says it did."""
    kubectl = str(fetch.kubernetes() / "kubectl")
    result = subprocess.run(
        [kubectl, "--kubeconfig", info.kubeconfig, "apply", "-f", str(path)], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(f"kubectl apply -f {path} failed: {result.stderr.strip()}")
    return ", ".join(line.strip() for line in result.stdout.splitlines())


def _write_orders(info: StackInfo, rounds: int) -> None:
    rng = random.Random(42)
    with psycopg.connect(info.postgres_dsn, autocommit=True) as pg:
        next_id = 100
        for _ in range(rounds):
            with pg.transaction():
                for _ in range(rng.randint(2, 5)):
                    ids = [r[0] for r in pg.execute("SELECT id FROM orders").fetchall()]
                    roll = rng.random()
                    if roll < 0.55 or not ids:
                        pg.execute(
                            "INSERT INTO orders VALUES (%s, %s, %s, %s)",
                            (next_id, f"item{rng.randint(0, 4)}", rng.randint(1, 5), 9.5),
                        )
                        next_id += 1
                    elif roll < 0.85:
                        pg.execute("UPDATE orders SET qty = qty + 1 WHERE id = %s", (rng.choice(ids),))
                    else:
                        pg.execute("DELETE FROM orders WHERE id = %s", (rng.choice(ids),))
            time.sleep(0.05)


def _summary_line(kind: str, item: dict[str, Any]) -> list[str]:
    status = item.get("status") or {}
    ready: dict[str, Any] = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
    if kind == "Connect":
        detail = f"{status.get('connectorState', '-')} tasks {status.get('tasksReady', '-')}"
    elif kind == "Schema":
        detail = f"{status.get('subject', '-')} v{status.get('version', '-')} id {status.get('id', '-')}"
    elif kind == "Transform":
        run = status.get("currentRun") or {}
        detail = f"{run.get('applicationState', '-')}"
        if "recordsOut" in run:
            detail += f" {run['recordsOut']} rows"
        if "streamedBack" in run:
            detail += f", {run['streamedBack']} streamed back"
    else:
        detail = (
            f"{status.get('consumptionMode', '-')} scn {status.get('windowScn', '-')} "
            f"lag {status.get('lag', '-')} events {status.get('eventsProcessed', '-')}"
        )
    return [
        f"{kind}/{item['metadata']['name']}",
        str(status.get("phase", "-")),
        f"{ready.get('status', '-')} {ready.get('reason', '')}".strip(),
        detail,
    ]


def _resources(api: client.ApiClient) -> dict[str, dict[str, Any]]:
    custom = client.CustomObjectsApi(api)
    found = {}
    for kind, plural in PLURALS.items():
        listing = cast(dict[str, Any], custom.list_namespaced_custom_object("fibers.dev", "v1beta1", NAMESPACE, plural))
        for item in listing["items"]:
            found[f"{kind}/{item['metadata']['name']}"] = item
    return found


def _pods(api: client.ApiClient) -> str:
    """`kubectl get pods` of the demo's namespaces: the operator, Spark drivers and executors, consumers."""
    core = client.CoreV1Api(api)
    rows = [["POD", "STATUS", "RESTARTS"]]
    for namespace in (RELEASE_NAMESPACE, NAMESPACE):
        pods: list[Any] = core.list_namespaced_pod(namespace).items
        for pod in sorted(pods, key=lambda p: str(p.metadata.name)):
            statuses = pod.status.container_statuses or []
            waiting = next((c.state.waiting.reason for c in statuses if c.state and c.state.waiting), None)
            rows.append(
                [
                    f"{namespace}/{pod.metadata.name}",
                    waiting or str(pod.status.phase),
                    str(sum(c.restart_count for c in statuses)),
                ]
            )
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)


def _render(resources: dict[str, dict[str, Any]]) -> str:
    """The pipeline's chain as `fibers pipeline` prints it, then the resources outside it."""
    chain: dict[str, list[dict[str, Any]]] = {kind: [] for kind in pipeline.KINDS}
    rows = [["RESOURCE", "PHASE", "READY", "DETAIL"]]
    for key, item in sorted(resources.items()):
        kind = key.split("/")[0]
        if (item["metadata"].get("labels") or {}).get(LABEL_PIPELINE) == PIPELINE and kind in chain:
            chain[kind].append(item)
        else:
            rows.append(_summary_line(kind, item))
    return pipeline.render(f"{NAMESPACE}/{PIPELINE}", pipeline.order(chain)) + "\n\n" + _table(rows)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows
    )


def _converged(resources: dict[str, dict[str, Any]]) -> bool:
    def ready(key: str, reason: str | None = None) -> bool:
        conds = (resources.get(key, {}).get("status") or {}).get("conditions") or []
        cond: dict[str, Any] = next((c for c in conds if c["type"] == "Ready"), {})
        return cond.get("status") == "True" and (reason is None or cond.get("reason") == reason)

    lag_done = all(
        (resources.get(k, {}).get("status") or {}).get("lag") == 0
        for k in ("DatabusConsumer/orders-store", "DatabusConsumer/orders-view")
    )
    return (
        ready("Connect/orders-cdc")
        and ready("Connect/orders-avro")
        and ready("Schema/orders-report", "Registered")
        and ready("Transform/orders-by-item", "Running")
        and lag_done
        and ready("DatabusConsumer/orders-store")
        and ready("DatabusConsumer/orders-view")
        and ready("DatabusConsumer/lineage-history")
        and ready("Transform/orders-report", "Succeeded")
    )


def _report_lineage(mongo: MongoClient[dict[str, Any]]) -> dict[str, Any] | None:
    """The COMPLETE event of the report's run, as the lineage-history consumer stored it."""
    return mongo["shop"]["lineage"].find_one({"job.name": "shop.transform.orders-report", "eventType": "COMPLETE"})


def _describe_lineage(event: dict[str, Any]) -> str:
    def datasets(key: str, facet: str) -> str:
        found = []
        for d in event.get(key) or []:
            rows = ((d.get(facet) or {}).get(facet.removesuffix("Facets") + "Statistics") or {}).get("rowCount")
            found.append(f"{d['name']}" + (f" ({rows} rows)" if rows is not None else ""))
        return ", ".join(found)

    ingestion = (event.get("run") or {}).get("facets", {}).get("fibers_ingestion") or {}
    return (
        f"run {event['run']['runId'][:8]}… read {datasets('inputs', 'inputFacets')} → wrote "
        f"{datasets('outputs', 'outputFacets')}; rows in {ingestion.get('rowsIn')}, out {ingestion.get('rowsOut')}"
    )


def _read_report(info: StackInfo) -> list[dict[str, Any]]:
    """The report's rows from its Avro topic, each decoded with the schema its id names in the registry."""
    from confluent_kafka import Consumer

    registry = Registry(info.registry_url + CCOMPAT)
    decode = AvroDecoder(registry)
    consumer = Consumer(
        {"bootstrap.servers": info.kafka_bootstrap, "group.id": f"demo-{time.time()}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([REPORT_TOPIC])
    rows: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is None:
                if rows:
                    break
                continue
            value = message.value()
            if message.error() is None and value is not None:
                rows.append(decode(value))
    finally:
        consumer.close()
        registry.close()
    return sorted(rows, key=lambda r: str(r.get("op")))


def run(tty: bool | None = None, rounds: int = 60) -> int:
    tty = sys.stdout.isatty() if tty is None else tty
    screen = Screen(tty)
    started = time.monotonic()
    screen.step("starting the local stack (first run builds it; later runs reuse the cache)")
    info = stack.up()
    api = config.new_client_from_config(config_file=info.kubeconfig)
    _clean_slate(api, info, screen)
    screen.step("installing the CRDs, the lineage topic and examples/00-shop.yaml")
    screen.step(f"kubectl apply -f examples/{PREREQUISITES.name}  →  {_install(api, info)}")
    screen.step(
        f"helm install {RELEASE} {info.chart} --version {info.chart_version} -n {RELEASE_NAMESPACE}"
        "  (the operator, as a pod, from the stack's OCI registry)"
    )
    _install_operator(info)
    screen.step(
        "Prometheus scrapes the operator, the consumer pods and the streaming driver (the chart's ServiceMonitor "
        f"and PodMonitors; its alert rules; Grafana dashboards as ConfigMaps in fibers-system): {info.prometheus_url}"
    )
    report = EXAMPLES / "05-transform-orders-report.yaml"  # applied once there are orders to report on
    for path in sorted(p for p in EXAMPLES.glob("0*.yaml") if p not in (PREREQUISITES, report)):
        screen.step(f"kubectl apply -f examples/{path.name}  →  {_apply(info, path)}")

    def refresh() -> None:
        screen.table(_render(_resources(api)) + "\n\n" + _pods(api))

    def published(connect: str) -> bool:
        return bool((_resources(api).get(f"Connect/{connect}", {}).get("status") or {}).get("topics"))

    _wait(lambda: all(map(published, CONNECTORS)), 240, "Debezium to publish the orders topics", refresh)
    screen.step(f"writing {rounds} transactions of orders (inserts, updates, deletes) to PostgreSQL")
    _write_orders(info, rounds)
    screen.step(f"kubectl apply -f examples/{report.name}  →  {_apply(info, report)}")
    screen.step("waiting for every resource to converge")
    _wait(lambda: _converged(_resources(api)), 600, "the pipeline to converge", refresh)
    refresh()

    with psycopg.connect(info.postgres_dsn) as pg:
        table = {str(r[0]): list(r[1:]) for r in pg.execute("SELECT id, item, qty, price FROM orders")}
    mongo: MongoClient[dict[str, Any]] = MongoClient(info.mongodb_uri)
    view = {d["_id"]: [d["item"], d["qty"], d["price"]] for d in mongo["shop"]["orders"].find()}
    same = table == view
    rows = _read_report(info)
    _wait(lambda: _report_lineage(mongo) is not None, 120, "the report's lineage in MongoDB", refresh)
    lineage = cast(dict[str, Any], _report_lineage(mongo))
    screen.step(
        f"MongoDB view shop.orders vs PostgreSQL table orders: {len(view)} vs {len(table)} rows — "
        + ("identical ✓" if same else "DIFFERENT ✗")
    )
    screen.step(f"batch report, Avro in {REPORT_TOPIC} via the schema registry (JSON in shop.orders-report): {rows}")
    screen.step(f"lineage of the report (OpenLineage events in MongoDB shop.lineage): {_describe_lineage(lineage)}")
    print(
        f"""
Done in {time.monotonic() - started:.0f}s. The stack keeps running; explore it:

  export KUBECONFIG={info.kubeconfig}
  .venv/bin/fibers pipeline {PIPELINE} -n shop     # the chain in order, and its first broken link
  kubectl get fibers -n shop -l fibers.dev/pipeline={PIPELINE}   # every kind in the pipeline
  kubectl get schemas -n shop -o wide              # subject, version, id, compatibility in the registry
  kubectl describe databusconsumer orders-view -n shop
  kubectl get connect orders-cdc -n shop -o yaml   # status: connector, tasks, topics
  kubectl get sparkapplications -n shop
  kubectl get pods -n shop                         # Spark drivers and executors, consumer pods
  kubectl get configmap orders-view-checkpoint -n shop -o yaml   # Databus checkpoints
  kubectl get leases -n shop                       # which consumer pod holds which partition
  kubectl logs -n {RELEASE_NAMESPACE} deploy/{RELEASE}           # the operator
  curl -s '{info.prometheus_url}/api/v1/query?query=fibers_connector_state'   # its metrics, in Prometheus
  {info.prometheus_url}/alerts                    # the chart's alert rules (a browser)

`make demo-down` stops everything.""",
        flush=True,
    )
    return 0 if same else 1
