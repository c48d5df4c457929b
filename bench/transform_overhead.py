"""Benchmark: a Transform against a hand-written SparkApplication of the same job, through the real Spark Operator.

Both run the same SQL over the same input (JSON records in a Kafka topic) on the stack's node, as
driver and executor pods from the same job image, submitted by the same (chart-installed) Spark
Operator, alternating, in one run:
  handwritten — a SparkApplication a user would write for a plain PySpark script (the script on a
                hostPath volume); time from apply until the Spark Operator reports COMPLETED;
  transform   — a Transform applied to the stack; time from apply until the operator reports
                Succeeded (operator, Spark Operator, pods and job, everything included);
  ratio       — transform / handwritten, medians (goal ≤ 1.05);
  submit      — time from apply until the SparkApplication exists (goal < 1 s);
  driver      — time from apply until the Transform's driver pod is Running;
  segments    — for both sides, where the time goes: apply → driver pod Running (start), Running →
                the driver's container ended (run: the job itself), → reported done (tail: the Spark
                Operator's COMPLETED, or the Transform's Succeeded). The kubelet notices a container
                starting or ending when it next relists them (every second), so start and run come in
                steps of about a second on both sides.
Rounds alternate which side goes first, and each run starts once the machine is quiet (below
QUIET_CORES of CPU for QUIET_SECONDS in a row; the wait is printed): a run right after another would
find the node still busy with the last one's pods.
The last line printed is one JSON object with every figure.

    .venv/bin/python -m bench.transform_overhead [--records 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from kubernetes import client, config, watch

import fibers_stack as stack
from bench.machine import Run, machine_cpu_seconds, operator_process, say, wait_quiet
from fibers_stack import crds, namespaces

REPO = Path(__file__).resolve().parents[1]
SCHEMA = "id INT, customer STRING, amount DOUBLE"
SQL = "SELECT customer, count(*) AS n, sum(amount) AS total FROM orders GROUP BY customer"
# A run starts once the whole machine (the stack and its pods) has used less than QUIET_CORES of CPU
# in each of QUIET_SECONDS seconds in a row (the idle stack uses 0.1-0.5), or after QUIET_MAX_SECONDS.
QUIET_CORES = 0.6
QUIET_SECONDS = 2
QUIET_MAX_SECONDS = 60.0

SCRIPT = f"""
import sys
from pyspark.sql import SparkSession
bootstrap, topic, out = sys.argv[1:4]
spark = SparkSession.builder.appName("hand-written").config("spark.ui.enabled", "false") \\
    .config("spark.sql.shuffle.partitions", "4").getOrCreate()
raw = spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic) \\
    .option("startingOffsets", "earliest").load()
raw.selectExpr("CAST(value AS STRING) AS v").selectExpr("from_json(v, '{SCHEMA}') AS r").select("r.*") \\
    .createOrReplaceTempView("orders")
result = spark.sql("{SQL}")
result.selectExpr("to_json(struct(*)) AS value").write.format("kafka") \\
    .option("kafka.bootstrap.servers", bootstrap).option("topic", out).save()
spark.stop()
"""


def produce(bootstrap: str, topic: str, n: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 10000})
    for i in range(n):
        producer.produce(topic, value=json.dumps({"id": i, "customer": f"c{i % 100}", "amount": i % 7}).encode())
        if i % 20000 == 0:
            producer.poll(0)
    producer.flush(300)


def watch_until(api: client.ApiClient, namespace: str, plural: str, group: str, name: str, done: Any) -> float:
    """Seconds until done(object) is true, as `kubectl wait` sees it (a watch, no polling)."""
    custom = client.CustomObjectsApi(api)
    started = time.monotonic()
    version = "v1beta2" if group == "sparkoperator.k8s.io" else "v1beta1"
    for event in watch.Watch().stream(
        custom.list_namespaced_custom_object,
        group,
        version,
        namespace,
        plural,
        field_selector=f"metadata.name={name}",
        timeout_seconds=900,
    ):
        if done(event["object"]):
            return time.monotonic() - started
    raise TimeoutError(f"{plural}/{name} did not finish")


class DriverWatch:
    """When a run's driver pod is first Running and when its container has ended, seconds after `started`
    (the moment the watch is open, just before the apply), as `kubectl wait` would see them."""

    def __init__(self, api: client.ApiClient, namespace: str, selector: str) -> None:
        self.running = self.done = math.nan
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._watch, args=(api, namespace, selector), daemon=True)
        self._thread.start()
        time.sleep(0.5)  # the watch is open before the apply, which follows at once
        self.started = time.monotonic()

    def _watch(self, api: client.ApiClient, namespace: str, selector: str) -> None:
        for event in watch.Watch().stream(
            client.CoreV1Api(api).list_namespaced_pod, namespace, label_selector=selector, timeout_seconds=600
        ):
            status = event["object"].status
            # The driver's container ends a moment before the pod's phase says so, and the Spark Operator
            # goes by the container (COMPLETED came 1.1 s before the phase Succeeded in two runs).
            ended = any(c.state and c.state.terminated for c in status.container_statuses or [])
            if (status.phase in ("Running", "Succeeded") or ended) and math.isnan(self.running):
                self.running = time.monotonic() - self.started
            if ended or status.phase in ("Succeeded", "Failed"):
                self.done = time.monotonic() - self.started
                return

    def segments(self, total: float) -> dict[str, float]:
        self._thread.join(5)
        return {"start": self.running, "run": self.done - self.running, "tail": total - self.done}


def run_handwritten(
    api: client.ApiClient, info: stack.StackInfo, namespace: str, work: Path, topic: str
) -> tuple[float, dict[str, float]]:
    """The SparkApplication a user writes for this job: script on a volume, the image's Kafka jars."""
    name = f"hw{uuid.uuid4().hex[:6]}"
    driver = DriverWatch(api, namespace, f"sparkoperator.k8s.io/app-name={name},spark-role=driver")
    jars = ",".join(f"local:///opt/fibers/jars/{p.name}" for p in sorted(Path(info.spark_kafka_jars).glob("*.jar")))
    mount = {"name": "bench", "mountPath": "/bench"}
    resources = {"cores": 1, "coreRequest": "200m", "memory": "512m", "volumeMounts": [mount]}
    app = {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "type": "Python",
            "mode": "cluster",
            "image": info.images["job"],
            "imagePullPolicy": "IfNotPresent",
            "mainApplicationFile": "local:///bench/hand_written.py",
            "arguments": [info.kafka_bootstrap, topic, f"{topic}-{name}"],
            "sparkVersion": "4.0.0",
            "sparkConf": {"spark.jars": jars},
            "restartPolicy": {"type": "Never"},
            "volumes": [{"name": "bench", "hostPath": {"path": str(work), "type": "Directory"}}],
            "driver": {**resources, "serviceAccount": "fibers-job"},
            "executor": {**resources, "instances": 1},
        },
    }
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "sparkoperator.k8s.io", "v1beta2", namespace, "sparkapplications", app
    )

    def completed(obj: dict[str, Any]) -> bool:
        state = ((obj.get("status") or {}).get("applicationState") or {}).get("state")
        if state in ("FAILED", "SUBMISSION_FAILED"):
            raise RuntimeError(json.dumps(obj.get("status")))
        return state == "COMPLETED"

    watch_until(api, namespace, "sparkapplications", "sparkoperator.k8s.io", name, completed)
    total = time.monotonic() - driver.started
    return total, driver.segments(total)


def run_transform(api: client.ApiClient, namespace: str, topic: str) -> tuple[float, float, dict[str, float]]:
    custom = client.CustomObjectsApi(api)
    name = f"t{uuid.uuid4().hex[:6]}"
    body = {
        "apiVersion": "fibers.dev/v1beta1",
        "kind": "Transform",
        "metadata": {"name": name},
        "spec": {
            "inputs": [{"name": "orders", "kafka": {"topics": [topic], "schema": SCHEMA}}],
            "sql": SQL,
            "output": {"kafka": {"topic": f"{topic}-{name}"}},
        },
    }
    submitted: list[float] = []

    def watch_submission() -> None:
        for _ in watch.Watch().stream(
            custom.list_namespaced_custom_object,
            "sparkoperator.k8s.io",
            "v1beta2",
            namespace,
            "sparkapplications",
            label_selector=f"fibers.dev/transform={name}",
            timeout_seconds=60,
        ):
            submitted.append(time.monotonic() - started)
            return

    # Both ends are watched, as `kubectl wait` would: polling would add its own delay and load.
    submission = threading.Thread(target=watch_submission, daemon=True)
    submission.start()
    driver = DriverWatch(api, namespace, f"fibers.dev/transform={name},spark-role=driver")
    started = driver.started
    custom.create_namespaced_custom_object("fibers.dev", "v1beta1", namespace, "transforms", body)
    for event in watch.Watch().stream(
        custom.list_namespaced_custom_object,
        "fibers.dev",
        "v1beta1",
        namespace,
        "transforms",
        field_selector=f"metadata.name={name}",
        timeout_seconds=900,
    ):
        status = event["object"].get("status") or {}
        if status.get("phase") == "Succeeded":
            total = time.monotonic() - started
            submission.join(5)
            return total, submitted[0] if submitted else math.nan, driver.segments(total)
        if status.get("phase") == "Failed":
            raise RuntimeError(json.dumps(status))
    raise TimeoutError(f"Transform {name} did not finish")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    session = Run("transform_overhead")
    info = session.stack()
    api = config.new_client_from_config(config_file=info.kubeconfig)
    crds.apply(api)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    namespaces.create(api, namespace)
    work = Path(tempfile.mkdtemp(prefix="fibers-bench-"))
    work.chmod(0o755)
    (work / "hand_written.py").write_text(SCRIPT)
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    say(f"producing {args.records} records to {topic}")
    produce(info.kafka_bootstrap, topic, args.records)

    handwritten: list[float] = []
    transforms: list[float] = []
    submits: list[float] = []
    parts: dict[str, list[dict[str, float]]] = {"handwritten": [], "transform": []}

    def quiet() -> str:
        return f"after {wait_quiet(machine_cpu_seconds, QUIET_CORES, QUIET_SECONDS, QUIET_MAX_SECONDS):.0f}s quiet"

    def hand_written_run(round_: int) -> None:
        waited = quiet()
        total, segments = run_handwritten(api, info, namespace, work, topic)
        handwritten.append(total)
        parts["handwritten"].append(segments)
        say(f"round {round_}: hand-written SparkApplication {total:.1f}s ({_segments(segments)}; {waited})")

    def transform_run(round_: int) -> None:
        waited = quiet()
        total, submitted, segments = run_transform(api, namespace, topic)
        transforms.append(total)
        submits.append(submitted)
        parts["transform"].append(segments)
        say(
            f"round {round_}: Transform {total:.1f}s (SparkApplication after {submitted:.2f}s;"
            f" {_segments(segments)}; {waited})"
        )

    try:
        with operator_process(info, namespace, work / "operator.log"):
            time.sleep(3)
            for round_ in range(args.rounds):
                order = (hand_written_run, transform_run) if round_ % 2 == 0 else (transform_run, hand_written_run)
                for side in order:
                    side(round_ + 1)
    finally:
        client.CoreV1Api(api).delete_namespace(namespace)
    results: dict[str, Any] = {
        "records": args.records,
        "handwritten_seconds": [round(s, 1) for s in handwritten],
        "transform_seconds": [round(t, 1) for t in transforms],
        "wall_time_ratio": round(statistics.median(transforms) / statistics.median(handwritten), 3),
        "round_ratios": [round(t / h, 3) for t, h in zip(transforms, handwritten, strict=True)],
        "apply_to_sparkapplication_seconds": round(max(submits), 2),
        "apply_to_driver_running_seconds": [round(p["start"], 1) for p in parts["transform"]],
        "segments_median_seconds": {
            side: {key: round(statistics.median(p[key] for p in runs), 2) for key in ("start", "run", "tail")}
            for side, runs in parts.items()
        },
        "segments_seconds": {
            side: [{key: round(value, 2) for key, value in p.items()} for p in runs] for side, runs in parts.items()
        },
    }
    results["goals"] = {
        "ratio_le_1.05": results["wall_time_ratio"] <= 1.05,
        "submit_lt_1s": results["apply_to_sparkapplication_seconds"] < 1,
    }
    session.report(results)
    return 0


def _segments(segments: dict[str, float]) -> str:
    return ", ".join(f"{key} {value:.1f}s" for key, value in segments.items())


if __name__ == "__main__":
    raise SystemExit(main())
