"""Benchmark: what N idle DatabusConsumers and N idle Transforms cost the API server and the operator.

For each N (100, 500 and 1,000 by default), in one run on the local stack: N stopped DatabusConsumers
and N Transforms with nothing to do (half batch with a schedule that fires on the 1st of January,
half suspended streaming ones) in a namespace of their own, one operator process watching it. Once
every resource has a status, after `--settle` seconds, over `--quiet` seconds:
  requests_per_resource_per_min — the operator's API requests, counted by the API server in its audit
                     log (user agents kopf/… and fibers; `fibers_stack.audit`), per resource and
                     minute (goal ≤ 1 at every N); `calls` names the most frequent;
  cpu_share        — the operator's CPU over the window, as a share of one core (goal ≤ 0.05 at 1,000);
  rss_mib          — its resident memory at the end (goal ≤ 200 MiB).
Then, with the N idle ones still there, the reaction times on a few that run on the node:
  statefulset_s    — a new running consumer applied → its StatefulSet exists (goal ≤ 1 s);
  checkpoint_s     — its pod's checkpoint ConfigMap shows records consumed → the consumer's status
                     does (goal ≤ 5 s);
  cron_s           — a schedule's minute begins → the run's SparkApplication exists (goal ≤ 2 s);
  run_state_s      — the slowest of the SparkApplication's state changes → its Transform's status
                     shows that state (goal ≤ 2 s).
The last line printed is one JSON object with every figure; `idle_requests_per_resource_per_min` and
the reaction times are the largest N's.

    .venv/bin/python -m bench.operator_scale [--sizes 100,500,1000] [--settle 60] [--quiet 300] [--no-reactions]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import client, config

from bench.machine import Run, cpu_seconds, operator_process, rss_mib, say, wait
from fibers.databus.stats import instance_stats
from fibers_stack import StackInfo, audit, crds, namespaces

GROUP, VERSION = "fibers.dev", "v1beta1"
REACTION_GOALS = {"statefulset_s": 1.0, "checkpoint_s": 5.0, "cron_s": 2.0, "run_state_s": 2.0}  # issue 23


def consumer(i: int, topic: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DatabusConsumer",
        "metadata": {"name": f"idle-consumer-{i}"},
        "spec": {"sources": [topic], "sink": {"type": "log"}, "state": "stopped"},
    }


def transform(i: int, topic: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "inputs": [{"name": "changes", "kafka": {"topics": [topic]}}],
        "sql": "SELECT * FROM changes",
        "output": {"kafka": {"topic": f"{topic}-out"}},
    }
    if i % 2:
        spec |= {"mode": "streaming", "state": "suspended", "checkpoint": {"location": "/tmp/idle"}}
    else:
        spec |= {"mode": "batch", "schedule": "0 0 1 1 *"}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Transform",
        "metadata": {"name": f"idle-transform-{i}"},
        "spec": spec,
    }


POLL = 0.1  # seconds between two looks while a reaction time is measured


def _first(predicate: Any, timeout: float, what: str) -> float:
    """time.time() when `predicate` first holds, polled every POLL seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(POLL)
    return time.time()


def reactions(info: StackInfo, api: client.ApiClient, namespace: str, topic: str) -> dict[str, float]:
    """The reaction times of a running consumer and a scheduled Transform (see the module's docstring)."""
    custom, apps, core = client.CustomObjectsApi(api), client.AppsV1Api(api), client.CoreV1Api(api)
    found: dict[str, float] = {}
    live = consumer(0, topic) | {"metadata": {"name": "live-consumer"}}
    live["spec"] = {**live["spec"], "state": "running"}
    applied = time.time()
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "databusconsumers", live)
    seen = _first(
        lambda: bool(apps.list_namespaced_stateful_set(namespace, field_selector="metadata.name=live-consumer").items),
        30,
        "StatefulSet",
    )
    found["statefulset_s"] = round(seen - applied, 2)

    def consumer_status() -> dict[str, Any]:
        body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "databusconsumers", "live-consumer")
        return dict(body.get("status") or {})

    wait(lambda: consumer_status().get("phase") == "Running", 300, "the live consumer Running")
    producer = Producer({"bootstrap.servers": info.kafka_bootstrap})
    for i in range(20):
        producer.produce(topic, key=str(i).encode(), value=f'{{"id": {i}}}'.encode())
    producer.flush(30)

    def checkpointed() -> bool:
        cm = core.read_namespaced_config_map(consumer_status()["checkpointConfigMap"], namespace)
        stats, _ = instance_stats(dict(cm.metadata.annotations or {}), 1)
        return sum(int(s.get("eventsProcessed") or 0) for s in stats) >= 20

    in_configmap = _first(checkpointed, 120, "the checkpoint of 20 records")
    in_status = _first(lambda: int(consumer_status().get("eventsProcessed") or 0) >= 20, 60, "the status")
    found["checkpoint_s"] = round(in_status - in_configmap, 2)

    # A schedule every minute, created at least 5 s before a minute begins.
    while time.time() % 60 > 55 or time.time() % 60 < 1:
        time.sleep(0.5)
    scheduled = transform(0, topic) | {"metadata": {"name": "live-transform"}}
    scheduled["spec"] = {**scheduled["spec"], "schedule": "* * * * *", "concurrencyPolicy": "Forbid"}
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "transforms", scheduled)
    slot = (time.time() // 60 + 1) * 60
    selector = "fibers.dev/transform=live-transform"

    def runs() -> list[dict[str, Any]]:
        listing = custom.list_namespaced_custom_object(
            "sparkoperator.k8s.io", "v1beta2", namespace, "sparkapplications", label_selector=selector
        )
        return list(listing["items"])

    found["cron_s"] = round(_first(lambda: bool(runs()), 90, "the scheduled run") - slot, 2)
    run = runs()[0]["metadata"]["name"]
    lags, app_seen, shown = [], "", ""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        app = custom.get_namespaced_custom_object(
            "sparkoperator.k8s.io", "v1beta2", namespace, "sparkapplications", run
        )
        state = ((app.get("status") or {}).get("applicationState") or {}).get("state", "")
        now = time.time()
        if state != app_seen:
            app_seen, changed_at = state, now
        body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "transforms", "live-transform")
        current = (body.get("status") or {}).get("currentRun") or {}
        if (
            current.get("name") == run
            and current.get("applicationState") == app_seen
            and shown != app_seen
            and app_seen
        ):
            shown = app_seen
            lags.append(now - changed_at)
            if app_seen in ("COMPLETED", "FAILED"):
                break
        time.sleep(POLL)
    found["run_state_s"] = round(max(lags), 2) if lags else -1.0
    found["run_states_seen"] = len(lags)
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "transforms", "live-transform", {"spec": {"schedule": "0 0 1 1 *"}}
    )
    return found


def settled(custom: client.CustomObjectsApi, namespace: str, n: int) -> bool:
    """Every resource of both kinds has a status with a phase."""
    for plural in ("databusconsumers", "transforms"):
        items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)["items"]
        if sum(1 for item in items if (item.get("status") or {}).get("phase")) < n:
            return False
    return True


def measure(info: StackInfo, api: client.ApiClient, n: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    namespace = f"scale-{uuid.uuid4().hex[:6]}"
    namespaces.create(api, namespace)  # the chart's jobs RBAC; the Spark Operator runs its applications
    topic = f"{namespace}-relay"
    admin = AdminClient({"bootstrap.servers": info.kafka_bootstrap})  # kept: its future needs it alive
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    try:
        with operator_process(info, namespace, workdir / f"operator-{n}.log") as operator:
            bodies = [("databusconsumers", consumer(i, topic)) for i in range(n)]
            bodies += [("transforms", transform(i, topic)) for i in range(n)]
            with ThreadPoolExecutor(16) as pool:
                list(
                    pool.map(
                        lambda pair: custom.create_namespaced_custom_object(GROUP, VERSION, namespace, *pair), bodies
                    )
                )
            started = time.monotonic()
            wait(lambda: settled(custom, namespace, n), 1800, f"{2 * n} resources with a status")
            say(
                f"N={n}: every resource has a status after {time.monotonic() - started:.0f} s; settling {args.settle} s"
            )
            time.sleep(args.settle)
            since, cpu_before = datetime.now(UTC), cpu_seconds(operator.pid)
            say(f"N={n}: counting for {args.quiet} s")
            time.sleep(args.quiet)
            until, cpu_after = datetime.now(UTC), cpu_seconds(operator.pid)
            rss = rss_mib(operator.pid)
            if args.reactions:
                say(f"N={n}: reaction times (a consumer and a scheduled Transform on the node)")
                reacted = reactions(info, api, namespace, topic)
        time.sleep(2)  # the audit log is written in batches behind the requests
        found = audit.requests(Path(info.audit_log), since, until, namespaces=(namespace, ""))
        minutes = (until - since).total_seconds() / 60
        return {
            "requests": len(found),
            "requests_per_resource_per_min": round(len(found) / (2 * n) / minutes, 3),
            "calls": dict(audit.by_call(found).most_common(6)),
            "cpu_share": round((cpu_after - cpu_before) / (until - since).total_seconds(), 4),
            "rss_mib": round(rss, 1),
            **(reacted if args.reactions else {}),
        }
    finally:
        core.delete_namespace(namespace)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,500,1000")
    parser.add_argument("--settle", type=float, default=60.0, help="seconds after every resource has a status")
    parser.add_argument("--quiet", type=float, default=300.0, help="seconds over which requests are counted")
    parser.add_argument("--no-reactions", dest="reactions", action="store_false", help="skip the reaction times")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    session = Run("operator_scale")
    info = session.stack()
    api = config.new_client_from_config(config_file=info.kubeconfig)
    crds.apply(api)
    workdir = Path(tempfile.mkdtemp(prefix="fibers-bench-"))
    results: dict[str, Any] = {"settle_seconds": args.settle, "quiet_seconds": args.quiet}
    for n in sizes:
        results[str(n)] = figures = measure(info, api, n, args, workdir)
        say(f"N={n}: {figures}")
    largest = results[str(max(sizes))]
    results["idle_requests_per_resource_per_min"] = largest["requests_per_resource_per_min"]
    results["goals"] = {
        "requests_le_1_per_resource_per_min": all(results[str(n)]["requests_per_resource_per_min"] <= 1 for n in sizes),
        "cpu_le_5_percent_at_largest": largest["cpu_share"] <= 0.05,
        "rss_le_200_mib_at_largest": largest["rss_mib"] <= 200,
    }
    if args.reactions:
        for key in REACTION_GOALS:
            results[key] = largest[key]
        results["goals"] |= {f"{key}_le_{goal:g}": 0 <= largest[key] <= goal for key, goal in REACTION_GOALS.items()}
    session.report(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
