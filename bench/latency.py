"""Benchmark: PostgreSQL commit → MongoDB document at a steady rate, and where the time goes.

For each rate (10 and 1,000 changes/s by default), on the local stack:
  - a table and a Debezium connector with the settings `examples/01-connect-orders-cdc.yaml`
    ships (plus `--debezium key=value` overrides, to try others); the topic is created first with
    message.timestamp.type=LogAppendTime, so each record carries the time Kafka appended it;
  - the DatabusConsumer runtime writing every change to MongoDB (FerretDB) with its MongoDB sink,
    watched by a wrapper that notes when each change reached the callbacks and when its write
    returned;
  - writers in processes of their own (`--writers`, 1 by default: one connection commits only
    ~2,100-2,500 rows/s here) inserting one row per transaction at the rate, noting when each
    commit returned.
Per change, the phases (p50/p99 of each):
  debezium  commit returned → Debezium read it (the envelope's ts_ms);
  kafka     Debezium read it → Kafka appended it (Connect's producer);
  consumer  Kafka appended it → the callbacks got it (fetch, decode, the window closing);
  sink      the callbacks got it → MongoDB acknowledged the write;
  total     commit returned → written.
The last line printed is one JSON object with every figure.

    .venv/bin/python -m bench.latency [--rates 10,1000] [--seconds 20] [--writers 1] [--debezium poll.interval.ms=10]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import multiprocessing
import os
import statistics
import threading
import time
import uuid
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import psycopg
import yaml
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import fibers_stack as stack
from bench.databus_throughput import remove_state
from bench.machine import Run, say
from fibers import kubeapi
from fibers.consumer.callbacks import Result
from fibers.consumer.events import ChangeEvent
from fibers.consumer.runtime import Runtime
from fibers.consumer.sinks import MongoSink
from fibers.databus.config import ConsumerConfig
from tests.helpers import drop_slot

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "01-connect-orders-cdc.yaml"
PHASES = ("debezium", "kafka", "consumer", "sink", "total")


class TimedMongoSink(MongoSink):
    """The MongoDB sink, noting per row id when its change reached the callbacks and when it was written."""

    def __init__(self, uri_env: str, database: str, collection: str) -> None:
        super().__init__(uri_env, database, collection)
        self.received: dict[int, float] = {}
        self.written: dict[int, float] = {}
        self.offsets: dict[int, int] = {}
        self.debezium_ms: dict[int, int] = {}
        self._batch: list[int] = []

    def on_data_event(self, event: ChangeEvent) -> Result:
        now = time.time()
        row = int((event.after or {}).get("id", -1))
        self.received[row] = now
        self.offsets[row] = event.offset
        self.debezium_ms[row] = int((event.raw or {}).get("ts_ms") or 0)
        self._batch.append(row)
        return super().on_data_event(event)

    def on_end_batch(self) -> None:
        super().on_end_batch()
        now = time.time()
        for row in self._batch:
            self.written[row] = now
        self._batch = []


def writer(dsn: str, table: str, rate: float, rows: range, out: Connection) -> None:
    """In its own process (no GIL shared with the consumer): one INSERT per transaction, at the rate,
    for the row ids in `rows` (every `writers`-th id when several share the rate)."""
    commits: dict[int, float] = {}
    with psycopg.connect(dsn, autocommit=True) as pg:
        started = time.monotonic()
        for i in rows:
            delay = started + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pg.execute(f"INSERT INTO {table} VALUES (%s, 'x')", (i,))
            commits[i] = time.time()
    out.send(commits)


def write(dsn: str, table: str, rate: float, count: int, writers: int) -> dict[int, float]:
    """Rows 0..count-1 at `rate`, spread over `writers` connections (one commits ~2,100-2,500/s here)."""
    pipes, procs = [], []
    for k in range(writers):
        receiver, sender = multiprocessing.Pipe(duplex=False)
        rows = range(k, count, writers)
        procs.append(multiprocessing.Process(target=writer, args=(dsn, table, rate, rows, sender)))
        pipes.append(receiver)
    for proc in procs:
        proc.start()
    commits: dict[int, float] = {}
    for receiver in pipes:
        commits.update(receiver.recv())
    for proc in procs:
        proc.join()
    return commits


def connector_config(info: stack.StackInfo, table: str, overrides: dict[str, str]) -> dict[str, str]:
    """The example's Debezium settings, pointed at this table."""
    example = yaml.safe_load(EXAMPLE.read_text())
    dsn = psycopg.conninfo.conninfo_to_dict(info.postgres_dsn)
    return {
        "connector.class": example["spec"]["class"],
        **{k: str(v) for k, v in example["spec"]["config"].items()},
        "database.hostname": str(dsn["host"]),
        "database.port": str(dsn["port"]),
        "database.user": "postgres",
        "database.password": "unused",
        "database.dbname": "postgres",
        "topic.prefix": table,
        "table.include.list": f"public.{table}",
        "slot.name": table,
        "publication.name": table,
        **overrides,
    }


def append_times(bootstrap: str, topic: str, offsets: list[int]) -> dict[int, float]:
    """Kafka's append time (LogAppendTime) of each record, by offset."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"lat-{uuid.uuid4()}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    wanted, times = set(offsets), {}
    deadline = time.monotonic() + 60
    while wanted - times.keys() and time.monotonic() < deadline:
        for message in consumer.consume(1000, timeout=1):
            if message.error() is None:
                times[message.offset()] = message.timestamp()[1] / 1000
    consumer.close()
    return times


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50_ms": round(statistics.median(ordered), 1), "p99_ms": round(p99, 1)}


def measure(
    info: stack.StackInfo, api: kubeapi.Api, rate: float, seconds: float, overrides: dict[str, str], writers: int = 1
) -> dict[str, Any]:
    table = f"lat_{uuid.uuid4().hex[:6]}"
    topic = f"{table}.public.{table}"
    count = int(rate * seconds)
    admin = AdminClient({"bootstrap.servers": info.kafka_bootstrap})
    new = NewTopic(topic, num_partitions=1, replication_factor=1, config={"message.timestamp.type": "LogAppendTime"})
    admin.create_topics([new])[topic].result()
    connect = httpx.Client(base_url=info.connect_url, timeout=30)
    os.environ["BENCH_MONGO"] = info.mongodb_uri
    sink = TimedMongoSink("BENCH_MONGO", "bench", table)
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
    runtime = Runtime(cfg, api, callback=sink)
    with psycopg.connect(info.postgres_dsn, autocommit=True) as pg:
        pg.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
        connect.post("/connectors", json={"name": table, "config": connector_config(info, table, overrides)})
        thread = threading.Thread(target=runtime.run, daemon=True)
        thread.start()
        try:
            # Warm up: the connector's first change (its snapshot, its slot) is not what is measured.
            deadline = time.monotonic() + 120
            while -1 not in sink.written and time.monotonic() < deadline:
                pg.execute(f"INSERT INTO {table} VALUES (-1, 'warm-up') ON CONFLICT DO NOTHING")
                time.sleep(0.5)
            if -1 not in sink.written:
                raise RuntimeError(
                    f"no change reached MongoDB within 120 s ({connect.get(f'/connectors/{table}/status').text})"
                )
            say(f"{rate:g}/s: connector streaming; writing {count} rows over {seconds:g} s ({writers} writers)")
            commits = write(info.postgres_dsn, table, rate, count, writers)
            deadline = time.monotonic() + 120
            while len(sink.written) <= count and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            runtime.stop()
            thread.join(30)
            connect.delete(f"/connectors/{table}")
            drop_slot(info.postgres_dsn, table)  # max_replication_slots is small: leave none behind
            pg.execute(f"DROP TABLE {table}")
            with contextlib.suppress(kubeapi.ApiError):
                remove_state(api, runtime)
    missing = [i for i in range(count) if i not in sink.written]
    if missing:
        raise RuntimeError(f"{len(missing)} of {count} changes never reached MongoDB")
    appended = append_times(info.kafka_bootstrap, topic, [sink.offsets[i] for i in range(count)])
    phases: dict[str, list[float]] = {p: [] for p in PHASES}
    for i in range(count):
        read, append = sink.debezium_ms[i] / 1000, appended[sink.offsets[i]]
        marks = (commits[i], read, append, sink.received[i], sink.written[i])
        for phase, (start, end) in zip(PHASES, itertools.pairwise(marks), strict=False):
            phases[phase].append((end - start) * 1000)
        phases["total"].append((sink.written[i] - commits[i]) * 1000)
    result = {phase: quantiles(values) for phase, values in phases.items()}
    result["achieved_rate"] = round(count / (max(commits.values()) - min(commits.values())), 1)
    # The rate Debezium read the changes at: below the writers' rate, it is the floor, not Fibers.
    read_ms = [sink.debezium_ms[i] for i in range(count)]
    result["debezium_rate"] = round(count / max(0.001, (max(read_ms) - min(read_ms)) / 1000), 1)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="10,1000")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--writers", type=int, default=1, help="connections sharing the rate (one tops out here)")
    parser.add_argument("--debezium", action="append", default=[], help="key=value, over the example's settings")
    args = parser.parse_args()
    overrides = dict(item.split("=", 1) for item in args.debezium)
    session = Run("latency")
    info = session.stack()
    api = kubeapi.Api(kubeapi.from_kubeconfig(info.kubeconfig))
    results: dict[str, Any] = {"seconds": args.seconds, "writers": args.writers, "debezium_overrides": overrides}
    for rate in (float(r) for r in args.rates.split(",")):
        figures = measure(info, api, rate, args.seconds, overrides, args.writers)
        results[f"{rate:g}/s"] = figures
        say(
            f"{rate:g}/s (writers reached {figures['achieved_rate']:g}/s, Debezium read "
            f"{figures['debezium_rate']:g}/s): total p50 {figures['total']['p50_ms']} ms, "
            f"p99 {figures['total']['p99_ms']} ms; " + ", ".join(f"{p} p99 {figures[p]['p99_ms']}" for p in PHASES[:-1])
        )
    results["goals"] = {
        "p99_le_150ms": all(v["total"]["p99_ms"] <= 150 for k, v in results.items() if k.endswith("/s"))
    }
    session.report(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
