"""Benchmark: faults on the real node, in figures — what the operator loses, duplicates or leaves behind.

Scenarios (each prints its figures; the last line is one JSON object with all of them and `pass`):
  operator-kills   — N Connect resources created, updated, paused, resumed and deleted at random while
                     the operator is SIGKILLed K times at random moments; foreign connectors (created
                     straight through the REST API) sit next to them. Then: duplicates, orphans, foreign
                     connectors lost or changed, resources that did not converge, and how long the last
                     ones took after the last kill.
  transform-kills  — Transforms re-run R times each, the operator SIGKILLed right after every rerun
                     request: SparkApplications per run (exactly one each), runs missing.
  consumer-kills   — a DatabusConsumer materialising a PostgreSQL table (through Debezium) into MongoDB
                     while the table takes a steady write load; its pod is deleted with no grace K times.
                     Then: rows that differ between MongoDB and the table (0 = nothing lost or doubled).
  standby          — two operators through kopf peering (priorities 100 and 50, as the chart runs them):
                     the active one SIGKILLed; seconds until the standby has made a new resource Ready,
                     and whether the standby acted on anything while the active one lived.
  consumer-faults  — the consumer's fault matrix (bench/consumer_faults.py): every I/O boundary of a
                     consumer fails, hangs, slows down or dies once while it runs a CDC workload; then
                     records lost, SCNs gone back, checkpoints ahead of the sink, restarts on
                     transient faults (all 0), and the windows replayed.
  replay-kills     — a Replay of a pipeline (a sink connector, a DatabusConsumer, a Transform) from a time,
                     the operator SIGKILLed after each of its moves (bench/chaos_replay.py): every step
                     moved exactly once (nothing delivered twice more, one more Spark run), the view
                     put right from the time on, the Replay Succeeded.
  faults           — with Connect resources Ready and the consumer running under load: Kafka Connect
                     restarted, Kafka restarted, the API server restarted, Connect unreachable for 60 s
                     (its port dropped with iptables, the process left running). For each: did the
                     operator live, seconds from recovery until every resource was Ready again (goal:
                     within two sync intervals), and at the end the rows the consumer lost.

    .venv/bin/python -m bench.chaos [--scenarios operator-kills,transform-kills,consumer-kills,consumer-faults,
        faults,standby,replay-kills] [--resources 200] [--kills 100] [--transform-kills 30] [--consumer-kills 20]
        [--fault-records 2000] [--seed 1]

The thresholds live here (THRESHOLDS); tests/integration/test_chaos.py runs a small variant of each
scenario and asserts the invariants, never the timings.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from confluent_kafka.admin import AdminClient
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from pymongo import MongoClient

import fibers_stack as stack
from bench import consumer_faults
from bench.machine import Run, say
from fibers_stack import crds, namespaces, platform_resources
from tests.helpers import Resources, debezium_connect, spark_apps, wait_for
from tests.integration.conftest import OperatorProcess

REPO = Path(__file__).resolve().parents[1]
GROUP, VERSION = "fibers.dev", "v1beta1"
SYNC_INTERVAL = 10.0  # the operator's Connect sync interval in these runs (the chart's default)

# Pass/fail: what the issue asks of the operator under faults. Counts must be exactly these; seconds at most.
THRESHOLDS: dict[str, float] = {
    "duplicates": 0,
    "orphans": 0,
    "foreign_lost": 0,
    "unconverged": 0,
    "extra_spark_applications": 0,
    "missing_runs": 0,
    "rows_differing": 0,
    "operator_crashes": 0,
    "recovery_seconds": 2 * SYNC_INTERVAL,
    "standby_acted_while_active_lived": 0,
    "takeover_seconds": 15 + SYNC_INTERVAL,  # the peering lifetime, then one look at the resource
    "lost": 0,
    "scn_backwards": 0,
    "checkpoint_ahead": 0,
    "transient_restarts": 0,
    "broken": 0,
    "redelivered_extra": 0,
    "view_wrong": 0,
    "extra_seek_runs": 0,
}


@dataclass
class Context:
    """One namespace on the running stack, with an operator watching it that the scenarios may kill."""

    info: stack.StackInfo
    api: client.ApiClient
    namespace: str
    workdir: Path
    rng: random.Random
    sync_interval: float = SYNC_INTERVAL
    operator: OperatorProcess = field(init=False)

    def __post_init__(self) -> None:
        env = {
            "FIBERS_CONNECT_DEFAULT_CLUSTER": "stack",
            "FIBERS_CONNECT_SYNC_INTERVAL": str(self.sync_interval),
            "FIBERS_JOB_SERVICE_ACCOUNT": namespaces.JOBS_SERVICE_ACCOUNT,
            "FIBERS_CONSUMER_SERVICE_ACCOUNT": namespaces.CONSUMER_SERVICE_ACCOUNT,
        }
        self.operator = OperatorProcess(self.info, self.namespace, self.workdir / "operator.log", env)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def connect(self) -> httpx.Client:
        return httpx.Client(base_url=self.info.connect_url, timeout=30)

    def kill_operator(self) -> None:
        """SIGKILL, as a node failure or an OOM kill would: no cleanup, no handler finishing its work."""
        assert self.operator.proc is not None
        os.kill(self.operator.pid, signal.SIGKILL)
        self.operator.proc.wait()
        self.operator.start()

    def operator_alive(self) -> bool:
        return self.operator.proc is not None and self.operator.proc.poll() is None


@contextmanager
def context(
    info: stack.StackInfo, api: client.ApiClient, seed: int, sync_interval: float = SYNC_INTERVAL
) -> Iterator[Context]:
    namespace = f"chaos-{uuid.uuid4().hex[:6]}"
    namespaces.create(api, namespace)
    platform_resources.apply(api, "stack", info.connect_url)
    workdir = Path(tempfile.mkdtemp(prefix="fibers-chaos-"))
    os.chmod(workdir, 0o755)  # Kafka Connect reads the source file as its own user
    ctx = Context(info, api, namespace, workdir, random.Random(seed), sync_interval)
    ctx.operator.start()
    try:
        yield ctx
    finally:
        _delete_resources(ctx)
        ctx.operator.stop()
        client.CoreV1Api(api).delete_namespace(namespace)


def _delete_resources(ctx: Context) -> None:
    if not ctx.operator_alive():
        ctx.operator.start()
    for plural in ("databusconsumers", "transforms", "connects"):
        ctx.custom.delete_collection_namespaced_custom_object(GROUP, VERSION, ctx.namespace, plural)
        wait_for(
            lambda p=plural: not ctx.custom.list_namespaced_custom_object(GROUP, VERSION, ctx.namespace, p)["items"],
            timeout=300,
            what=f"{plural} deleted",
            interval=1,
        )


# ----- operator-kills ---------------------------------------------------------------------------------


def live_connectors(connect: httpx.Client) -> dict[str, dict[str, Any]]:
    """Every connector on the cluster: name → {config, state}, in one call. A connector Connect is still
    creating or deleting lists without info or status: None there (compared as not yet converged)."""
    body = connect.get("/connectors", params=[("expand", "info"), ("expand", "status")]).json()
    return {
        name: {
            "config": (item.get("info") or {}).get("config"),
            "state": ((item.get("status") or {}).get("connector") or {}).get("state"),
        }
        for name, item in body.items()
    }


def operator_kills(ctx: Context, *, resources: int, kills: int, foreign: int = 5) -> dict[str, Any]:
    """Churn N Connect resources while the operator is killed K times; then check what Connect holds."""
    source = ctx.workdir / "source.txt"
    source.write_text("".join(f"line {i}\n" for i in range(10)))
    source.chmod(0o644)
    prefix = f"{ctx.namespace}-"
    connects = Resources(ctx.api, "connects", ctx.namespace)
    with ctx.connect() as connect:
        foreign_configs = {}
        for i in range(foreign):  # not ours: the operator must never touch them
            name = f"{prefix}foreign-{i}"
            cfg = {"connector.class": "FileStreamSource", "file": str(source), "topic": f"{name}-t", "tasks.max": "1"}
            connect.put(f"/connectors/{name}/config", json=cfg).raise_for_status()
            foreign_configs[name] = cfg

        expected: dict[str, dict[str, str]] = {}  # resource → {"topic", "state"}; absent: deleted
        deleted: set[str] = set()
        created = 0
        stop = threading.Event()
        operations = 0

        def spec(name: str, want: dict[str, str]) -> dict[str, Any]:
            return {
                "class": "FileStreamSource",
                "connectorName": f"{prefix}{name}",
                "config": {"file": str(source), "topic": want["topic"]},
                "state": want["state"],
            }

        def churn() -> None:
            nonlocal created, operations
            rng = random.Random(ctx.rng.random())
            while not stop.is_set():
                op = rng.random()
                try:
                    if created < resources and (op < 0.5 or not expected):
                        name = f"c{created}"
                        want = {"topic": f"{prefix}{name}", "state": "running"}
                        connects.create(name, spec(name, want))
                        expected[name], created = want, created + 1
                    elif expected:
                        name = rng.choice(sorted(expected))
                        want = dict(expected[name])
                        if op < 0.7:
                            want["topic"] = f"{prefix}{name}-v{rng.randint(1, 9)}"
                        elif op < 0.9 or len(deleted) >= resources // 4:  # a quarter is deleted, at most
                            want["state"] = "paused" if want["state"] == "running" else "running"
                        else:
                            connects.delete(name)
                            del expected[name]
                            deleted.add(name)
                            continue
                        connects.patch(name, {"spec": spec(name, want)})
                        expected[name] = want
                    operations += 1
                except ApiException as exc:  # the API server is fine; a conflict is a lost race, try again
                    if exc.status not in (409, 429):
                        raise
                time.sleep(rng.uniform(0.01, 0.1))

        worker = threading.Thread(target=churn, daemon=True)
        worker.start()
        for k in range(kills):
            time.sleep(ctx.rng.uniform(0.3, 3.0))
            ctx.kill_operator()
            if (k + 1) % 10 == 0:
                say(f"operator-kills: {k + 1}/{kills} kills, {created} created, {operations} operations")
        while created < resources:  # the churn must have made every resource once
            time.sleep(0.5)
        stop.set()
        worker.join()
        last_kill = time.monotonic()

        def differences() -> list[str]:
            live = live_connectors(connect)
            wrong = []
            for name, want in expected.items():
                got = live.get(f"{prefix}{name}")
                state = "PAUSED" if want["state"] == "paused" else "RUNNING"
                if got is None or got["config"].get("topic") != want["topic"] or got["state"] != state:
                    wrong.append(name)
                    continue
                body = connects.get(name)
                conds = {c["type"]: c for c in (body.get("status") or {}).get("conditions") or []}
                ready = conds.get("Ready", {})
                generation = body["metadata"]["generation"]
                if ready.get("status") != "True" or ready.get("observedGeneration") != generation:
                    wrong.append(name)
            wrong += [name for name in deleted if connects.exists(name)]
            return wrong

        converged_after = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if not differences():
                converged_after = time.monotonic() - last_kill
                break
            time.sleep(1)
        unconverged = differences()
        live = live_connectors(connect)
        ours = {n for n in live if n.startswith(prefix) and n not in foreign_configs}
        wanted = {f"{prefix}{n}" for n in expected}
        figures = {
            "resources": resources,
            "kills": kills,
            "operations": operations,
            "deleted_resources": len(deleted),
            "converged_seconds_after_last_kill": round(converged_after, 1) if converged_after is not None else None,
            "unconverged": len(unconverged),
            "duplicates": len(ours - wanted - {f"{prefix}{n}" for n in deleted}),
            "orphans": len(ours & {f"{prefix}{n}" for n in deleted}),
            "foreign_lost": sum(
                1
                for name, cfg in foreign_configs.items()
                if (live.get(name) or {}).get("config", {}).get("topic") != cfg["topic"]
            ),
        }
        for name in foreign_configs:
            connect.delete(f"/connectors/{name}")
    say(f"operator-kills: {figures}")
    return figures


# ----- transform-kills --------------------------------------------------------------------------------


def transform_kills(ctx: Context, *, transforms: int, reruns: int) -> dict[str, Any]:
    """Rerun Transforms, killing the operator right after each request: one SparkApplication per run."""
    data = ctx.workdir / "data"
    data.mkdir()
    (data / "in.json").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(5)))
    os.chmod(data, 0o777)
    spark = {
        "volumes": [{"name": "data", "hostPath": {"path": str(data), "type": "Directory"}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    items = Resources(ctx.api, "transforms", ctx.namespace)
    names = [f"t{i}" for i in range(transforms)]
    for name in names:
        items.create(
            name,
            {
                "inputs": [{"name": "rows", "files": {"path": "/data/in.json", "format": "json"}}],
                "sql": "SELECT count(*) AS n FROM rows",
                "output": {"files": {"path": f"/data/out-{name}", "format": "json", "mode": "overwrite"}},
                "spark": spark,
                "successfulRunsHistoryLimit": reruns + 2,
                "failedRunsHistoryLimit": reruns + 2,
            },
        )

    def finished(name: str) -> bool:
        status = items.status(name)
        return (
            status.get("phase") in ("Succeeded", "Failed")
            and status.get("observedGeneration") == items.get(name)["metadata"]["generation"]
        )

    kills = 0
    for round_ in range(reruns):
        for name in names:
            wait_for(lambda n=name: finished(n), timeout=600, what=f"{name}'s run finished", interval=1)
        for name in names:  # one kill per rerun request, at a random moment of its submission
            items.patch(name, {"spec": {"rerunNonce": f"r{round_}"}})
            time.sleep(ctx.rng.uniform(0.0, 1.5))
            ctx.kill_operator()
            kills += 1
        say(f"transform-kills: round {round_ + 1}/{reruns}, {kills} kills")
    for name in names:
        wait_for(lambda n=name: finished(n), timeout=600, what=f"{name}'s last run finished", interval=1)
    apps = ctx.custom.list_namespaced_custom_object(
        "sparkoperator.k8s.io", "v1beta2", ctx.namespace, "sparkapplications"
    )
    per_transform: dict[str, int] = {}
    for app in apps["items"]:
        owner = app["metadata"].get("labels", {}).get("fibers.dev/transform", "")
        per_transform[owner] = per_transform.get(owner, 0) + 1
    runs = reruns + 1  # the first run, then one per rerun
    figures = {
        "transforms": transforms,
        "kills": kills,
        "runs_expected": runs * transforms,
        "spark_applications": sum(per_transform.values()),
        "extra_spark_applications": sum(max(n - runs, 0) for n in per_transform.values()),
        "missing_runs": sum(max(runs - per_transform.get(n, 0), 0) for n in names),
    }
    say(f"transform-kills: {figures}")
    return figures


def transform_write_ahead_kill(ctx: Context, name: str) -> dict[str, Any]:
    """Kill the operator exactly between the write-ahead status write and the SparkApplication's create
    (the failpoint `transform.recorded`), after a rerun request to a scheduled Transform: the operator that
    comes next creates the run recorded, under its name and submission id, once. A random kill moment may
    never land there."""
    items = Resources(ctx.api, "transforms", ctx.namespace)
    wait_for(lambda: items.status(name).get("phase") in ("Succeeded", "Failed"), timeout=600, what=f"{name} done")
    ctx.operator.stop()
    plain = dict(ctx.operator.env)
    ctx.operator.env = {**plain, "FIBERS_FAILPOINTS": "transform.recorded=kill"}
    ctx.operator.start()
    # With a schedule that does not fire meanwhile: a scheduled Transform's recorded run was once never made
    # (the plan took the schedule's branch, and the rerun was already recorded as done).
    items.patch(name, {"spec": {"rerunNonce": "write-ahead", "schedule": "0 0 1 1 *"}})
    assert ctx.operator.proc is not None
    ctx.operator.proc.wait(timeout=120)  # killed by its failpoint
    recorded = dict(items.status(name)["currentRun"])

    def run_created() -> bool:
        return any(a["metadata"]["name"] == recorded["name"] for a in spark_apps(ctx.api, ctx.namespace, name))

    created_before = run_created()
    ctx.operator.env = plain
    ctx.operator.start()
    wait_for(run_created, timeout=120, what="the recorded run created", interval=1)
    after = dict(items.status(name)["currentRun"])
    figures = {
        "created_before_restart": created_before,
        "same_run": after["name"] == recorded["name"],
        "same_submission_id": after.get("submissionId") == recorded.get("submissionId"),
        "spark_applications": len(spark_apps(ctx.api, ctx.namespace, name)),
    }
    say(f"write-ahead kill: {figures}")
    return figures


# ----- consumer-kills and faults: a consumer under load -------------------------------------------------


class Table:
    """A PostgreSQL table taking a steady mix of inserts, updates and deletes from a background thread."""

    def __init__(self, dsn: str, name: str, seed: int) -> None:
        self.dsn, self.name = dsn, name
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.transactions = 0
        with psycopg.connect(dsn, autocommit=True) as pg:
            pg.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, item text, qty int)")
            for i in range(20):
                pg.execute(f"INSERT INTO {name} VALUES (%s, %s, %s)", (i, f"seed{i}", i))
        self._thread = threading.Thread(target=self._write, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _write(self) -> None:
        next_id = 1000
        with psycopg.connect(self.dsn, autocommit=True) as pg:
            while not self.stop.is_set():
                try:
                    with pg.transaction():
                        for _ in range(self.rng.randint(1, 4)):
                            choice = self.rng.random()
                            if choice < 0.5:
                                pg.execute(f"INSERT INTO {self.name} VALUES (%s, %s, 1)", (next_id, f"i{next_id}"))
                                next_id += 1
                            elif choice < 0.85:
                                pg.execute(
                                    f"UPDATE {self.name} SET qty = qty + 1 WHERE id = "
                                    f"(SELECT id FROM {self.name} ORDER BY random() LIMIT 1)"
                                )
                            else:
                                pg.execute(
                                    f"DELETE FROM {self.name} WHERE id = "
                                    f"(SELECT id FROM {self.name} ORDER BY random() LIMIT 1)"
                                )
                    self.transactions += 1
                except psycopg.OperationalError:
                    time.sleep(1)  # PostgreSQL is not one of the faults; retry
                time.sleep(0.05)

    def finish(self) -> None:
        self.stop.set()
        self._thread.join()

    def rows(self) -> dict[int, tuple[str, int]]:
        with psycopg.connect(self.dsn) as pg:
            return {r[0]: (r[1], r[2]) for r in pg.execute(f"SELECT id, item, qty FROM {self.name}").fetchall()}


@contextmanager
def consumer_under_load(ctx: Context, seed: int) -> Iterator[tuple[Table, Callable[[], int], str]]:
    """Debezium → Kafka → a DatabusConsumer → MongoDB, with the table under load.
    Yields the table, a function counting rows that differ between MongoDB and the table, and the consumer's name."""
    info = ctx.info
    core = client.CoreV1Api(ctx.api)
    core.create_namespaced_secret(
        ctx.namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="mongo"), string_data={"uri": info.mongodb_uri}),
    )
    table = Table(info.postgres_dsn, f"chaos_{ctx.namespace.replace('-', '_')}", seed)
    prefix = f"cdc{ctx.namespace.replace('-', '')}"
    database = f"chaos{ctx.namespace.replace('-', '')}"
    with debezium_connect(
        ctx.api,
        ctx.namespace,
        info,
        name=f"{ctx.namespace}-cdc",
        table=table.name,
        prefix=prefix,
        config={"provide.transaction.metadata": "true"},
    ) as topic:
        consumers = Resources(ctx.api, "databusconsumers", ctx.namespace)
        sink = {"type": "mongodb", "uriSecretRef": {"name": "mongo", "key": "uri"}, "database": database}
        consumers.create("view", {"sources": [topic], "sink": {**sink, "collection": "orders"}})
        consumers.wait_condition("view", "True", timeout=180)
        table.start()
        mongo: MongoClient[dict[str, Any]] = MongoClient(info.mongodb_uri)

        def differing() -> int:
            view = {d["id"]: (d["item"], d["qty"]) for d in mongo[database]["orders"].find()}
            rows = table.rows()
            return sum(1 for k in set(view) | set(rows) if view.get(k) != rows.get(k))

        try:
            yield table, differing, "view"
        finally:
            table.finish()
            consumers.delete("view")
            wait_for(lambda: not consumers.exists("view"), timeout=120, what="consumer deleted")
            mongo.drop_database(database)
            mongo.close()


def settle(table: Table, differing: Callable[[], int], timeout: float = 300) -> tuple[int, float]:
    """Stop the load and wait for the copy to equal the table: (rows still differing, seconds it took)."""
    table.finish()
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        if differing() == 0:
            return 0, time.monotonic() - started
        time.sleep(1)
    return differing(), time.monotonic() - started


def consumer_kills(ctx: Context, *, kills: int) -> dict[str, Any]:
    core = client.CoreV1Api(ctx.api)
    with consumer_under_load(ctx, ctx.rng.randint(0, 10**6)) as (table, differing, name):
        selector = f"fibers.dev/databusconsumer={name}"
        for k in range(kills):
            pod = wait_for(
                lambda: next(
                    (
                        p
                        for p in core.list_namespaced_pod(ctx.namespace, label_selector=selector).items
                        if p.status.phase == "Running" and not p.metadata.deletion_timestamp
                    ),
                    None,
                ),
                timeout=180,
                what="a running consumer pod",
            )
            time.sleep(ctx.rng.uniform(1.0, 5.0))
            core.delete_namespaced_pod(pod.metadata.name, ctx.namespace, grace_period_seconds=0)
            if (k + 1) % 5 == 0:
                say(f"consumer-kills: {k + 1}/{kills} pods deleted, {table.transactions} transactions")
        left, seconds = settle(table, differing)
        figures = {
            "kills": kills,
            "transactions": table.transactions,
            "rows": len(table.rows()),
            "rows_differing": left,
            "caught_up_seconds": round(seconds, 1),
        }
    say(f"consumer-kills: {figures}")
    return figures


# ----- faults -----------------------------------------------------------------------------------------


def _connect_ready(info: stack.StackInfo) -> bool:
    try:
        return httpx.get(f"{info.connect_url}/connectors", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _kafka_ready(info: stack.StackInfo) -> bool:
    try:
        return bool(AdminClient({"bootstrap.servers": info.kafka_bootstrap}).list_topics(timeout=2).brokers)
    except Exception:  # connection refused while it restarts
        return False


def _apiserver_ready(api: client.ApiClient) -> bool:
    try:
        client.CoreV1Api(api).list_namespace(limit=1, _request_timeout=2)
        return True
    except Exception:  # connection refused while it restarts
        return False


def _restart(name: str, ready: Callable[[], bool], down_seconds: float) -> None:
    stack.stop_component(name)
    time.sleep(down_seconds)
    stack.start_component(name, ready, timeout=300)


@contextmanager
def _port_dropped(url: str) -> Iterator[None]:
    """Packets to the server's port vanish (a partition): connections hang rather than being refused."""
    parsed = httpx.URL(url)
    rule = ["OUTPUT", "-p", "tcp", "-d", str(parsed.host), "--dport", str(parsed.port), "-j", "DROP"]
    subprocess.run(["iptables", "-I", *rule], check=True)
    try:
        yield
    finally:
        subprocess.run(["iptables", "-D", *rule], check=True)


def faults(ctx: Context, *, resources: int = 20, outage: float = 60.0) -> dict[str, Any]:
    """Each fault in turn, the operator and a consumer running throughout."""
    info = ctx.info
    source = ctx.workdir / "faults.txt"
    source.write_text("a\nb\n")
    source.chmod(0o644)
    connects = Resources(ctx.api, "connects", ctx.namespace)
    names = [f"f{i}" for i in range(resources)]
    for name in names:
        connects.create(
            name,
            {
                "class": "FileStreamSource",
                "connectorName": f"{ctx.namespace}-{name}",
                "config": {"file": str(source), "topic": f"{ctx.namespace}-{name}"},
            },
        )

    def all_ready() -> bool:
        items = ctx.custom.list_namespaced_custom_object(GROUP, VERSION, ctx.namespace, "connects")["items"]
        return all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in (i.get("status") or {}).get("conditions") or [])
            for i in items
            if i["metadata"]["name"] in names
        )

    wait_for(all_ready, timeout=300, what="Connect resources Ready", interval=1)
    results: dict[str, Any] = {}
    crashes = 0
    with consumer_under_load(ctx, ctx.rng.randint(0, 10**6)) as (table, differing, _):
        steps: list[tuple[str, Callable[[], None]]] = [
            ("kafka_connect_restart", lambda: _restart("kafka-connect", lambda: _connect_ready(info), 5)),
            ("kafka_restart", lambda: _restart("kafka", lambda: _kafka_ready(info), 5)),
            ("apiserver_restart", lambda: _restart("kube-apiserver", lambda: _apiserver_ready(ctx.api), 5)),
            ("connect_unreachable", lambda: _hold(_port_dropped(info.connect_url), outage)),
        ]
        for label, fault in steps:
            time.sleep(5)
            say(f"faults: {label}")
            watching, noticed = threading.Event(), threading.Event()

            def notice(watching: threading.Event = watching, noticed: threading.Event = noticed) -> None:
                """Did the resources say so while it lasted?"""
                while not watching.wait(1):
                    try:
                        if not all_ready():
                            noticed.set()
                    except Exception:  # the API server itself may be the fault
                        continue

            monitor = threading.Thread(target=notice, daemon=True)
            monitor.start()
            fault()
            recovered = time.monotonic()
            watching.set()
            monitor.join()
            try:
                wait_for(
                    lambda: _apiserver_ready(ctx.api) and all_ready(),
                    timeout=600,
                    what=f"every resource Ready after {label}",
                    interval=0.5,
                )
                seconds: float | None = round(time.monotonic() - recovered, 1)
            except TimeoutError:
                seconds = None
            alive = ctx.operator_alive()
            crashes += 0 if alive else 1
            if not alive:
                ctx.operator.start()
            results[label] = {"recovery_seconds": seconds, "operator_alive": alive, "reported": noticed.is_set()}
            say(f"faults: {label}: {results[label]}")
        left, caught_up = settle(table, differing)
        results["rows_differing"] = left
        results["caught_up_seconds"] = round(caught_up, 1)
        results["transactions"] = table.transactions
    results["operator_crashes"] = crashes
    results["operator_log_tracebacks"] = ctx.operator.log().count("Traceback")
    return results


def _hold(manager: Any, seconds: float) -> None:
    with manager:
        time.sleep(seconds)


# ----- standby ---------------------------------------------------------------------------------------


PEERING_LIFETIME = 15  # seconds (FIBERS_PEERING_LIFETIME): what bounds the takeover


def _peering(ctx: Context, name: str) -> None:
    """The kopf peering CRD and object, as the chart installs them for a namespaced operator with a standby."""
    import yaml

    from fibers_stack import fetch

    crds.apply(ctx.api, paths=[REPO / "charts" / "fibers" / "crds" / "kopfpeerings.kopf.dev.yaml"])

    rendered = subprocess.run(
        [
            str(fetch.helm()),
            "template",
            "fibers",
            str(REPO / "charts" / "fibers"),
            "--namespace",
            ctx.namespace,
            "--set",
            "standby.enabled=true",
            "--set",
            f"standby.peeringName={name}",
            "--set",
            f"watch.namespaces={{{ctx.namespace}}}",
            "--show-only",
            "templates/peering.yaml",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    wait_for(lambda: _served(ctx), timeout=30, what="kopf peering CRD served")
    for doc in docs:
        if doc["kind"] == "KopfPeering":
            ctx.custom.create_namespaced_custom_object("kopf.dev", "v1", ctx.namespace, "kopfpeerings", doc)


def _served(ctx: Context) -> bool:
    try:
        ctx.custom.list_namespaced_custom_object("kopf.dev", "v1", ctx.namespace, "kopfpeerings")
        return True
    except ApiException:
        return False


def _acted_on(log: str) -> set[str]:
    """Resources an operator's log shows it acting on (every Fibers log line about one names it)."""
    names = set()
    for line in log.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("logger", "").startswith("fibers") and record.get("resource"):
            names.add(str(record["resource"]))
    return names


def standby(ctx: Context, *, resources: int = 10) -> dict[str, Any]:
    """Two operators (priorities 100 and 50); the active one SIGKILLed; how soon the standby takes over."""
    peering = "fibers"
    _peering(ctx, peering)
    ctx.operator.stop()  # the context's standalone operator makes way for the pair
    env = {**ctx.operator.env, "FIBERS_PEERING_LIFETIME": str(PEERING_LIFETIME)}
    extra = {k: v for k, v in env.items() if k.startswith("FIBERS_")}
    active = OperatorProcess(
        ctx.info, ctx.namespace, ctx.workdir / "active.log", extra, ("--peering", peering, "--priority", "100")
    )
    passive = OperatorProcess(
        ctx.info, ctx.namespace, ctx.workdir / "standby.log", extra, ("--peering", peering, "--priority", "50")
    )
    source = ctx.workdir / "standby.txt"
    source.write_text("x\n")
    source.chmod(0o644)
    connects = Resources(ctx.api, "connects", ctx.namespace)

    def spec(name: str) -> dict[str, Any]:
        topic = f"{ctx.namespace}-{name}"
        return {"class": "FileStreamSource", "connectorName": topic, "config": {"file": str(source), "topic": topic}}

    # The active one first, then the standby once the active one acts. Started together, kopf (1.45) lets
    # each run for a moment before it sees the other, and a standby that paused within that moment was
    # seen to go on handling its watch events (CI, 2026-11-26: it created 4 of 4 connectors while paused).
    # A rolling update starts the new pod beside a running one, as here.
    active.start()
    try:
        wait_for(lambda: "Resuming operations" in active.log(), timeout=60, what="the active operator acting")
        passive.start()
        time.sleep(3)
        names = [f"s{i}" for i in range(resources)]
        for name in names:
            connects.create(name, spec(name))
        for name in names:
            connects.wait_condition(name, "True", timeout=120)
        time.sleep(PEERING_LIFETIME)  # long enough for a standby that wrongly acts to show it
        before_kill = _acted_on(passive.log())
        os.kill(active.pid, signal.SIGKILL)
        killed = time.monotonic()
        connects.create("after-kill", spec("after-kill"))
        connects.wait_condition("after-kill", "True", timeout=PEERING_LIFETIME * 4)
        takeover = time.monotonic() - killed
        with ctx.connect() as connect:
            live = live_connectors(connect)
        wanted = {f"{ctx.namespace}-{n}" for n in [*names, "after-kill"]}
        ours = {n for n in live if n.startswith(f"{ctx.namespace}-")}
        figures = {
            "resources": resources + 1,
            "peering_lifetime_seconds": PEERING_LIFETIME,
            "takeover_seconds": round(takeover, 1),
            "active_acted_on": len(
                _acted_on(active.log())
            ),  # > 0: the log shows acting, so the next line means something
            "standby_acted_while_active_lived": len(before_kill),
            "duplicates": len(ours - wanted),
            "unconverged": len(wanted - ours),
        }
    finally:
        for op in (active, passive):
            op.stop()
        ctx.operator.start()  # the context cleans up with its own operator
    say(f"standby: {figures}")
    return figures


# ----- verdict ----------------------------------------------------------------------------------------


def verdict(figures: dict[str, Any]) -> list[str]:
    """The thresholds each scenario's figures break (empty: all met)."""
    broken = []

    def walk(prefix: str, node: dict[str, Any]) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(f"{prefix}{key}.", value)
            elif key in THRESHOLDS:
                limit = THRESHOLDS[key]
                over = value is None or (value > limit if key.endswith("seconds") else value != limit)
                if over:
                    broken.append(f"{prefix}{key}={value} (limit {limit})")

    walk("", figures)
    return broken


SCENARIOS = (
    "operator-kills",
    "transform-kills",
    "consumer-kills",
    "consumer-faults",
    "faults",
    "standby",
    "replay-kills",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--resources", type=int, default=200)
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--transforms", type=int, default=3)
    parser.add_argument("--transform-kills", type=int, default=30, help="total, spread over the Transforms")
    parser.add_argument("--consumer-kills", type=int, default=20)
    parser.add_argument("--fault-resources", type=int, default=20, help="Connect resources Ready through the faults")
    parser.add_argument("--outage", type=float, default=60.0, help="seconds Kafka Connect's port is dropped")
    parser.add_argument("--fault-records", type=int, default=2000, help="changes per case of consumer-faults")
    parser.add_argument("--replay-kills", type=int, default=6, help="at most one per move of the Replay's steps")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    session = Run("chaos")
    info = session.stack()
    api = config.new_client_from_config(config_file=info.kubeconfig)
    crds.apply(api)
    figures: dict[str, Any] = {}
    for scenario in args.scenarios.split(","):
        say(f"scenario {scenario}")
        with context(info, api, args.seed) as ctx:
            if scenario == "operator-kills":
                figures[scenario] = operator_kills(ctx, resources=args.resources, kills=args.kills)
            elif scenario == "transform-kills":
                reruns = max(args.transform_kills // args.transforms, 1)
                figures[scenario] = transform_kills(ctx, transforms=args.transforms, reruns=reruns)
            elif scenario == "consumer-kills":
                figures[scenario] = consumer_kills(ctx, kills=args.consumer_kills)
            elif scenario == "consumer-faults":
                figures[scenario] = consumer_faults.matrix(
                    info, api, namespaces, args.fault_records, args.seed, "", say
                )
            elif scenario == "standby":
                figures[scenario] = standby(ctx)
            elif scenario == "faults":
                figures[scenario] = faults(ctx, resources=args.fault_resources, outage=args.outage)
            elif scenario == "replay-kills":
                from bench.chaos_replay import replay_kills  # it builds on this module's Context

                figures[scenario] = replay_kills(ctx, kills=args.replay_kills, transform=True)
            else:
                raise SystemExit(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    broken = verdict(figures)
    for line in broken:
        say(f"threshold broken: {line}")
    session.report({**figures, "pass": not broken})
    return 0 if not broken else 1


if __name__ == "__main__":
    raise SystemExit(main())
