"""Benchmark: the DatabusConsumer runtime against a plain Kafka consumer loop, on the local stack.

In one run it measures:
  plain_loop_eps   — a confluent-kafka loop reading the topic and decoding each value with
                     json.loads, as one would write it by hand (the limit);
  plain_loop_parse_json_eps — the same loop with the runtime's faster parser (orjson), to show
                     how much of the runtime's speed comes from the parser;
  noop_sink_eps    — the runtime (decode, windows, callbacks, checkpoints) with a sink that takes
                     each event and does nothing;
  mongodb_sink_eps — the runtime writing every event to MongoDB (FerretDB) with the SCN guard;
  noop_ratio       — noop_sink_eps / plain_loop_eps (goal ≥ 0.7); noop_ratio_same_parser is
                     the ratio against the loop with the runtime's parser;
  latency p50/p99  — from a PostgreSQL commit to the row appearing in MongoDB, through Debezium,
                     Kafka and the runtime;
  bootstrap_rows_per_s — rows delivered by a bootstrap (snapshot + catchup) from the store;
  configmap_writes_per_s — checkpoint writes per second per consumer (goal ≤ 1).
The last line printed is one JSON object with every figure.

    .venv/bin/python -m bench.databus_throughput [--events 500000] [--mongo-events 20000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition
from kubernetes import client, config
from pymongo import MongoClient

import fibers_stack as stack
from bench.machine import Run, say
from fibers.databus.callbacks import Callback, Result
from fibers.databus.config import ConsumerConfig
from fibers.databus.events import ChangeEvent, parse_json
from fibers.databus.runtime import Runtime
from fibers.databus.sinks import MongoSink
from fibers.databus.store import BootstrapStore


def produce(bootstrap: str, topic: str, n: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000})
    for i in range(n):
        producer.produce(topic, key=str(i % 10000).encode(), value=json.dumps({"id": i % 10000, "n": i}).encode())
        if i % 50000 == 0:
            producer.poll(0)
    producer.flush(120)


def plain_loop(bootstrap: str, topic: str, n: int, parse: Callable[[bytes], Any] = json.loads) -> float:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"plain-{uuid.uuid4()}", "enable.auto.commit": False}
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


class NoopSink(Callback):
    """A sink that takes every event and does nothing with it."""

    def on_data_event(self, event: ChangeEvent) -> Result:
        return Result.SUCCESS


def run_runtime(
    info: stack.StackInfo, core: client.CoreV1Api, topic: str, n: int, callback: Callback, **extra: Any
) -> tuple[float, float]:
    """Run the runtime in a thread until it has processed n events: (events/s, ConfigMap writes/s)."""
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
    runtime = Runtime(cfg, core, callback=callback)
    started = time.monotonic()
    thread = threading.Thread(target=runtime.run, daemon=True)
    thread.start()
    deadline = started + 1800
    while runtime.events_processed < n and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    elapsed = time.monotonic() - started
    writes = runtime.store.writes  # during consumption (the flush at shutdown is not throttled)
    runtime.stopping = True
    thread.join(60)
    if runtime.events_processed < n:
        raise RuntimeError(f"the runtime processed {runtime.events_processed} of {n} events")
    core.delete_namespaced_config_map(f"{name}-checkpoint", "default")
    return n / elapsed, writes / elapsed


def latency(info: stack.StackInfo, core: client.CoreV1Api, samples: int) -> dict[str, float]:
    """PostgreSQL commit → MongoDB document, through Debezium and the runtime."""
    table = f"lat_{uuid.uuid4().hex[:6]}"
    dsn = psycopg.conninfo.conninfo_to_dict(info.postgres_dsn)
    with psycopg.connect(info.postgres_dsn, autocommit=True) as pg:
        pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
        connect = httpx.Client(base_url=info.connect_url, timeout=30)
        connect.post(
            "/connectors",
            json={
                "name": table,
                "config": {
                    "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
                    "plugin.name": "pgoutput",
                    "database.hostname": str(dsn["host"]),
                    "database.port": str(dsn["port"]),
                    "database.user": "postgres",
                    "database.password": "x",
                    "database.dbname": "postgres",
                    "topic.prefix": table,
                    "table.include.list": f"public.{table}",
                    "slot.name": table,
                    "publication.name": table,
                    "publication.autocreate.mode": "filtered",
                    "provide.transaction.metadata": "true",
                    "poll.interval.ms": "50",
                },
            },
        ).raise_for_status()
        time.sleep(10)
        pg.execute(f"INSERT INTO {table} VALUES (-1, 'warm-up')")
        topic = f"{table}.public.{table}"
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": info.kafka_bootstrap})
        deadline = time.monotonic() + 120
        while topic not in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
            time.sleep(0.5)  # Debezium creates the topic with its first event
        mongo: MongoClient[dict[str, Any]] = MongoClient(info.mongodb_uri)
        import os

        os.environ["BENCH_MONGO"] = info.mongodb_uri
        sink = MongoSink("BENCH_MONGO", "bench", table)
        name = f"lat-{uuid.uuid4().hex[:6]}"
        cfg = ConsumerConfig.from_dict(
            {
                "name": name,
                "namespace": "default",
                "relay": {"bootstrapServers": info.kafka_bootstrap, "topics": [topic]},
                "sink": {"type": "log"},
                "checkpoint": {"configMapName": f"{name}-checkpoint"},
                "startPosition": "earliest",
            }
        )
        runtime = Runtime(cfg, core, callback=sink)
        thread = threading.Thread(target=runtime.run, daemon=True)
        thread.start()
        collection = mongo["bench"][table]
        deadline = time.monotonic() + 60
        while collection.find_one({"_id": "-1"}) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        delays = []
        for i in range(samples):
            pg.execute(f"INSERT INTO {table} VALUES (%s, 'x')", (i,))
            committed = time.monotonic()
            while collection.find_one({"_id": str(i)}) is None:
                time.sleep(0.002)
            delays.append((time.monotonic() - committed) * 1000)
        runtime.stopping = True
        thread.join(30)
        connect.delete(f"/connectors/{table}")
        core.delete_namespaced_config_map(f"{name}-checkpoint", "default")
    quantiles = statistics.quantiles(delays, n=100)
    return {"latency_p50_ms": round(statistics.median(delays), 1), "latency_p99_ms": round(quantiles[98], 1)}


def bootstrap_rate(info: stack.StackInfo, core: client.CoreV1Api, rows: int) -> float:
    """Fill a store directly, then time a consumer bootstrapping from it."""
    import os

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
        core,
        topic,
        rows,
        NoopSink(),
        startPosition="bootstrap",
        bootstrap={"uriEnv": "BENCH_STORE", "database": f"{topic.replace('-', '_')}store"},
    )
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--mongo-events", type=int, default=20_000)
    parser.add_argument("--latency-samples", type=int, default=100)
    parser.add_argument("--bootstrap-rows", type=int, default=20_000)
    args = parser.parse_args()

    session = Run("databus_throughput")
    say("starting (or reusing) the local stack")
    info = stack.up()
    core = client.CoreV1Api(config.new_client_from_config(config_file=info.kubeconfig))
    topic = f"bench-{uuid.uuid4().hex[:6]}"
    say(f"producing {args.events} records to {topic}")
    produce(info.kafka_bootstrap, topic, args.events)

    results: dict[str, Any] = {"events": args.events}
    results["plain_loop_eps"] = round(plain_loop(info.kafka_bootstrap, topic, args.events))
    say(f"plain loop: {results['plain_loop_eps']} events/s")
    results["plain_loop_parse_json_eps"] = round(plain_loop(info.kafka_bootstrap, topic, args.events, parse_json))
    say(f"plain loop with the runtime's JSON parser: {results['plain_loop_parse_json_eps']} events/s")
    noop, writes = run_runtime(info, core, topic, args.events, NoopSink())
    results["noop_sink_eps"] = round(noop)
    results["configmap_writes_per_s"] = round(writes, 2)
    results["noop_ratio"] = round(noop / results["plain_loop_eps"], 2)
    results["noop_ratio_same_parser"] = round(noop / results["plain_loop_parse_json_eps"], 2)
    say(f"runtime, no-op sink: {results['noop_sink_eps']} events/s, {writes:.2f} ConfigMap writes/s")

    import os

    os.environ["BENCH_MONGO"] = info.mongodb_uri
    mongo_topic = f"benchm-{uuid.uuid4().hex[:6]}"
    produce(info.kafka_bootstrap, mongo_topic, args.mongo_events)
    sink = MongoSink("BENCH_MONGO", "bench", mongo_topic.replace("-", "_"))
    mongo_rate, _ = run_runtime(info, core, mongo_topic, args.mongo_events, sink)
    results["mongodb_sink_eps"] = round(mongo_rate)
    say(f"runtime, MongoDB sink: {results['mongodb_sink_eps']} events/s")

    results.update(latency(info, core, args.latency_samples))
    say(f"latency: {results['latency_p50_ms']} ms p50, {results['latency_p99_ms']} ms p99")
    results["bootstrap_rows_per_s"] = round(bootstrap_rate(info, core, args.bootstrap_rows))
    say(f"bootstrap: {results['bootstrap_rows_per_s']} rows/s")
    results["goals"] = {
        "noop_ratio_ge_0.7": results["noop_ratio"] >= 0.7,
        "configmap_writes_le_1_per_s": results["configmap_writes_per_s"] <= 1.0,
    }
    session.report(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
