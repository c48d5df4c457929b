"""Benchmark: N Connect resources through the operator against the REST-API floor.

For each N (100, 500 and 1,000 by default), in one run on the local stack:
  floor     — a plain script creates N FileStreamSource connectors straight through the REST API
              (16 at a time) and waits until every one and its task is RUNNING; it reaches
              Connect through the same counting proxy as the operator;
  operator  — the same N connectors as Connect resources; seconds until every resource is Ready;
  ratio     — operator / floor, medians over alternating rounds, each phase first in every other
              round (goal ≤ 1.15): single runs on a shared 2-core machine vary by 10 to 30 %;
  breakdown — per phase, from the proxy's journal: when the first create was sent and the last
              answered, a create's median time, the listings and Connect's time answering them, the
              other calls, the tail from the last create to all RUNNING/Ready; and the CPU seconds
              Connect, Kafka, the API server, etcd (and the operator) spent in the phase;
  calls     — REST calls the operator makes to Connect per sync interval at rest, counted by a
              proxy in front of Connect, against a per-connector polling loop (the DataFibers
              design: one status call per connector per interval) measured through the same proxy;
  rss       — the operator's resident memory with N resources (goal ≤ 120 MiB at the largest N);
  cpu       — CPU seconds the operator used from start to the end of the steady-state window;
  metrics   — the operator's /metrics with N resources: its size, the time a scrape takes (median of
              5), its fibers_* series; and its per-resource series (a `name` label) once the N resources
              are deleted again, against the count before they were made (goal: equal — every
              resource's series go with it).
The last line printed is one JSON object with every figure.

    .venv/bin/python -m bench.connect_scale [--sizes 100,500,1000] [--interval 10] [--rounds 5]

At N=5,000 the stack's Connect needs a larger heap and a second worker (one process may keep 20,000 files
open here): start the stack with `FIBERS_CONNECT_HEAP=3g FIBERS_CONNECT_WORKERS=2`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiohttp import ClientSession, web
from confluent_kafka.admin import AdminClient
from kubernetes import client, config, watch

import fibers_stack as stack
from bench.machine import Run, cpu_seconds, dies_with_parent, free_port, rss_mib, say, wait, wait_quiet
from fibers_stack import crds, platform_resources

WITHOUT_KUBERNETES = Path(__file__).resolve().parents[1] / "tools" / "without-kubernetes"

REPO = Path(__file__).resolve().parents[1]


class CountingProxy:
    """Forwards HTTP to Kafka Connect on a loopback port and counts the requests.

    It runs in its own process: in this one it would share the GIL with the benchmark's own
    polling and slow down every call the operator makes.
    """

    def __init__(self, upstream: str, journal: Path) -> None:
        self.upstream = upstream
        self.journal = journal  # one line per request: sent, answered (monotonic, as in this process), method, path
        self._count = multiprocessing.Value("q", 0)
        self._port = multiprocessing.Value("i", 0)

    def start(self) -> str:
        multiprocessing.Process(
            target=_serve, args=(self.upstream, self._count, self._port, self.journal), daemon=True
        ).start()
        deadline = time.monotonic() + 10
        while not self._port.value and time.monotonic() < deadline:
            time.sleep(0.05)
        return f"http://127.0.0.1:{self._port.value}"

    def total(self) -> int:
        return int(self._count.value)


def _serve(upstream: str, count: Any, port: Any, journal: Path) -> None:
    async def main() -> None:
        session = ClientSession()
        out = journal.open("a", buffering=1)

        async def forward(request: web.Request) -> web.Response:
            with count.get_lock():
                count.value += 1
            sent = time.monotonic()
            try:
                return await relay(request)
            finally:
                out.write(f"{sent:.4f} {time.monotonic():.4f} {request.method} {request.path}\n")

        async def relay(request: web.Request) -> web.Response:
            body = await request.read()
            async with session.request(
                request.method,
                f"{upstream}{request.path_qs}",
                data=body or None,
                headers={"Content-Type": request.headers.get("Content-Type", "application/json")},
            ) as answer:
                payload = await answer.read()
                return web.Response(status=answer.status, body=payload, content_type="application/json")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port.value = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


# The stack's processes (their names in `StackInfo.pids`) whose CPU a phase is charged with: what the
# operator's path costs the machine beyond Connect's own work (the API server and etcd store the resources,
# their claims and statuses).
# How long a phase may take before the run gives up: Connect starts tasks more slowly as it holds more of
# them (at N=5,000 on two workers ~1.5 tasks/s at the end, all RUNNING after ~25 min), so it grows with N.
PATIENCE_SECONDS = 900
DELETE_ATTEMPTS = 5  # collection deletes the API server may time out on before a phase's cleanup gives up
PATIENCE_SECONDS_PER_CONNECTOR = 0.8


def patience(n: int) -> float:
    return max(PATIENCE_SECONDS, n * PATIENCE_SECONDS_PER_CONNECTOR)


CHARGED = ("kafka-connect", "kafka", "kube-apiserver", "etcd")


@dataclass
class Tally:
    """One N's rounds: seconds and breakdowns of each phase, and the operator's steady-state figures."""

    floors: list[float] = field(default_factory=list)
    readies: list[float] = field(default_factory=list)
    floor_parts: list[dict[str, Any]] = field(default_factory=list)
    operator_parts: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)


# Between phases: the next starts once the stack's processes have been quiet (together below QUIET_CORES
# of CPU) for QUIET_SECONDS in a row, or after QUIET_MAX_SECONDS. A fixed pause (5 s until issue 16's last
# stop) cannot know how long Connect's and Kafka's after-work of a cleanup lasts (1,000 connectors and
# their topics deleted); the waits are printed, 3-10 s at N=1,000 so far.
QUIET_CORES = 0.25
QUIET_SECONDS = 3
QUIET_MAX_SECONDS = 120.0


def stack_quiet(pids: dict[str, int]) -> float:
    """Wait until the stack is quiet (see QUIET_CORES); the seconds waited."""
    return wait_quiet(
        lambda: sum(cpu_seconds(pid) for pid in pids.values()), QUIET_CORES, QUIET_SECONDS, QUIET_MAX_SECONDS
    )


class Phase:
    """CPU seconds the stack's processes (and the operator, when given) spend during one phase."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.before = {name: cpu_seconds(pid) for name, pid in pids.items()}

    def cpu(self) -> dict[str, float]:
        return {name: round(cpu_seconds(pid) - self.before[name], 1) for name, pid in self.pids.items()}


def breakdown(journal: Path, started: float, ended: float) -> dict[str, Any]:
    """Where a phase's seconds went, from the proxy's journal: when its first create was sent and its last
    answered, a create's median time, how many listings it made and how long Connect took to answer them,
    the other calls, and the tail from the last create to all RUNNING (Ready)."""
    creates: list[tuple[float, float]] = []
    listings: list[float] = []
    other = 0
    for line in journal.read_text().splitlines():
        sent_s, answered_s, method, path = line.split(" ", 3)
        sent, answered = float(sent_s), float(answered_s)
        if not started <= sent <= ended:
            continue
        if method == "POST" and path == "/connectors":
            creates.append((sent, answered))
        elif method == "GET" and path == "/connectors":
            listings.append(answered - sent)
        else:
            other += 1
    last = max((a for _, a in creates), default=started)
    return {
        "first_create_s": round(min((s for s, _ in creates), default=started) - started, 2),
        "creates_done_s": round(last - started, 2),
        "create_p50_ms": round(statistics.median(a - s for s, a in creates) * 1000) if creates else None,
        "listings": len(listings),
        "listing_s": round(sum(listings), 2),
        "other_calls": other,
        "tail_s": round(ended - last, 2),
    }


def all_running(connect: httpx.Client, names: set[str]) -> bool:
    listing = connect.get("/connectors", params={"expand": "status"}).json()
    done = 0
    for name in names:
        status = (listing.get(name) or {}).get("status") or {}
        tasks = status.get("tasks") or []
        if (
            (status.get("connector") or {}).get("state") == "RUNNING"
            and tasks
            and all(t["state"] == "RUNNING" for t in tasks)
        ):
            done += 1
    return done == len(names)


def floor_run(
    connect: httpx.Client, n: int, source: Path, prefix: str, pids: dict[str, int], journal: Path
) -> tuple[float, dict[str, Any]]:
    """Seconds until the script's N connectors all run, and the phase's breakdown."""
    names = {f"{prefix}-{i}" for i in range(n)}
    phase = Phase(pids)
    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        for response in pool.map(
            lambda name: connect.post(
                "/connectors",
                json={
                    "name": name,
                    "config": {
                        "connector.class": "FileStreamSource",
                        "tasks.max": "1",
                        "file": str(source),
                        "topic": name,
                    },
                },
            ),
            sorted(names),
        ):
            response.raise_for_status()
    wait(lambda: all_running(connect, names), patience(n), "floor connectors RUNNING")
    elapsed = time.monotonic() - started
    parts = breakdown(journal, started, started + elapsed) | {"cpu_s": phase.cpu()}
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda name: connect.delete(f"/connectors/{name}"), names))
    wait(lambda: not names & set(connect.get("/connectors").json()), patience(n), "floor connectors deleted")
    return elapsed, parts


def polling_loop_calls(proxy_url: str, names: list[str], proxy: CountingProxy) -> int:
    """One pass of the DataFibers-style status sync: one GET per connector."""
    before = proxy.total()
    with httpx.Client(base_url=proxy_url, timeout=30) as http:
        for name in names:
            http.get(f"/connectors/{name}/status")
    return proxy.total() - before


def ready_watcher(custom: client.CustomObjectsApi, namespace: str, n: int) -> threading.Event:
    """Set once n Connect resources are Ready, learnt from a watch (as `kubectl wait` does).

    Listing hundreds of resources every fraction of a second would load the API server the operator
    writes to and slow down what is being measured.
    """
    done = threading.Event()

    def follow() -> None:
        ready: set[str] = set()
        while not done.is_set():
            for event in watch.Watch().stream(
                custom.list_namespaced_custom_object,
                "fibers.dev",
                "v1beta1",
                namespace,
                "connects",
                timeout_seconds=60,
            ):
                item = event["object"]
                conds = (item.get("status") or {}).get("conditions") or []
                if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                    ready.add(item["metadata"]["name"])
                else:
                    ready.discard(item["metadata"]["name"])
                if len(ready) == n:
                    done.set()
                    return

    threading.Thread(target=follow, daemon=True).start()
    return done


def connect_body(i: int, namespace: str, source: Path) -> dict[str, Any]:
    """Connect resource number i: a FileStreamSource connector reading `source` into a topic of its own."""
    name = f"c{i}"
    return {
        "apiVersion": "fibers.dev/v1beta1",
        "kind": "Connect",
        "metadata": {"name": name},
        "spec": {
            "class": "FileStreamSource",
            "connectorName": f"{namespace}-{name}",
            "config": {"file": str(source), "topic": f"{namespace}-{name}"},
        },
    }


def operator_run(
    info: stack.StackInfo,
    api: client.ApiClient,
    n: int,
    source: Path,
    interval: float,
    proxy: CountingProxy,
    proxy_url: str,
    workdir: Path,
    steady_state: bool,
    pids: dict[str, int],
) -> dict[str, Any]:
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    platform_resources.apply(api, namespace, proxy_url)  # the Connect cluster, through the counting proxy
    env = {
        **os.environ,
        **info.env(),
        "FIBERS_CONNECT_DEFAULT_CLUSTER": namespace,
        "FIBERS_CONNECT_SYNC_INTERVAL": str(interval),
        # As the operator image runs it: without the `kubernetes` package (RSS is the image's).
        "PYTHONPATH": os.pathsep.join(p for p in (str(WITHOUT_KUBERNETES), os.environ.get("PYTHONPATH")) if p),
    }
    log = open(workdir / f"operator-{n}.log", "wb")  # noqa: SIM115
    port = free_port()
    op = subprocess.Popen(
        [sys.executable, "-m", "fibers", "run", "-n", namespace, "--metrics-port", str(port)],
        stdout=log,
        stderr=log,
        env=env,
        preexec_fn=dies_with_parent,
    )
    try:
        time.sleep(3)
        baseline = fibers_series(port, per_resource=True)

        all_ready = ready_watcher(custom, namespace, n)
        time.sleep(0.5)  # the watch is open
        phase = Phase({**pids, "operator": op.pid})
        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(
                pool.map(
                    lambda i: custom.create_namespaced_custom_object(
                        "fibers.dev", "v1beta1", namespace, "connects", connect_body(i, namespace, source)
                    ),
                    range(n),
                )
            )
        if not all_ready.wait(patience(n)):
            raise TimeoutError("all Connect resources Ready")
        ready_seconds = time.monotonic() - started
        figures: dict[str, Any] = {
            "ready_seconds": round(ready_seconds, 1),
            "breakdown": breakdown(proxy.journal, started, started + ready_seconds) | {"cpu_s": phase.cpu()},
        }
        say(f"N={n}: all Ready after {ready_seconds:.1f}s: {json.dumps(figures['breakdown'])}")
        if not steady_state:
            delete_all(custom, namespace, n)
            return figures
        say(f"N={n}: measuring the steady state for 3 intervals")
        time.sleep(interval * 3)  # let the fast interval wind down (topics of new connectors are learnt first)
        before, t0 = proxy.total(), time.monotonic()
        time.sleep(interval * 3)
        steady = (proxy.total() - before) / ((time.monotonic() - t0) / interval)
        rss = rss_mib(op.pid)
        cpu = cpu_seconds(op.pid)
        names = [f"{namespace}-c{i}" for i in range(n)]
        polling = polling_loop_calls(proxy_url, names, proxy)
        scraped = scrape_figures(port)
        steady_figures = {"steady_calls_per_interval": round(steady, 2), "polling_loop_calls_per_interval": polling}
        say(f"N={n}: at rest: {json.dumps(steady_figures | {'rss_mib': round(rss, 1), 'cpu_s': round(cpu, 1)})}")
        say(f"N={n}: cleaning up")
        delete_all(custom, namespace, n)
        time.sleep(2)  # the last deletions' handlers
        return (
            figures
            | scraped
            | {
                "metrics_resource_series_before": baseline,
                "metrics_resource_series_after_delete": fibers_series(port, per_resource=True),
                "steady_calls_per_interval": round(steady, 2),
                "polling_loop_calls_per_interval": polling,
                "operator_rss_mib": round(rss, 1),
                "operator_cpu_seconds": round(cpu, 1),
            }
        )
    finally:
        op.terminate()
        op.wait(30)
        log.close()
        core.delete_namespace(namespace)
        platform_resources.delete(api, namespace)
        delete_topics(info.kafka_bootstrap, f"{namespace}-")


def fibers_series(port: int, *, per_resource: bool = False) -> int:
    """The operator's own series (fibers_*) on its /metrics now; with `per_resource`, only those about one
    resource (a `name` label) — the per-kind and per-cluster ones stay whatever is deleted."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    lines = [line for line in text.splitlines() if line.startswith("fibers_")]
    return sum(1 for line in lines if 'name="' in line) if per_resource else len(lines)


def scrape_figures(port: int) -> dict[str, Any]:
    """Size, scrape time (median of 5) and fibers_* series of the operator's /metrics."""
    times, size = [], 0
    for _ in range(5):
        started = time.monotonic()
        size = len(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).content)
        times.append(time.monotonic() - started)
    return {
        "metrics_bytes": size,
        "metrics_scrape_ms": round(statistics.median(times) * 1000, 1),
        "metrics_series": fibers_series(port),
    }


def delete_all(custom: client.CustomObjectsApi, namespace: str, n: int) -> None:
    """Delete the phase's resources. At 5,000 the API server gave up answering the collection delete (504)
    while still deleting: it is asked again, a few times, rather than losing the run's figures."""
    for attempt in range(1, DELETE_ATTEMPTS + 1):
        try:
            custom.delete_collection_namespaced_custom_object("fibers.dev", "v1beta1", namespace, "connects")
            break
        except client.ApiException as exc:
            if exc.status != 504 or attempt == DELETE_ATTEMPTS:
                raise
            say(f"the API server timed out deleting {n} resources (attempt {attempt}); asking again")
    wait(
        lambda: not custom.list_namespaced_custom_object("fibers.dev", "v1beta1", namespace, "connects")["items"],
        patience(n),
        "resources deleted",
    )


def delete_topics(bootstrap: str, prefix: str) -> None:
    """Remove the topics a phase's connectors wrote to: thousands of leftovers slow Kafka, and with
    it every later phase and run."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [t for t in admin.list_topics(timeout=30).topics if t.startswith(prefix)]
    if not topics:
        return
    for future in admin.delete_topics(topics, operation_timeout=120).values():
        future.result()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,500,1000")
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument(
        "--rounds", type=int, default=5, help="floor/operator pairs per N; the ratio is of medians (3 proved too few)"
    )
    parser.add_argument(
        "--operator-first",
        action="store_true",
        help="the operator's phase opens the first round (at N=5,000 each phase takes ~25 min: its figure comes first)",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    session = Run("connect_scale")
    info = session.stack()
    api = config.new_client_from_config(config_file=info.kubeconfig)
    crds.apply(api)
    workdir = Path(tempfile.mkdtemp(prefix="fibers-bench-"))
    os.chmod(workdir, 0o755)
    source = workdir / "source.txt"
    source.write_text("".join(f"line {i}\n" for i in range(10)))
    proxy = CountingProxy(info.connect_url, workdir / "proxy-journal.txt")
    # Each of Connect's workers apart (FIBERS_CONNECT_WORKERS starts more than one: see fibers_stack.kafka).
    pids = {name: pid for name, pid in info.pids.items() if name in CHARGED or name.startswith("kafka-connect-")}
    proxy_url = proxy.start()
    results: dict[str, Any] = {"interval_seconds": args.interval}
    with httpx.Client(base_url=proxy_url, timeout=60) as connect:  # both paths go through the proxy
        # Unmeasured: the first connectors after Connect starts are slow (class loading, JIT).
        say("warming Kafka Connect up: 50 connectors, not measured")
        floor_run(connect, 50, source, f"warmup-{uuid.uuid4().hex[:4]}", pids, proxy.journal)
        delete_topics(info.kafka_bootstrap, "warmup-")
        for n in sizes:
            tally = Tally()

            def floor_phase(round_: int, n: int = n, tally: Tally = tally) -> None:
                prefix = f"floor{n}-{uuid.uuid4().hex[:4]}"
                elapsed, parts = floor_run(connect, n, source, prefix, pids, proxy.journal)
                tally.floors.append(elapsed)
                tally.floor_parts.append(parts)
                delete_topics(info.kafka_bootstrap, prefix)
                say(f"N={n} round {round_ + 1}: floor {elapsed:.1f}s: {json.dumps(tally.floor_parts[-1])}")

            def operator_phase(round_: int, n: int = n, tally: Tally = tally) -> None:
                first = not tally.readies  # the steady-state figures come from the first operator run
                run = operator_run(info, api, n, source, args.interval, proxy, proxy_url, workdir, first, pids)
                tally.readies.append(run["ready_seconds"])
                tally.operator_parts.append(run.pop("breakdown"))
                tally.figures = tally.figures or run

            for round_ in range(args.rounds):
                # Alternating, in turn first (ABBA): drift in the stack, and what a phase leaves Connect and
                # Kafka to finish (rebalances, topic deletions), then weigh on both alike.
                phases = (floor_phase, operator_phase)
                if (round_ + args.operator_first) % 2:
                    phases = (operator_phase, floor_phase)
                for phase in phases:
                    say(f"N={n}: the stack was quiet after {stack_quiet(pids):.0f}s")
                    phase(round_)
            figures = tally.figures
            figures["ready_seconds"] = [round(r, 1) for r in tally.readies]
            figures["floor_seconds"] = [round(f, 1) for f in tally.floors]
            figures["ready_ratio"] = round(statistics.median(tally.readies) / statistics.median(tally.floors), 2)
            figures["floor_breakdown"] = tally.floor_parts
            figures["operator_breakdown"] = tally.operator_parts
            results[str(n)] = figures
            say(f"N={n}: {json.dumps(figures)}")
    largest = results[str(max(sizes))]
    results["goals"] = {
        "ready_ratio_le_1.15": all(results[str(n)]["ready_ratio"] <= 1.15 for n in sizes),
        "steady_calls_independent_of_n": len({round(results[str(n)]["steady_calls_per_interval"]) for n in sizes}) == 1,
        "rss_le_120_mib_at_largest": largest["operator_rss_mib"] <= 120,
        "series_back_to_baseline": all(
            results[str(n)]["metrics_resource_series_after_delete"] == results[str(n)]["metrics_resource_series_before"]
            for n in sizes
        ),
    }
    session.report(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
