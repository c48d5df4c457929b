"""Benchmark: the operator restarted beside N Connects, N DatabusConsumers and N Transforms at rest.

The "startup sync" of the DataFibers design, measured: in one namespace of the local stack, N Connect
resources (FileStreamSource connectors on the stack's Kafka Connect, reached through a counting proxy),
N DatabusConsumers (all stopped but `--running`, whose pods run) and N idle Transforms (half batch
with a schedule that fires on the 1st of January, half suspended streaming ones). Once all of them are
Ready or have a status and `--settle` seconds have passed, the operator process is stopped (SIGTERM and
its exit, as a pod deletion does it) and a new one started. Figures:
  observed_s       — new process started → it has reconciled every resource of every kind
                     (`fibers_reconciles_total` per kind ≥ N on its /metrics) (goal ≤ 30 s);
  ready_s          — new process started → its /readyz answers 200 (the watches have listed what exists);
  api_requests     — requests of the new process to the API server from its start until `--after`
                     seconds past `observed_s`, from the API server's audit log; `api_calls` names them,
                     `api_writes` counts creates, updates, patches and deletes other than Events;
  connect_calls    — requests of the new process to Kafka Connect over the same window, from the proxy's
                     journal; `connect_listings` the connector listings among them (goal: one per sync
                     interval), `connect_writes` the PUT, POST and DELETE calls (goal 0);
  rewritten        — resources whose resourceVersion changed across the restart (goal 0), apart from
                     `heartbeat_writes`: Connects whose status changed only in a lastSyncTime that had
                     reached the heartbeat's age (written every 5 minutes by any process, restarted or not);
  restarted        — connectors or tasks whose state or worker changed, and consumer pods replaced or
                     restarted (goal 0);
  cpu_s_while_observing — CPU seconds of the new process, the API server, etcd, Kafka and Kafka Connect
                     until every resource was observed: what the time goes to;
  rss_mib          — the new process's resident memory at the end.
The last line printed is one JSON object with every figure.

With `--rounds R` the operator is restarted R times on the same resources, the settings taking turns:
`--against REV` runs every other round on the operator code of git revision REV (paired rounds of the code
before and after a change, on one machine and one set of resources), `--workers 4,8` the new process's
reconcile workers. The figures are the median round's of the first setting, every round is listed, and each
setting's median time to observe all is given.

    .venv/bin/python -m bench.operator_restart [--size 1000] [--running 2] [--settle 30] [--after 30]
                                               [--rounds 1] [--workers 4,8] [--against REV]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import httpx
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import client, config

import fibers_stack as stack
from bench.connect_scale import CHARGED, WITHOUT_KUBERNETES, CountingProxy, connect_body, delete_topics
from bench.machine import Run, cpu_seconds, dies_with_parent, free_port, rss_mib, say, wait
from bench.operator_scale import consumer, transform
from fibers_stack import audit, crds, namespaces, platform_resources

GROUP, VERSION = "fibers.dev", "v1beta1"
PLURALS = {"Connect": "connects", "DatabusConsumer": "databusconsumers", "Transform": "transforms"}
WRITES = ("create", "update", "patch", "delete", "deletecollection")
SYNC_INTERVAL = 10.0  # the chart's connect.syncIntervalSeconds
POLL = 1.0  # seconds between two looks at the new process's /metrics (a scrape costs it ~35 ms of CPU at N=1,000)
ROUND_FIGURES = (
    "setting",
    "observed_s",
    "ready_s",
    "cpu_s_while_observing",
    "api_requests",
    "api_writes",
    "rewritten",
    "heartbeat_writes",  # the Connect status heartbeat's: rounds past 5 minutes at rest meet it
    "restarted",
)
HEARTBEAT_S = 300.0  # ConnectPolicy.status_heartbeat: an unchanged Connect status is written again this often


class Setting(NamedTuple):
    """What a round's new process runs: this checkout's operator or a revision's, and its reconcile workers."""

    code: str  # "HEAD" (this checkout) or the revision given to --against
    source: Path | None  # that revision's operator/ directory (None: this checkout's)
    workers: int | None  # None: the operator's default

    @property
    def label(self) -> str:
        return f"{self.code} workers={self.workers or 'default'}"


THIS_CHECKOUT = Setting("HEAD", None, None)


def settings(workers: list[int], against: str | None, workdir: Path) -> list[Setting]:
    """The settings the rounds take in turn: the code alternating every round, the workers every pass."""
    codes: list[tuple[str, Path | None]] = [("HEAD", None)]
    if against:
        tree = workdir / "against"
        tree.mkdir()
        archive = subprocess.run(["git", "archive", against, "operator"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        codes.append((against, tree / "operator"))
    return [Setting(code, source, w) for w in (workers or [None]) for code, source in codes]


class Operator:
    """One operator process watching the benchmark's namespace, Kafka Connect reached through the proxy."""

    def __init__(self, info: stack.StackInfo, namespace: str, log_file: Path, setting: Setting = THIS_CHECKOUT) -> None:
        self.port = free_port()
        # As the operator image runs it: without the `kubernetes` package (RSS is the image's); a revision's
        # operator code, when the setting names one, ahead of this checkout's.
        paths = (str(WITHOUT_KUBERNETES), str(setting.source or ""), os.environ.get("PYTHONPATH"))
        env = {
            **os.environ,
            **info.env(),
            **({"FIBERS_RECONCILE_WORKERS": str(setting.workers)} if setting.workers else {}),
            "FIBERS_CONNECT_DEFAULT_CLUSTER": namespace,
            "FIBERS_CONNECT_SYNC_INTERVAL": str(SYNC_INTERVAL),
            "FIBERS_JOB_SERVICE_ACCOUNT": namespaces.JOBS_SERVICE_ACCOUNT,
            "FIBERS_CONSUMER_SERVICE_ACCOUNT": namespaces.CONSUMER_SERVICE_ACCOUNT,
            "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        }
        self._log = log_file.open("ab")
        self.started = time.monotonic()
        self.started_at = datetime.now(UTC)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fibers", "run", "-n", namespace, "--metrics-port", str(self.port)],
            stdout=self._log,
            stderr=self._log,
            env=env,
            preexec_fn=dies_with_parent,
        )

    def get(self, path: str) -> httpx.Response | None:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}{path}", timeout=5)
        except httpx.HTTPError:
            return None  # not serving yet

    def reconciles(self) -> dict[str, float]:
        """fibers_reconciles_total per kind, as its /metrics says now."""
        answer = self.get("/metrics")
        counts: dict[str, float] = {}
        for line in answer.text.splitlines() if answer is not None and answer.status_code == 200 else []:
            if line.startswith("fibers_reconciles_total{"):
                kind = line.split('kind="', 1)[1].split('"', 1)[0]
                counts[kind] = float(line.rsplit(" ", 1)[1])
        return counts

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)
        self._log.close()


def snapshot(api: client.ApiClient, namespace: str, connect_url: str) -> dict[str, Any]:
    """What a restart must leave as it is: every resource's resourceVersion and status, the consumers' pods,
    and each connector's and task's state and worker (read from Kafka Connect directly, not through the
    proxy). The running consumers' checkpoint ConfigMaps and StatefulSets are written by their pods and the
    StatefulSet controller: the operator's own writes to them are in the audit log's count."""
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    versions: dict[str, str] = {}
    statuses: dict[str, dict[str, Any]] = {}
    for kind, plural in PLURALS.items():
        for item in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)["items"]:
            versions[f"{kind}/{item['metadata']['name']}"] = item["metadata"]["resourceVersion"]
            statuses[f"{kind}/{item['metadata']['name']}"] = item.get("status") or {}
    pods = {
        f"Pod/{pod.metadata.name}": (
            pod.metadata.uid,
            sum(s.restart_count for s in pod.status.container_statuses or []),
        )
        for pod in core.list_namespaced_pod(namespace).items
    }
    listed = httpx.get(f"{connect_url}/connectors", params={"expand": "status"}, timeout=60).json()
    connectors = {
        name: (
            entry["status"]["connector"]["state"],
            entry["status"]["connector"]["worker_id"],
            tuple((t["id"], t["state"], t["worker_id"]) for t in entry["status"]["tasks"]),
        )
        for name, entry in listed.items()
        if name.startswith(f"{namespace}-")
    }
    return {"versions": versions, "statuses": statuses, "pods": pods, "connectors": connectors}


def heartbeat(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Only lastSyncTime moved, HEARTBEAT_S or more: the Connect status's periodic heartbeat, which any
    process writes at that age, restarted or not."""
    if {k: v for k, v in before.items() if k != "lastSyncTime"} != {
        k: v for k, v in after.items() if k != "lastSyncTime"
    }:
        return False
    try:
        moved = datetime.fromisoformat(after["lastSyncTime"]) - datetime.fromisoformat(before["lastSyncTime"])
    except (KeyError, ValueError):
        return False
    return moved.total_seconds() >= HEARTBEAT_S


def changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return sorted(key for key in before if after.get(key) != before[key])


def settled(custom: client.CustomObjectsApi, namespace: str, n: int, running: int) -> bool:
    """Every Connect Ready, every consumer and Transform with a phase, the running consumers Running."""
    for kind, plural in PLURALS.items():
        items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)["items"]
        statuses = [item.get("status") or {} for item in items]
        if kind == "Connect":
            done = sum(
                1
                for s in statuses
                if any(c.get("type") == "Ready" and c.get("status") == "True" for c in s.get("conditions") or [])
            )
        else:
            done = sum(1 for s in statuses if s.get("phase"))
        if done < n:
            return False
        if kind == "DatabusConsumer" and sum(1 for s in statuses if s.get("phase") == "Running") < running:
            return False
    return True


def journal_window(journal: Path, since: float, until: float) -> list[tuple[str, str]]:
    """(method, path) of the proxy's requests sent in [since, until) (monotonic, as the journal has them)."""
    calls = []
    for line in journal.read_text().splitlines():
        sent, _answered, method, path = line.split(" ", 3)
        if since <= float(sent) < until:
            calls.append((method, path))
    return calls


def restart(
    operator: Operator,
    info: stack.StackInfo,
    namespace: str,
    log_file: Path,
    journal: Path,
    api: client.ApiClient,
    n: int,
    counted_s: float,
    setting: Setting,
) -> tuple[Operator, dict[str, Any]]:
    """One round: the operator stopped and a new one started (as `setting` says), timed until it has
    reconciled every resource, and its calls counted `counted_s` seconds more."""
    before = snapshot(api, namespace, info.connect_url)
    say(f"restarting the operator (SIGTERM, then a new process: {setting.label})")
    operator.stop()
    operator = Operator(info, namespace, log_file, setting)
    charged = {"operator": operator.process.pid} | {k: info.pids[k] for k in CHARGED if k in info.pids}
    cpu_before = {name: cpu_seconds(pid) for name, pid in charged.items()}
    observed_s = ready_s = -1.0
    by_kind: dict[str, float] = {}  # when each kind had every resource reconciled
    deadline = operator.started + 600
    while time.monotonic() < deadline and observed_s < 0:
        now = time.monotonic() - operator.started
        if ready_s < 0 and (answer := operator.get("/readyz")) is not None and answer.status_code == 200:
            ready_s = now
        counts = operator.reconciles()
        by_kind |= {kind: round(now, 1) for kind in PLURALS if kind not in by_kind and counts.get(kind, 0) >= n}
        if len(by_kind) == len(PLURALS):
            observed_s = now
        time.sleep(POLL)
    if observed_s < 0:
        raise TimeoutError(f"the new operator reconciled {operator.reconciles()} in 600 s, not {n} of each kind")
    cpu_observing = {name: round(cpu_seconds(pid) - cpu_before[name], 1) for name, pid in charged.items()}
    say(f"every resource observed after {observed_s:.1f} s (ready after {ready_s:.1f} s); {counted_s:.0f} s more")
    time.sleep(counted_s)
    until_monotonic, until = time.monotonic(), datetime.now(UTC)
    after = snapshot(api, namespace, info.connect_url)
    reconciles = operator.reconciles()
    rss = rss_mib(operator.process.pid)
    time.sleep(2)  # the audit log is written in batches behind the requests
    requests = [  # the operator's own: the running consumers' pods use the same user agent
        r
        for r in audit.requests(Path(info.audit_log), operator.started_at, until, namespaces=(namespace, ""))
        if not r.user.startswith("system:serviceaccount:")
    ]
    writes = [r for r in requests if r.verb in WRITES and r.resource != "events"]
    calls = journal_window(journal, operator.started, until_monotonic)
    window_s = until_monotonic - operator.started
    listings = [c for c in calls if c[0] == "GET" and c[1] == "/connectors"]
    connect_writes = [f"{m} {p}" for m, p in calls if m in ("PUT", "POST", "DELETE")]
    moved = changed(before["versions"], after["versions"])
    heartbeats = [k for k in moved if heartbeat(before["statuses"][k], after["statuses"].get(k, {}))]
    rewritten = [k for k in moved if k not in heartbeats]
    restarted = changed(before["connectors"], after["connectors"]) + changed(before["pods"], after["pods"])
    results: dict[str, Any] = {
        "setting": setting.label,
        "observed_s": round(observed_s, 1),
        "ready_s": round(ready_s, 1),
        "observed_s_by_kind": by_kind,
        "cpu_s_while_observing": cpu_observing,
        "window_s": round(window_s, 1),
        "reconciles": reconciles,
        "api_requests": len(requests),
        "api_calls": dict(audit.by_call(requests).most_common(10)),
        "api_writes": len(writes),
        "api_writes_by_call": dict(audit.by_call(writes).most_common(10)),
        "connect_calls": len(calls),
        "connect_calls_by_method": dict(Counter(m for m, _ in calls)),
        "connect_listings": len(listings),
        "connect_sync_intervals": round(window_s / SYNC_INTERVAL, 1),
        "connect_writes": len(connect_writes),
        "connect_writes_sample": connect_writes[:5],
        "rewritten": len(rewritten),
        "rewritten_sample": rewritten[:10],
        "heartbeat_writes": len(heartbeats),
        "restarted": len(restarted),
        "restarted_sample": restarted[:10],
        "rss_mib": round(rss, 1),
    }
    results["goals"] = {
        "observed_le_30_s": results["observed_s"] <= 30,
        "connect_writes_0": results["connect_writes"] == 0,
        "api_writes_0": results["api_writes"] == 0,
        "rewritten_0": results["rewritten"] == 0,
        "restarted_0": results["restarted"] == 0,
    }
    return operator, results


def headline(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median round of the first setting as the figures, every round beside them, and with two
    settings, each one's median time to observe every resource and API requests (the rounds alternate, so
    both see the same machine)."""
    first = [r for r in rounds if r["setting"] == rounds[0]["setting"]]
    chosen = sorted(first, key=lambda r: r["observed_s"])[len(first) // 2]
    observed: dict[str, list[float]] = {}
    requests: dict[str, list[int]] = {}
    for r in rounds:
        observed.setdefault(r["setting"], []).append(r["observed_s"])
        requests.setdefault(r["setting"], []).append(r["api_requests"])
    return chosen | {
        "rounds": [{k: r[k] for k in ROUND_FIGURES} for r in rounds],
        "observed_s_median_by_setting": {label: statistics.median(times) for label, times in observed.items()},
        "api_requests_median_by_setting": {label: statistics.median(n) for label, n in requests.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1000, help="resources of each kind")
    parser.add_argument("--running", type=int, default=2, help="consumers of the N that run (pods)")
    parser.add_argument("--settle", type=float, default=30.0, help="seconds at rest before the restart")
    parser.add_argument("--after", type=float, default=30.0, help="seconds counted after every resource is observed")
    parser.add_argument("--rounds", type=int, default=1, help="restarts, each after --settle seconds at rest")
    parser.add_argument(
        "--workers",
        type=lambda text: [int(w) for w in text.split(",")],
        default=[],
        help="reconcile workers of the new process, one setting per round in turn (e.g. 4,8); default: the operator's",
    )
    parser.add_argument("--against", help="a git revision whose operator code runs every other round")
    args = parser.parse_args()
    n = args.size

    session = Run("operator_restart")
    info = session.stack()
    api = config.new_client_from_config(config_file=info.kubeconfig)
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    crds.apply(api)
    workdir = Path(tempfile.mkdtemp(prefix="fibers-bench-"))
    journal = workdir / "connect-calls.log"
    proxy = CountingProxy(info.connect_url, journal)
    proxy_url = proxy.start()
    namespace = f"restart-{uuid.uuid4().hex[:6]}"
    namespaces.create(api, namespace)
    platform_resources.apply(api, namespace, proxy_url)  # the Connect cluster, through the counting proxy
    topic = f"{namespace}-relay"
    admin = AdminClient({"bootstrap.servers": info.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    source = workdir / "source.txt"
    source.write_text("".join(f"line {i}\n" for i in range(10)))  # each connector writes its topic
    log_file = workdir / "operator.log"
    operator = Operator(info, namespace, log_file)
    results: dict[str, Any] = {"size": n, "running_consumers": args.running, "sync_interval_s": SYNC_INTERVAL}
    try:
        bodies: list[tuple[str, dict[str, Any]]] = [("connects", connect_body(i, namespace, source)) for i in range(n)]
        bodies += [("databusconsumers", consumer(i, topic)) for i in range(n)]
        for i in range(args.running):
            bodies[n + i][1]["spec"]["state"] = "running"
        bodies += [("transforms", transform(i, topic)) for i in range(n)]
        say(f"creating {len(bodies)} resources in {namespace} (operator log: {log_file})")
        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(
                pool.map(lambda pair: custom.create_namespaced_custom_object(GROUP, VERSION, namespace, *pair), bodies)
            )
        wait(lambda: settled(custom, namespace, n, args.running), 1800, f"{3 * n} resources settled")
        results["settled_s"] = round(time.monotonic() - started, 1)
        say(f"all {3 * n} resources settled after {results['settled_s']} s; at rest for {args.settle:.0f} s")
        time.sleep(args.settle)
        rounds: list[dict[str, Any]] = []
        turns = settings(args.workers, args.against, workdir)
        for i in range(args.rounds):
            setting = turns[i % len(turns)]
            operator, figures = restart(operator, info, namespace, log_file, journal, api, n, args.after, setting)
            rounds.append(figures)
            if i + 1 < args.rounds:
                time.sleep(args.settle)
        results |= headline(rounds)
        say("cleaning up (the operator removes the connectors)")
        for plural in PLURALS.values():
            custom.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, plural)
        wait(
            lambda: (
                not any(
                    custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)["items"]
                    for plural in PLURALS.values()
                )
            ),
            900,
            "resources deleted",
        )
    finally:
        operator.stop()
        core.delete_namespace(namespace)
        platform_resources.delete(api, namespace)
        delete_topics(info.kafka_bootstrap, f"{namespace}-")
    session.report(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
