"""Upgrading a running pipeline: the chart and images of an earlier commit, upgraded to the working tree and
rolled back, as a platform team does it — from the stack's OCI registry, with `helm upgrade` and `helm rollback`.

The earlier version is Fibers 0.1.0 (PREVIOUS: chart 0.1.0, the operator before readiness, v1beta1 and the
registry), built by the stack from that commit's own Dockerfile. Its operator runs a pipeline of every kind
in one namespace — a Debezium Connect, a DatabusConsumer materialising the table in MongoDB, a Transform's
finished run, a Schema — while rows keep changing. After the upgrade and again after the rollback:

- no connector was changed, restarted, paused or re-created (Kafka Connect writes every one of those to its
  config topic; the connector's records there stay as they were);
- no Transform run was submitted again (the same one SparkApplication, the same current run);
- no Schema registered again (one version);
- every resource is Ready, and the MongoDB view equals the table once the writes stop (nothing lost);
- the CRDs stay at this version's (a rollback runs the older release's hooks: CRDs only move forward).
"""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from kubernetes import client
from kubernetes.client import ApiClient
from pymongo import MongoClient

from fibers_stack import StackInfo, apicurio, fetch, images, previous
from tests.helpers import Resources, debezium_spec, drop_slot, produce, read_records, spark_apps, wait_for
from tests.integration.test_databus import mutate, table_rows, view_rows
from tests.integration.test_readme_install import owned_by_replica_set

PREVIOUS = "561795d5cfc8c809d6ca11674fb7ed25eaba5e51"  # Fibers 0.1.0 (chart 0.1.0)
KINDS = ("connects", "databusconsumers", "transforms", "schemas")
# After an upgrade or rollback returns, how long the new operator is watched doing nothing it should not:
# a few of its Connect sync intervals (2 s here) and reconciles of every resource.
SETTLE_SECONDS = 10


def run(argv: list[Any], *, check: bool = True) -> float:
    """Run a command; its seconds. A failure shows its output."""
    started = time.monotonic()
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 or not check, f"{' '.join(map(str, argv[:4]))} … failed:\n{done.stdout}\n{done.stderr}"
    return time.monotonic() - started


@pytest.fixture(scope="module")
def earlier(stack_info: StackInfo) -> previous.Version:
    """The earlier version's images and chart on the stack's registry (built once per machine)."""
    return previous.publish(stack_info, PREVIOUS)


def old_values(info: StackInfo, version: previous.Version, namespace: str) -> dict[str, Any]:
    """Values for the 0.1.0 chart: its image values have no registry or digest, so the tag carries the digest."""

    def image(ref: str) -> dict[str, str]:
        host, name, tag, digest = images.parse(ref)
        return {"repository": f"{host}/{name}", "tag": f"{tag}@{digest}", "pullPolicy": "IfNotPresent"}

    return {
        "image": image(version.operator),
        "watch": {"namespaces": [namespace]},
        "connect": {"url": info.connect_url, "syncIntervalSeconds": 2},
        "schemaRegistry": {"url": info.registry_url + apicurio.CCOMPAT},
        "kafka": {"bootstrap": info.kafka_bootstrap},
        "jobs": {"image": image(version.job), "serviceAccount": {"create": False}},
        "policy": {"allowHostPath": True},
    }


class Load:
    """Rows changing in PostgreSQL in a thread, a few transactions a second, until stopped."""

    PAUSE_SECONDS = 0.2  # between transactions: about five a second
    FIRST_ID = 10_000  # new rows' ids, above the seed rows and each round's ten

    def __init__(self, dsn: str, table: str) -> None:
        self.dsn, self.table = dsn, table
        self.stop = threading.Event()
        self.rounds = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng = random.Random(43)
        with psycopg.connect(self.dsn, autocommit=True) as pg:
            while not self.stop.is_set():
                mutate(pg, self.table, 1, rng, start_id=self.FIRST_ID + self.rounds * 10)
                self.rounds += 1
                time.sleep(self.PAUSE_SECONDS)

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


@pytest.fixture
def pipeline_table(stack_info: StackInfo, unique: str) -> Iterator[dict[str, str]]:
    table, slot = f"up_{unique.replace('-', '_')}", f"up{unique.replace('-', '')}"
    with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
        pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, item text, qty int)")
        for i in range(5):
            pg.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)", (i, f"seed{i}", i))
    yield {"table": table, "slot": slot, "topic": f"{slot}.public.{table}"}
    drop_slot(stack_info.postgres_dsn, slot)


def connector_records(info: StackInfo, connector: str) -> list[tuple[bytes | None, bytes | None]]:
    """What Kafka Connect wrote about one connector to its config topic: config, tasks, target state, restarts."""
    return [
        (k, v) for k, v in read_records(info.kafka_bootstrap, "connect-configs") if connector in (k or b"").decode()
    ]


# The earlier images' first build (≈ 3 min cold) happens in this test's set-up, which pytest-timeout counts.
@pytest.mark.timeout(1500)
def test_a_running_pipeline_survives_helm_upgrade_from_the_earlier_version_and_rollback(
    stack_info: StackInfo,
    kube: ApiClient,
    namespace: str,
    mongo_secret: str,
    unique: str,
    earlier: previous.Version,
    pipeline_table: dict[str, str],
    tmp_path: Path,
) -> None:
    helm = [fetch.helm(), "--kubeconfig", stack_info.kubeconfig]
    release, release_ns = f"up-{uuid.uuid4().hex[:5]}", f"fibers-up-{uuid.uuid4().hex[:5]}"
    core = client.CoreV1Api(kube)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=release_ns)))
    (tmp_path / "old.json").write_text(json.dumps(old_values(stack_info, earlier, namespace)))
    new = stack_info.chart_values([namespace])
    new["connect"]["syncIntervalSeconds"] = 2
    new["jobs"]["serviceAccount"] = {"create": False}
    (tmp_path / "new.json").write_text(json.dumps(new))
    base = [*helm, "--namespace", release_ns]
    resources = {plural: Resources(kube, plural, namespace) for plural in KINDS}
    connector = f"{unique}-cdc"
    try:
        run([*base, "install", release, *earlier.chart_source(stack_info), "-f", tmp_path / "old.json", "--wait"])
        # The pipeline, made by the earlier operator.
        spec = debezium_spec(stack_info.postgres_dsn, table=pipeline_table["table"], prefix=pipeline_table["slot"])
        resources["connects"].create(connector, spec)
        resources["connects"].wait_condition(connector, "True", "Running", timeout=120)
        admin = AdminClient({"bootstrap.servers": stack_info.kafka_bootstrap})
        topic = pipeline_table["topic"]
        wait_for(lambda: topic in admin.list_topics(timeout=10).topics, timeout=60, what="the snapshot's topic")
        mongo: MongoClient[dict[str, Any]] = MongoClient(stack_info.mongodb_uri)
        sink = {"type": "mongodb", "uriSecretRef": {"name": mongo_secret, "key": "uri"}}
        sink |= {"database": unique, "collection": "rows"}
        resources["databusconsumers"].create(unique, {"sources": [pipeline_table["topic"]], "sink": sink})
        produce(stack_info.kafka_bootstrap, f"{unique}-in", [{"id": i} for i in range(4)], key="id")
        resources["transforms"].create(
            unique,
            {
                "inputs": [{"name": "things", "kafka": {"topics": [f"{unique}-in"], "schema": "id INT"}}],
                "sql": "SELECT count(*) AS n FROM things",
                "output": {"kafka": {"topic": f"{unique}-out"}},
            },
        )
        schema = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]}
        resources["schemas"].create(unique, {"subject": f"{unique}-value", "schema": json.dumps(schema)})
        resources["transforms"].wait_condition(unique, "True", "Succeeded", timeout=300)
        with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
            expected = table_rows(pg, pipeline_table["table"])
        wait_for(lambda: view_rows(mongo, unique, "rows") == expected, timeout=120, what="the view equals the table")
        names = {"connects": connector}
        for plural, items in resources.items():
            items.wait_condition(names.get(plural, unique), "True", timeout=120)
        run_name = resources["transforms"].status(unique)["currentRun"]["name"]
        connect_before = connector_records(stack_info, connector)
        assert connect_before  # the earlier operator's create is there

        def unchanged(after: str) -> None:
            time.sleep(SETTLE_SECONDS)
            for plural, items in resources.items():
                items.wait_condition(names.get(plural, unique), "True", timeout=180)
            assert connector_records(stack_info, connector) == connect_before, f"the connector was touched by {after}"
            apps = spark_apps(kube, namespace, unique)
            assert [a["metadata"]["name"] for a in apps] == [run_name], f"a run submitted again by {after}"
            assert resources["transforms"].status(unique)["currentRun"]["name"] == run_name
            versions = httpx.get(f"{stack_info.registry_url}{apicurio.CCOMPAT}/subjects/{unique}-value/versions")
            assert versions.json() == [1], f"the subject registered again by {after}"

        with Load(stack_info.postgres_dsn, pipeline_table["table"]) as load:
            # As the README's upgrade: the new chart's defaults under the release's own values, the new images.
            chart = [release, *stack_info.chart_source(), "--reset-then-reuse-values", "-f", tmp_path / "new.json"]
            upgrade = run([*base, "upgrade", *chart, "--wait", "--timeout", "5m"])
            [pod] = [
                p
                for p in core.list_namespaced_pod(release_ns).items
                if p.metadata.deletion_timestamp is None and owned_by_replica_set(p)
            ]
            assert pod.spec.containers[0].image == stack_info.images["operator"]
            unchanged("the upgrade")
            rollback = run([*base, "rollback", release, "1", "--wait", "--timeout", "5m"])
            unchanged("the rollback")
        assert load.rounds > 0
        # Nothing lost: once the writes stop, the view catches up with the table.
        with psycopg.connect(stack_info.postgres_dsn, autocommit=True) as pg:
            expected = table_rows(pg, pipeline_table["table"])
        wait_for(lambda: view_rows(mongo, unique, "rows") == expected, timeout=180, what="the view equals the table")
        # CRDs only move forward: the rollback's older chart did not take this version's back.
        crd = client.ApiextensionsV1Api(kube).read_custom_resource_definition("transforms.fibers.dev")
        assert [v.name for v in crd.spec.versions if v.storage] == ["v1beta1"]
        print(
            f"\nhelm upgrade from {PREVIOUS[:7]} {upgrade:.1f} s; helm rollback {rollback:.1f} s; {load.rounds} writes"
        )
    finally:
        try:  # the resources go while an operator runs, so their finalizers complete
            for items in resources.values():
                for name in {connector, unique}:
                    if items.exists(name):
                        items.delete(name)
            wait_for(lambda: not resources["connects"].exists(connector), timeout=90, what="the connector deleted")
        finally:
            run([*base, "uninstall", release, "--wait"], check=False)
            core.delete_namespace(release_ns)
