"""Benchmark: the DatabusConsumer runtime against a plain Kafka consumer loop, on the local stack.

In one run it measures:
  plain_loop_eps   — a confluent-kafka loop reading the topic and decoding each value with
                     json.loads, as one would write it by hand (the limit);
  plain_loop_parse_json_eps — the same loop with the runtime's faster parser (orjson), to show
                     how much of the runtime's speed comes from the parser;
  noop_sink_eps    — the runtime (decode, windows, callbacks, checkpoints) with a sink that takes
                     each event and does nothing;
  noop_sink_metrics_eps — the same with the pod's metrics kept and served, scraped every second (a
                     Prometheus scrapes every 5-30 s); metrics_ratio = the median over rounds of this /
                     noop_sink_eps of the same round (goal ≥ 0.98);
  mongodb_sink_eps — the runtime writing every event to MongoDB (FerretDB) with the SCN guard;
  plain_loop_same_settings_eps — that loop with the runtime's librdkafka settings as well
                     (fibers.consumer.tuning.KAFKA_CONSUMER): what is left is the runtime's own cost;
  noop_ratio       — noop_sink_eps / plain_loop_eps (goal ≥ 1.0); noop_ratio_same_parser is
                     the ratio against the loop with the runtime's parser (goal ≥ 0.95), and
                     noop_ratio_same_settings against the loop with its parser and settings (goal ≥ 0.9:
                     the runtime's own cost; a profile of where it goes is in docs/benchmarks.md);
                     all four alternate over `--rounds` rounds, each figure the median;
  plain_mongo_bulk_eps — a hand-written loop upserting the same records with pymongo bulk writes;
  mongodb_ratio    — mongodb_sink_eps / plain_mongo_bulk_eps (goal ≥ 1.0): our overhead, not FerretDB's;
  bootstrap_rows_per_s — rows delivered by a bootstrap (snapshot + catchup) from the store;
  configmap_writes_per_s — checkpoint writes per second per consumer after its first one, which the
                     throttle lets through at once (goal ≤ 1: one write per minIntervalSeconds).
The last line printed is one JSON object with every figure.

    .venv/bin/python -m bench.databus_throughput [--events 2000000] [--mongo-events 4000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from pymongo import MongoClient, ReplaceOne

import fibers_stack as stack
from bench.machine import Run, free_port, say
from fibers import kubeapi
from fibers.consumer import tuning
from fibers.consumer.callbacks import Callback, Result
from fibers.consumer.events import ChangeEvent, parse_json
from fibers.consumer.ownership import lease_name
from fibers.consumer.runtime import Runtime
from fibers.consumer.sinks import MongoSink
from fibers.consumer.store import BootstrapStore, bulk_write
from fibers.databus.config import ConsumerConfig


def produce(bootstrap: str, topic: str, n: int, keys: int = 10_000) -> None:
    """n records over `keys` keys in turn: the first `keys` records are new rows, the rest updates."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000})
    for i in range(n):
        key, value = str(i % keys).encode(), json.dumps({"id": i % keys, "n": i}).encode()
        try:
            producer.produce(topic, key=key, value=value)
        except BufferError:  # the local queue is full (a broker just started is slow): let it drain
            producer.poll(1)
            producer.produce(topic, key=key, value=value)
        if i % 10000 == 0:
            producer.poll(0)
    producer.flush(120)


def plain_loop(
    bootstrap: str, topic: str, n: int, parse: Callable[[bytes], Any] = json.loads, **settings: Any
) -> float:
    """Read n records with a hand-written confluent-kafka loop, parsing each value (events/s)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"plain-{uuid.uuid4()}", "enable.auto.commit": False, **settings}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen, started = 0, time.monotonic()
    while seen < n:
        for message in consumer.consume(1000, timeout=1):
            if message.error() is None:
                parse(message.value() or b"")
                seen += 1
    elapsed = time.monotonic() - started
    consumer.close()
    return n / elapsed


def plain_mongo(bootstrap: str, topic: str, n: int, uri: str) -> float:
    """A hand-written loop: read the topic, json.loads each value, bulk upsert each batch by key (events/s)."""
    collection = MongoClient(uri)["bench"][f"plain_{uuid.uuid4().hex[:6]}"]
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"plain-{uuid.uuid4()}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen, started = 0, time.monotonic()
    while seen < n:
        latest = {}
        for message in consumer.consume(1000, timeout=1):
            if message.error() is None:
                latest[(message.key() or b"").decode()] = json.loads(message.value() or b"")
                seen += 1
        writes = [ReplaceOne({"_id": k}, doc, upsert=True) for k, doc in latest.items()]
        bulk_write(collection, writes)  # in chunks: FerretDB v1 hangs on larger bulks of replaces
    elapsed = time.monotonic() - started
    consumer.close()
    return n / elapsed


class NoopSink(Callback):
    """A sink that takes every event and does nothing with it."""

    def on_data_event(self, event: ChangeEvent) -> Result:
        return Result.SUCCESS


def run_runtime(
    info: stack.StackInfo,
    api: kubeapi.Api,
    topic: str,
    n: int,
    callback: Callback | None,
    *,
    scraped: bool = False,
    **extra: Any,
) -> tuple[float, float]:
    """Run the runtime in a thread until it has processed n events: (events/s, ConfigMap writes/s).

    `callback`: the one sink; None runs the sinks `extra` configures (`sinks=[…]`). `scraped`: with the
    pod's metrics, served and scraped every second while it runs."""
    name = f"bench-{uuid.uuid4().hex[:6]}"
    cfg = ConsumerConfig.from_dict(
        {
            "name": name,
            "namespace": "default",
            "relay": {"bootstrapServers": info.kafka_bootstrap, "topics": [topic]},
            "sink": {"type": "log", "quiet": True},
            "checkpoint": {"configMapName": f"{name}-checkpoint"},
            "startPosition": "earliest",
            **extra,
        }
    )
    runtime = Runtime(cfg, api, callback=callback, telemetry=scraped)
    scrapes: list[int] = []
    if runtime.telemetry:
        port = free_port()
        runtime.telemetry.serve(port)
    tuning.settle_collector()  # as `fibers consume` does before it runs the consumer
    started = time.monotonic()
    thread = threading.Thread(target=runtime.run, daemon=True)
    thread.start()
    deadline = started + 1800
    next_scrape = started + 1
    while runtime.events_processed < n and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
        if runtime.telemetry and time.monotonic() >= next_scrape:
            scrapes.append(len(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()))
            next_scrape += 1
    elapsed = time.monotonic() - started
    if runtime.telemetry and not scrapes:
        raise RuntimeError("the run ended before its first scrape: produce more events")
    # During consumption, after the first write (the flush at shutdown is not throttled).
    writes = max(runtime.store.writes - 1, 0)
    runtime.stop()
    thread.join(60)
    if runtime.events_processed < n:
        raise RuntimeError(f"the runtime processed {runtime.events_processed} of {n} events")
    remove_state(api, runtime)
    return n / elapsed, writes / elapsed


def remove_state(api: kubeapi.Api, runtime: Runtime) -> None:
    """What a runtime run in a benchmark leaves behind: its checkpoint ConfigMap and its partitions' Leases."""
    config = runtime.config
    api.delete(kubeapi.path("v1", "configmaps", config.namespace, config.checkpoint_config_map))
    for topic, partitions in runtime.partitions.items():
        for partition in partitions:
            name = lease_name(config.name, topic, partition)
            api.delete(kubeapi.path("coordination.k8s.io/v1", "leases", config.namespace, name))


def bootstrap_rate(info: stack.StackInfo, api: kubeapi.Api, rows: int) -> float:
    """Fill a store directly, then time a consumer bootstrapping from it."""
    topic = f"boot-{uuid.uuid4().hex[:6]}"
    produce(info.kafka_bootstrap, topic, 1)  # the relay topic must exist
    mongo: MongoClient[dict[str, Any]] = MongoClient(info.mongodb_uri)
    store = BootstrapStore(mongo[f"{topic.replace('-', '_')}store"])
    for start in range(0, rows, 5000):
        store.apply_window(
            [
                ChangeEvent(
                    topic=topic,
                    partition=0,
                    offset=i,
                    key=str(i),
                    op="c",
                    scn=i + 1,
                    window="w",
                    after={"id": i, "v": "x" * 20},
                )
                for i in range(start, min(start + 5000, rows))
            ]
        )
    os.environ["BENCH_STORE"] = info.mongodb_uri
    rate, _ = run_runtime(
        info,
        api,
        topic,
        rows,
        NoopSink(),
        startPosition="bootstrap",
        bootstrap={"uriEnv": "BENCH_STORE", "database": f"{topic.replace('-', '_')}store"},
    )
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--mongo-events", type=int, default=4_000)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of the loops; medians")
    parser.add_argument("--bootstrap-rows", type=int, default=20_000)
    args = parser.parse_args()

    session = Run("databus_throughput")
    info = session.stack()
    api = kubeapi.Api(kubeapi.from_kubeconfig(info.kubeconfig))
    topic = f"bench-{uuid.uuid4().hex[:6]}"
    say(f"producing {args.events} records to {topic}")
    produce(info.kafka_bootstrap, topic, args.events)

    results: dict[str, Any] = {"events": args.events, "rounds": args.rounds}
    plain, plain_json, plain_tuned, noop, noop_metrics, writes = [], [], [], [], [], []
    for round_ in range(args.rounds):  # alternating: the load of the machine drifts alike for all four
        plain.append(plain_loop(info.kafka_bootstrap, topic, args.events))
        plain_json.append(plain_loop(info.kafka_bootstrap, topic, args.events, parse_json))
        plain_tuned.append(plain_loop(info.kafka_bootstrap, topic, args.events, parse_json, **tuning.KAFKA_CONSUMER))
        # With and without metrics in turn, first one then the other: a run right after another is slower
        # or faster by more than the 2 % looked for (measured: ±10 % between runs of one variant).
        if round_ % 2:
            noop_metrics.append(run_runtime(info, api, topic, args.events, NoopSink(), scraped=True)[0])
        rate, write_rate = run_runtime(info, api, topic, args.events, NoopSink())
        noop.append(rate)
        writes.append(write_rate)
        if not round_ % 2:
            noop_metrics.append(run_runtime(info, api, topic, args.events, NoopSink(), scraped=True)[0])
        say(
            f"round {round_ + 1}: plain loop {plain[-1]:.0f}/s, with the runtime's parser {plain_json[-1]:.0f}/s, "
            f"and its librdkafka settings {plain_tuned[-1]:.0f}/s; "
            f"runtime with a no-op sink {rate:.0f}/s ({write_rate:.2f} ConfigMap writes/s), "
            f"with its metrics scraped {noop_metrics[-1]:.0f}/s"
        )
    results["plain_loop_eps"] = round(statistics.median(plain))
    results["plain_loop_parse_json_eps"] = round(statistics.median(plain_json))
    results["plain_loop_same_settings_eps"] = round(statistics.median(plain_tuned))
    results["noop_sink_eps"] = round(statistics.median(noop))
    results["noop_sink_metrics_eps"] = round(statistics.median(noop_metrics))
    # Paired: each round's two runs share that round's load, which drifts by more than the effect looked for.
    paired = [m / n for m, n in zip(noop_metrics, noop, strict=True)]
    results["metrics_ratio_rounds"] = [round(r, 3) for r in paired]
    results["metrics_ratio"] = round(statistics.median(paired), 3)
    results["configmap_writes_per_s"] = round(max(writes), 2)
    results["noop_ratio"] = round(results["noop_sink_eps"] / results["plain_loop_eps"], 2)
    results["noop_ratio_same_parser"] = round(results["noop_sink_eps"] / results["plain_loop_parse_json_eps"], 2)
    results["noop_ratio_same_settings"] = round(results["noop_sink_eps"] / results["plain_loop_same_settings_eps"], 2)

    os.environ["BENCH_MONGO"] = info.mongodb_uri
    mongo_topic = f"benchm-{uuid.uuid4().hex[:6]}"
    # Half new rows, half updates. FerretDB scans its collection for every update, so the figure is
    # FerretDB's more than ours: the same records through a plain pymongo loop tell the two apart.
    produce(info.kafka_bootstrap, mongo_topic, args.mongo_events, keys=args.mongo_events // 2)
    sink = MongoSink("BENCH_MONGO", "bench", mongo_topic.replace("-", "_"))
    mongo_rate, _ = run_runtime(info, api, mongo_topic, args.mongo_events, sink)
    results["mongodb_sink_eps"] = round(mongo_rate)
    say(f"runtime, MongoDB sink: {results['mongodb_sink_eps']} events/s")
    results["plain_mongo_bulk_eps"] = round(
        plain_mongo(info.kafka_bootstrap, mongo_topic, args.mongo_events, info.mongodb_uri)
    )
    results["mongodb_ratio"] = round(mongo_rate / results["plain_mongo_bulk_eps"], 2)
    say(f"plain pymongo bulk loop: {results['plain_mongo_bulk_eps']} events/s (ratio {results['mongodb_ratio']})")

    results["bootstrap_rows_per_s"] = round(bootstrap_rate(info, api, args.bootstrap_rows))
    say(f"bootstrap: {results['bootstrap_rows_per_s']} rows/s")
    results["goals"] = {
        "noop_ratio_ge_1.0": results["noop_ratio"] >= 1.0,
        "noop_ratio_same_parser_ge_0.95": results["noop_ratio_same_parser"] >= 0.95,
        "noop_ratio_same_settings_ge_0.9": results["noop_ratio_same_settings"] >= 0.9,  # issue 46
        "mongodb_ratio_ge_1.0": results["mongodb_ratio"] >= 1.0,
        "configmap_writes_le_1_per_s": results["configmap_writes_per_s"] <= 1.0,
        "metrics_ratio_ge_0.98": results["metrics_ratio"] >= 0.98,
    }
    session.report(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
