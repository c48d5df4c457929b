"""`make demo`'s script, run without a terminal, ends with the pipeline converged and the view checked.

Everything in it runs as a user runs it: the operator installed with `helm install charts/fibers` as a
pod, Spark drivers and executors and the consumers as pods on the node.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from kubernetes import client
from kubernetes.client import ApiClient
from pymongo import MongoClient

from fibers_stack import StackInfo, demo, prometheus
from tests.helpers import wait_for

pytestmark = pytest.mark.demo


@pytest.fixture(autouse=True, scope="module")
def removed_afterwards(stack_info: StackInfo, kube: ApiClient) -> Iterator[None]:
    """The demo leaves its pipeline running for whoever ran it; here it goes once checked, or its streaming
    job and consumers would take a CPU's worth from every test after this one."""
    yield
    demo.remove(kube, stack_info)


def _demo(stack_info: StackInfo) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "fibers_stack.cli", "demo", "--no-tty"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **stack_info.env()},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _rule_groups(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=30) as answer:
        return list(json.loads(answer.read())["data"]["groups"])


def _prometheus_sees_the_pipeline(url: str) -> None:
    """The stack's Prometheus, configured from the chart's ServiceMonitor and PrometheusRule as the demo
    installed them, scrapes the operator pod and evaluates every alert rule; every series a rule names
    has data, and the resources' own namespace is kept (honorLabels)."""

    def data(promql: str, timeout: float = 120) -> list[dict[str, Any]]:
        return wait_for(lambda: prometheus.query(url, promql), timeout=timeout, what=f"{promql} in Prometheus")

    data('up{job="fibers-metrics", namespace="fibers-system"} == 1')  # the operator pod, scraped
    data('fibers_connector_state{namespace="shop", name="orders-cdc", state="RUNNING"}')
    # The consumer pods, through the chart's PodMonitor: each serves its own figures, joined to the
    # operator's on (namespace, name); the view has applied the demo's changes and caught up.
    data('up{job="fibers-system/fibers-consumers", namespace="shop", pod="orders-view-0"} == 1')
    data('fibers_consumer_events_total{namespace="shop", name="orders-view"} > 0')
    data('fibers_consumer_mode{namespace="shop", name="orders-view", mode="ONLINE_CONSUMPTION"} == 1')
    data('sum by (namespace, name) (fibers_consumer_lag{namespace="shop", name="orders-view"}) == 0')
    # The streaming Transform's driver, through the other PodMonitor: its micro-batches, from Spark's progress.
    data('up{job="fibers-system/fibers-transforms", namespace="shop"} == 1')
    data('fibers_transform_batches_total{namespace="shop", name="orders-by-item"} > 0')
    data('fibers_transform_input_lag_records{namespace="shop", name="orders-by-item"}')
    # The store follows the relay (the view bootstraps from it): its windows were timed from the source.
    data('fibers_consumer_window_latency_seconds_count{namespace="shop", name="orders-store"} > 0')
    groups = wait_for(
        lambda: (g := _rule_groups(url)) and all(r["health"] == "ok" for x in g for r in x["rules"]) and g,
        timeout=60,
        what="every rule evaluated",
    )
    assert {g["name"] for g in groups} == {"fibers.operator", "fibers.connect", "fibers.databus", "fibers.transform"}
    named = set(re.findall(r"\b(fibers_[a-z_]+|up)\b", " ".join(r["query"] for g in groups for r in g["rules"])))
    assert len(named) >= 8
    # A schedule's series exists once a Transform's schedule has fired; the demo's Transforms have none.
    scheduled_only = {"fibers_transform_last_schedule_timestamp_seconds"}
    assert scheduled_only <= named
    for metric in sorted(named - scheduled_only):
        data(metric, timeout=60)
    firing = [r["name"] for g in groups for r in g["rules"] if r.get("state") == "firing"]
    assert firing == [], f"alerts firing on the healthy demo: {firing}"


# What Grafana puts in a panel's query before it sends it: the dashboard's variables at "All", an interval.
GRAFANA_VARIABLES = {'=~"$namespace"': '=~".*"', "$__rate_interval": "1m", "$__range": "1h"}


def _dashboards_have_data(url: str, kube: ApiClient) -> None:
    """Every panel of every dashboard the chart installed (read from its ConfigMaps, as Grafana's sidecar
    reads them) returns data from the demo's Prometheus, but the one about schedules the demo has none of."""
    maps = client.CoreV1Api(kube).list_namespaced_config_map("fibers-system", label_selector="grafana_dashboard=1")
    boards = [json.loads(text) for cm in maps.items for text in (cm.data or {}).values()]
    assert {b["uid"] for b in boards} == {"fibers-operator", "fibers-connect", "fibers-databus", "fibers-transform"}
    queries = 0
    for board in boards:
        for panel in board["panels"]:
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            if "fibers_transform_last_schedule_timestamp_seconds" in json.dumps(panel["targets"]):
                continue
            for target in panel["targets"]:
                promql = target["expr"]
                for variable, value in GRAFANA_VARIABLES.items():
                    promql = promql.replace(variable, value)
                assert "$" not in promql, promql
                wait_for(
                    lambda q=promql: prometheus.query(url, q),
                    timeout=60,
                    what=f"{board['title']} / {panel['title']}: {promql}",
                )
                queries += 1
    assert queries >= 25


def test_demo_pipeline_converges_and_runs_again(stack_info: StackInfo, kube: ApiClient) -> None:
    """`make demo` twice on one stack: the second run replaces the first, whose connector left offsets
    (and a dropped replication slot) behind; its Connect's `offsets.onCreate: reset` starts afresh."""
    _demo(stack_info)
    result = _demo(stack_info)
    assert "removing the previous demo" in result.stdout
    assert "identical ✓" in result.stdout
    assert "kubectl get fibers -n shop" in result.stdout
    # The report read the Avro topic through the registry and wrote Avro rows the demo decoded back.
    report = result.stdout.split("batch report, Avro in shop.orders-report-avro", 1)[1].splitlines()[0]
    assert "{'op': 'c', 'events':" in report and "{'op': 'r', 'events': 20," in report
    # Its lineage, from the OpenLineage events a DatabusConsumer kept in MongoDB: the Avro topic in, both topics out.
    lineage = result.stdout.split("lineage of the report", 1)[1].splitlines()[0]
    assert "read shop.avro.public.orders (" in lineage and "shop.orders-report-avro (4 rows)" in lineage

    custom = client.CustomObjectsApi(kube)
    phases: dict[str, Any] = {}
    for plural in ("connects", "transforms", "databusconsumers"):
        for item in custom.list_namespaced_custom_object("fibers.dev", "v1beta1", "shop", plural)["items"]:
            phases[item["metadata"]["name"]] = (item.get("status") or {}).get("phase")
    assert phases == {
        "orders-cdc": "Running",
        "orders-avro": "Running",
        "orders-by-item": "Running",
        "orders-report": "Succeeded",
        "orders-store": "Running",
        "orders-view": "Running",
        "lineage-history": "Running",
    }

    with psycopg.connect(stack_info.postgres_dsn) as pg:
        table = {str(r[0]): r[1] for r in pg.execute("SELECT id, qty FROM orders")}
    mongo: MongoClient[dict[str, Any]] = MongoClient(stack_info.mongodb_uri)
    assert {d["_id"]: d["qty"] for d in mongo["shop"]["orders"].find()} == table
    assert len(table) > 20  # the seed rows plus what the demo wrote

    core = client.CoreV1Api(kube)
    [operator] = core.list_namespaced_pod("fibers-system", label_selector="app.kubernetes.io/name=fibers").items
    assert operator.status.phase == "Running" and operator.spec.containers[0].image == stack_info.images["operator"]
    assert operator.spec.service_account_name == "fibers"  # the chart's ServiceAccount and RBAC
    pods = core.list_namespaced_pod("shop").items
    roles = {(p.metadata.labels.get("spark-role"), p.metadata.labels.get("fibers.dev/transform")) for p in pods}
    assert {("driver", "orders-by-item"), ("executor", "orders-by-item"), ("driver", "orders-report")} <= roles
    consumers = {p.metadata.labels.get("fibers.dev/databusconsumer") for p in pods if p.status.phase == "Running"}
    assert {"orders-store", "orders-view"} <= consumers
    for pod in pods:
        assert pod.spec.containers[0].image == stack_info.images["job"], pod.metadata.name
    assert "shop/orders-view-0 " in result.stdout  # the live view lists the pods (a StatefulSet names them)
    assert "pipeline shop/shop-orders: 6 steps" in result.stdout  # … after the chain, as `fibers pipeline` prints it
    _prometheus_sees_the_pipeline(stack_info.prometheus_url)
    _dashboards_have_data(stack_info.prometheus_url, kube)

    # `fibers pipeline` prints the chain upstream first, every step Ready.
    def pipeline_now() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fibers", "pipeline", "shop-orders", "-n", "shop"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "KUBECONFIG": stack_info.kubeconfig},
        )

    chain = pipeline_now()
    assert chain.returncode == 0, chain.stdout + chain.stderr
    steps = [line.split()[1] for line in chain.stdout.splitlines()[2:-1]]
    assert steps[:2] == ["Connect/orders-avro", "Connect/orders-cdc"]
    assert set(steps[2:]) == {
        "Transform/orders-by-item",
        "Transform/orders-report",
        "DatabusConsumer/orders-store",
        "DatabusConsumer/orders-view",
    }
    assert chain.stdout.splitlines()[-1] == "every step is Ready"

    # Break the first link (a database that does not exist): the chain names it, and marks what reads from it.
    def patch_dbname(name: str) -> None:
        body = {"spec": {"config": {"database.dbname": name}}}
        custom.patch_namespaced_custom_object("fibers.dev", "v1beta1", "shop", "connects", "orders-cdc", body)

    patch_dbname("no_such_database")
    broken = wait_for(
        lambda: (
            (r := pipeline_now()).returncode == 1
            and sum(line.startswith("!") for line in r.stdout.splitlines()) == 3
            and r
        ),
        timeout=120,
        what="the broken link and its three readers marked",
    )
    assert broken.stdout.splitlines()[-1].startswith("first broken link: Connect/orders-cdc: ")
    marked = {line.split()[1] for line in broken.stdout.splitlines() if line[:1] in "✗!"}
    assert marked == {
        "Connect/orders-cdc",
        "Transform/orders-by-item",
        "DatabusConsumer/orders-store",
        "DatabusConsumer/orders-view",
    }
    patch_dbname("postgres")
    wait_for(lambda: pipeline_now().returncode == 0, timeout=120, what="the pipeline Ready again")
    consumers = custom.list_namespaced_custom_object("fibers.dev", "v1beta1", "shop", "databusconsumers")["items"]
    view = next(c for c in consumers if c["metadata"]["name"] == "orders-view")
    assert view["status"]["sources"] == ["shop.public.orders"]  # its sourceRef, without Debezium's shop.transaction
