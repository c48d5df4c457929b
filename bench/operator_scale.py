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
The last line printed is one JSON object with every figure; `idle_requests_per_resource_per_min` is the
largest N's.

    .venv/bin/python -m bench.operator_scale [--sizes 100,500,1000] [--settle 60] [--quiet 300]
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

from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import client, config

from bench.machine import Run, cpu_seconds, operator_process, rss_mib, say, wait
from fibers_stack import StackInfo, audit, crds

GROUP, VERSION = "fibers.dev", "v1alpha1"


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
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
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
        time.sleep(2)  # the audit log is written in batches behind the requests
        found = audit.requests(Path(info.audit_log), since, until)
        minutes = (until - since).total_seconds() / 60
        return {
            "requests": len(found),
            "requests_per_resource_per_min": round(len(found) / (2 * n) / minutes, 2),
            "calls": dict(audit.by_call(found).most_common(6)),
            "cpu_share": round((cpu_after - cpu_before) / (until - since).total_seconds(), 3),
            "rss_mib": round(rss, 1),
        }
    finally:
        core.delete_namespace(namespace)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,500,1000")
    parser.add_argument("--settle", type=float, default=60.0, help="seconds after every resource has a status")
    parser.add_argument("--quiet", type=float, default=300.0, help="seconds over which requests are counted")
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
    session.report(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
