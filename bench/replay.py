"""Benchmark: a Replay's wall time against the records it replays, and against a first run of the same steps.

The pipeline has the demo's shape, without the database in front (Debezium's topic is what a Replay moves
back): a topic of N records read by a batch Transform (a count per key group, to Kafka), a DatabusConsumer
(a MongoDB view) and a sink connector (Kafka Connect's FileStreamSink), all labelled as one pipeline.
For each size, in paired rounds:
  fresh  — the pipeline created on the topic, every step from the earliest record: seconds until each has
           read all N (the Transform's run Succeeded, the consumer's checkpoints at N, the file at N lines);
  replay — a Replay of that pipeline from the earliest record (sinks reapply): seconds from its creation
           until it Succeeded and every step has read all N again; and the records it counted per step.
The ratio replay/fresh says what moving a pipeline back costs beyond reading the records again (each step
is stopped, repositioned and started in turn). The last line printed is one JSON object with every figure.

    .venv/bin/python -m bench.replay [--sizes 10000,100000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import client, config

import fibers_stack as stack
from bench.databus_scaling import consumed
from bench.machine import Run, operator_process, say, wait
from fibers_stack import crds, namespaces, platform_resources

GROUP, VERSION = "fibers.dev", "v1beta1"
STEP_TIMEOUT = 900.0  # a step that has not read everything in this long has failed the run...
STEP_SECONDS_PER_1000 = 60.0  # ...or in this long per thousand records, if longer: on FerretDB-on-SQLite a
# re-applied record costs a scan of the collection (every $in filter is documents x keys there), so a
# 100 k replay needs far more than 900 s; MongoDB's _id index does not


def step_timeout(size: int) -> float:
    return max(STEP_TIMEOUT, size / 1000 * STEP_SECONDS_PER_1000)


class Pipeline:
    """One pipeline of the benchmark's shape on its own topic, in the benchmark's namespace."""

    def __init__(self, info: stack.StackInfo, api: client.ApiClient, namespace: str, workdir: Path, size: int) -> None:
        self.info, self.namespace, self.size = info, namespace, size
        self.custom, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        self.name = f"replay-{size // 1000}k-{uuid.uuid4().hex[:4]}"
        self.file = workdir / f"{self.name}.txt"

    def produce(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.info.kafka_bootstrap})
        admin.create_topics([NewTopic(self.name, 1, 1)])[self.name].result(30)
        producer = Producer({"bootstrap.servers": self.info.kafka_bootstrap, "linger.ms": 20})
        for i in range(self.size):
            producer.produce(self.name, key=str(i).encode(), value=json.dumps({"id": i, "v": i % 7}).encode())
            if i % 10_000 == 0:
                producer.poll(0)
        assert producer.flush(60) == 0

    def create(self) -> float:
        """Create every step; seconds until each has read all the records."""
        say(f"{self.name}: creating the pipeline's steps (fresh)")
        started = time.monotonic()
        labels = {"fibers.dev/pipeline": self.name}
        sink = {"type": "mongodb", "uriSecretRef": {"name": "mongo", "key": "uri"}, "database": "bench_replay"}
        self._create(
            "transforms",
            f"{self.name}-agg",
            {
                "inputs": [{"name": "rows", "kafka": {"topics": [self.name], "schema": "id INT, v INT"}}],
                "sql": "SELECT v, count(*) AS n FROM rows GROUP BY v",
                "output": {"kafka": {"topic": f"{self.name}-out"}},
            },
            labels,
        )
        self._create(
            "databusconsumers",
            f"{self.name}-view",
            {"sources": [self.name], "startFrom": {"position": "earliest"}, "sink": {**sink, "collection": self.name}},
            labels,
        )
        self._create(
            "connects",
            f"{self.name}-file",
            {"cluster": "stack", "class": "FileStreamSink", "config": {"file": str(self.file), "topics": self.name}},
            labels,
        )
        self.wait_all_read(lines=self.size, trigger=None)
        return time.monotonic() - started

    def replay(self) -> tuple[float, dict[str, int]]:
        """A Replay from the earliest record; seconds until every step has read all the records again."""
        say(f"{self.name}: replaying from the earliest record")
        started = time.monotonic()
        name = f"{self.name}-again"
        spec = {"pipeline": self.name, "startFrom": {"position": "earliest"}, "sinks": "reapply"}
        self._create("replays", name, spec, {})
        wait(
            lambda: self._status("replays", name).get("phase") in ("Succeeded", "Failed"),
            step_timeout(self.size),
            "the Replay",
        )
        status = self._status("replays", name)
        if status["phase"] != "Succeeded":
            raise RuntimeError(f"the Replay failed: {status.get('conditions')}")
        self.wait_all_read(lines=2 * self.size, trigger="seek")
        return time.monotonic() - started, {s["kind"]: int(s.get("records", -1)) for s in status["steps"]}

    def wait_all_read(self, *, lines: int, trigger: str | None) -> None:
        def transform_done() -> bool:
            status = self._status("transforms", f"{self.name}-agg")
            run = status.get("currentRun") or {}
            return run.get("applicationState") == "COMPLETED" and (trigger is None or run.get("trigger") == trigger)

        def file_lines() -> int:
            return sum(1 for _ in self.file.open()) if self.file.exists() else 0

        started = time.monotonic()
        wait(transform_done, step_timeout(self.size), "the Transform's run")
        say(f"  {self.name}: the Transform's run done after {time.monotonic() - started:.0f} s")
        wait(
            lambda: consumed(self.core, self.namespace, f"{self.name}-view") >= self.size,
            step_timeout(self.size),
            "the view",
        )
        say(f"  {self.name}: the consumer's view has all {self.size} after {time.monotonic() - started:.0f} s")
        wait(lambda: file_lines() >= lines, step_timeout(self.size), "the file sink")

    def delete(self) -> None:
        for plural, name in (
            ("replays", f"{self.name}-again"),
            ("connects", f"{self.name}-file"),
            ("databusconsumers", f"{self.name}-view"),
            ("transforms", f"{self.name}-agg"),
        ):
            try:
                self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, plural, name)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
        # Gone, not only asked to go, while the operator still runs: a Connect's finalizer (its connector
        # deleted first) is the operator's to remove, and without it the namespace stayed Terminating.
        wait(lambda: not self._left(), STEP_TIMEOUT, "the pipeline's resources deleted")
        AdminClient({"bootstrap.servers": self.info.kafka_bootstrap}).delete_topics([self.name, f"{self.name}-out"])

    def _left(self) -> list[str]:
        left = []
        for plural in ("replays", "connects", "databusconsumers", "transforms"):
            listing = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, plural)
            left += [
                f"{plural}/{i['metadata']['name']}"
                for i in listing["items"]
                if i["metadata"]["name"].startswith(self.name)
            ]
        return left

    def _create(self, plural: str, name: str, spec: dict[str, Any], labels: dict[str, str]) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": {"transforms": "Transform", "databusconsumers": "DatabusConsumer", "connects": "Connect"}.get(
                plural, "Replay"
            ),
            "metadata": {"name": name, "labels": labels},
            "spec": spec,
        }
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, plural, body)

    def _status(self, plural: str, name: str) -> dict[str, Any]:
        body = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, plural, name)
        return dict(body.get("status") or {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000", help="records in the topic, comma separated")
    parser.add_argument("--rounds", type=int, default=2, help="paired rounds (fresh, then replay) per size")
    args = parser.parse_args()
    session = Run("replay")
    info = session.stack()
    api = config.new_client_from_config(info.kubeconfig)
    crds.apply(api)
    namespace = f"bench-replay-{uuid.uuid4().hex[:4]}"
    namespaces.create(api, namespace)
    platform_resources.apply(api, "stack", info.connect_url)
    client.CoreV1Api(api).create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="mongo"), string_data={"uri": info.mongodb_uri})
    )
    workdir = Path(tempfile.mkdtemp(prefix="fibers-bench-replay-"))
    os.chmod(workdir, 0o755)  # Kafka Connect writes the file sink there
    results: dict[str, Any] = {}
    try:
        with operator_process(info, namespace, workdir / "operator.log"):
            for size in (int(s) for s in args.sizes.split(",")):
                fresh, replayed, counted = [], [], {}
                for round_ in range(args.rounds):
                    pipeline = Pipeline(info, api, namespace, workdir, size)
                    pipeline.produce()
                    fresh.append(pipeline.create())
                    seconds, counted = pipeline.replay()
                    replayed.append(seconds)
                    say(
                        f"{size} records, round {round_ + 1}: fresh {fresh[-1]:.1f} s, replay {seconds:.1f} s {counted}"
                    )
                    pipeline.delete()
                results[str(size)] = {
                    "fresh_s": round(statistics.median(fresh), 1),
                    "replay_s": round(statistics.median(replayed), 1),
                    "ratio": round(statistics.median(replayed) / statistics.median(fresh), 2),
                    "records_counted": counted,
                }
    finally:
        client.CoreV1Api(api).delete_namespace(namespace)
    session.report(results)


if __name__ == "__main__":
    main()
