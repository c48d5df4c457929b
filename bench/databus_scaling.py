"""Benchmark: a DatabusConsumer's callbacks in parallel, and its instances rescaled while they consume.

In one run it measures:
  two_callbacks_ratio — windows per second of the runtime with two callbacks (each on its own thread of the
                     callback driver, every window to both) against the same runtime with one, alternating
                     over `--rounds` rounds, medians (goal ≥ 0.9): with no-op callbacks, where both threads
                     run Python code only and so take turns under the interpreter lock (the floor), and
                     with Kafka sinks (two feeds of the stream vs one), whose waits for Kafka overlap;
  rescale          — real consumer pods on the node (the job image, a log sink) reading a topic of
                     `--partitions` partitions written at `--rate` events/s, scaled 1 → 3 → 2 → 4 through the
                     scale subresource (what `kubectl scale` does): for each step the seconds from the scale
                     call until every partition's Lease is held by the pod that should have it (goal ≤ 10 s),
                     and the events/s the consumer took through that time (from its checkpoints).
The last line printed is one JSON object with every figure.

    .venv/bin/python -m bench.databus_scaling [--events 500000] [--sink-events 200000] [--rounds 3] [--rate 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import client, config

import fibers_stack as stack
from bench.databus_throughput import produce, run_runtime
from bench.machine import Run, operator_process, say
from fibers import kubeapi
from fibers.consumer.ownership import lease_name
from fibers.databus.checkpoint import Checkpoint
from fibers_stack import crds, namespaces

NOOP = "bench.databus_throughput:NoopSink"


def callbacks_rate(info: stack.StackInfo, api: kubeapi.Api, topic: str, events: int, count: int) -> float:
    sinks = [{"type": "callback", "callback": NOOP, "name": f"noop{i}"} for i in range(count)]
    rate, _ = run_runtime(info, api, topic, events, None, sinks=sinks)
    return rate


def kafka_sinks_rate(info: stack.StackInfo, api: kubeapi.Api, topic: str, events: int, count: int) -> float:
    feed = f"bench-feed-{uuid.uuid4().hex[:6]}"
    sinks = [{"type": "kafka", "topic": f"{feed}-{i}", "name": f"feed{i}"} for i in range(count)]
    rate, _ = run_runtime(info, api, topic, events, None, sinks=sinks)
    AdminClient({"bootstrap.servers": info.kafka_bootstrap}).delete_topics([s["topic"] for s in sinks])
    return rate


def ratio_rounds(rounds: int, one: Callable[[], float], two: Callable[[], float], what: str) -> dict[str, Any]:
    """Alternating rounds of one sink and two (the machine's load drifts alike for both); medians."""
    ones, twos = [], []
    for round_ in range(rounds):
        ones.append(one())
        twos.append(two())
        say(f"round {round_ + 1}, {what}: one {ones[-1]:.0f} windows/s, two in parallel {twos[-1]:.0f} windows/s")
    figures = {"one_wps": round(statistics.median(ones)), "two_wps": round(statistics.median(twos))}
    return {**figures, "ratio": round(figures["two_wps"] / figures["one_wps"], 2)}


class Load:
    """`rate` events/s to the partitions in turn, in a thread, until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: int) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic, self.partitions, self.rate, self.sent = topic, partitions, rate, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        started = time.monotonic()
        while not self.stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while self.sent < due:
                key, value = str(self.sent).encode(), json.dumps({"id": self.sent}).encode()
                self.producer.produce(self.topic, key=key, value=value, partition=self.sent % self.partitions)
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.01)
        self.producer.flush(30)


def consumed(core: client.CoreV1Api, namespace: str, name: str) -> int:
    """Events the consumer has checkpointed: the sum of its timelines' next offsets."""
    try:
        data = core.read_namespaced_config_map(f"{name}-checkpoint", namespace).data or {}
    except client.ApiException:
        return 0
    total = 0
    for key, value in data.items():
        if key != "sources.sha256":
            offset = Checkpoint.parse(value).get("kafka_next_offset")
            total += offset if isinstance(offset, int) else 0
    return total


def owned_as_wanted(api: client.ApiClient, namespace: str, name: str, topic: str, partitions: int, n: int) -> bool:
    leases = {
        lease.metadata.name: (lease.spec.holder_identity or "").split("_")[0]
        for lease in client.CoordinationV1Api(api).list_namespaced_lease(namespace).items
    }
    return all(leases.get(lease_name(name, topic, p)) == f"{name}-{p % n}" for p in range(partitions))


def delete_consumer(custom: client.CustomObjectsApi, namespace: str, name: str) -> None:
    custom.delete_namespaced_custom_object("fibers.dev", "v1beta1", namespace, "databusconsumers", name)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            custom.get_namespaced_custom_object("fibers.dev", "v1beta1", namespace, "databusconsumers", name)
        except client.ApiException:
            return
        time.sleep(0.5)


def rescale(info: stack.StackInfo, partitions: int, rate: int, steps: list[int]) -> list[dict[str, Any]]:
    api = config.new_client_from_config(config_file=info.kubeconfig)
    crds.apply(api)
    namespace, name = f"bench-{uuid.uuid4().hex[:6]}", "scaled"
    namespaces.create(api, namespace)
    topic = f"bench-scale-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": info.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    log = Path(tempfile.mkdtemp(prefix="fibers-bench-")) / "operator.log"
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    load = Load(info.kafka_bootstrap, topic, partitions, rate)
    figures: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack_:
        stack_.callback(core.delete_namespace, namespace)
        stack_.callback(load.stop.set)
        stack_.enter_context(operator_process(info, namespace, log))
        stack_.callback(delete_consumer, custom, namespace, name)  # while the operator runs: its finalizer
        body = {
            "apiVersion": "fibers.dev/v1beta1",
            "kind": "DatabusConsumer",
            "metadata": {"name": name},
            "spec": {
                "sources": [topic],
                "startPosition": "earliest",
                "instances": 1,
                "sink": {"type": "log", "quiet": True},
                "checkpoint": {"minIntervalSeconds": 0.5},
            },
        }
        custom.create_namespaced_custom_object("fibers.dev", "v1beta1", namespace, "databusconsumers", body)
        deadline = time.monotonic() + 180
        while not owned_as_wanted(api, namespace, name, topic, partitions, 1):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the first pod did not take the partitions (operator log: {log})")
            time.sleep(0.2)
        load.thread.start()
        time.sleep(5)
        for n in steps:
            before, started = consumed(core, namespace, name), time.monotonic()
            custom.patch_namespaced_custom_object_scale(
                "fibers.dev", "v1beta1", namespace, "databusconsumers", name, {"spec": {"replicas": n}}
            )
            while not owned_as_wanted(api, namespace, name, topic, partitions, n):
                if time.monotonic() - started > 180:
                    raise RuntimeError(f"scaling to {n}: partitions not handed over in 180 s")
                time.sleep(0.1)
            seconds = time.monotonic() - started
            time.sleep(1)  # the checkpoints of the last second through the handover
            through = (consumed(core, namespace, name) - before) / (time.monotonic() - started)
            figures.append({"to": n, "handover_seconds": round(seconds, 1), "events_per_s": round(through)})
            say(f"scaled to {n}: every partition owned again after {seconds:.1f}s; {through:.0f} events/s through it")
            time.sleep(5)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--sink-events", type=int, default=200_000, help="events through the Kafka sinks")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args()

    session = Run("databus_scaling")
    info = session.stack()
    api = kubeapi.Api(kubeapi.from_kubeconfig(info.kubeconfig))
    topic = f"bench-{uuid.uuid4().hex[:6]}"
    say(f"producing {args.events} records to {topic}")
    produce(info.kafka_bootstrap, topic, args.events)
    results: dict[str, Any] = {"events": args.events, "sink_events": args.sink_events}
    results["noop_callbacks"] = ratio_rounds(
        args.rounds,
        lambda: callbacks_rate(info, api, topic, args.events, 1),
        lambda: callbacks_rate(info, api, topic, args.events, 2),
        "no-op callbacks",
    )
    results["kafka_sinks"] = ratio_rounds(
        args.rounds,
        lambda: kafka_sinks_rate(info, api, topic, args.sink_events, 1),
        lambda: kafka_sinks_rate(info, api, topic, args.sink_events, 2),
        "Kafka sinks",
    )
    results["two_callbacks_ratio"] = results["noop_callbacks"]["ratio"]
    results["two_kafka_sinks_ratio"] = results["kafka_sinks"]["ratio"]
    say(f"rescaling real pods under {args.rate} events/s over {args.partitions} partitions")
    results["rescale"] = rescale(info, args.partitions, args.rate, [3, 2, 4])
    results["rate"] = args.rate
    results["goals"] = {
        "two_callbacks_ratio_ge_0.9": results["two_callbacks_ratio"] >= 0.9,
        "two_kafka_sinks_ratio_ge_0.9": results["two_kafka_sinks_ratio"] >= 0.9,
        "handover_le_10_s": all(step["handover_seconds"] <= 10 for step in results["rescale"]),
    }
    session.report(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
