"""Benchmark: a Transform run through the operator against the same job as a hand-written PySpark script.

Both run the same SQL over the same input (≥ 1 million JSON records in a Kafka topic) with local
Spark, alternating, in one run:
  script    — a plain PySpark script started with spark-submit; its wall time;
  transform — a Transform applied to the stack; time from apply until the operator reports
              Succeeded (operator, local executor and job, everything included);
  ratio     — transform / script, medians (goal ≤ 1.05);
  submit    — time from apply until the SparkApplication exists (goal < 1 s).
The last line printed is one JSON object with every figure.

    .venv/bin/python bench/transform_overhead.py [--records 1000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyspark
import yaml
from confluent_kafka import Producer
from kubernetes import client, config, watch

from fibers import stack

REPO = Path(__file__).resolve().parents[1]
SCHEMA = "id INT, customer STRING, amount DOUBLE"
SQL = "SELECT customer, count(*) AS n, sum(amount) AS total FROM orders GROUP BY customer"

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


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def produce(bootstrap: str, topic: str, n: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 10000})
    for i in range(n):
        producer.produce(topic, value=json.dumps({"id": i, "customer": f"c{i % 100}", "amount": i % 7}).encode())
        if i % 20000 == 0:
            producer.poll(0)
    producer.flush(300)


def run_script(info: stack.StackInfo, script: Path, topic: str) -> float:
    jars = ",".join(str(p) for p in sorted(Path(info.spark_kafka_jars).glob("*.jar")))
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    started = time.monotonic()
    subprocess.run(
        [
            str(submit),
            "--master",
            "local[2]",
            "--jars",
            jars,
            str(script),
            info.kafka_bootstrap,
            topic,
            f"{topic}-script-{uuid.uuid4().hex[:4]}",
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    return time.monotonic() - started


def run_transform(api: client.ApiClient, namespace: str, topic: str) -> tuple[float, float]:
    custom = client.CustomObjectsApi(api)
    name = f"t{uuid.uuid4().hex[:6]}"
    body = {
        "apiVersion": "fibers.dev/v1alpha1",
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
    time.sleep(0.5)  # the watch is open before the apply
    started = time.monotonic()
    custom.create_namespaced_custom_object("fibers.dev", "v1alpha1", namespace, "transforms", body)
    for event in watch.Watch().stream(
        custom.list_namespaced_custom_object,
        "fibers.dev",
        "v1alpha1",
        namespace,
        "transforms",
        field_selector=f"metadata.name={name}",
        timeout_seconds=900,
    ):
        status = event["object"].get("status") or {}
        if status.get("phase") == "Succeeded":
            total = time.monotonic() - started
            submission.join(5)
            return total, submitted[0] if submitted else float("nan")
        if status.get("phase") == "Failed":
            raise RuntimeError(json.dumps(status))
    raise TimeoutError(f"Transform {name} did not finish")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    say("starting (or reusing) the local stack")
    info = stack.up()
    api = config.new_client_from_config(config_file=info.kubeconfig)
    ext = client.ApiextensionsV1Api(api)
    for path in sorted((REPO / "crds").glob("*.yaml")):
        try:
            ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
        except client.exceptions.ApiException as exc:
            if exc.status != 409:
                raise
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    work = Path(tempfile.mkdtemp(prefix="fibers-bench-"))
    script = work / "hand_written.py"
    script.write_text(SCRIPT)
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    say(f"producing {args.records} records to {topic}")
    produce(info.kafka_bootstrap, topic, args.records)

    log = open(work / "operator.log", "wb")  # noqa: SIM115
    operator = subprocess.Popen(
        [sys.executable, "-m", "fibers", "run", "-n", namespace],
        stdout=log,
        stderr=log,
        env={**os.environ, **info.env()},
    )
    time.sleep(3)
    scripts, transforms, submits = [], [], []
    try:
        for round_ in range(args.rounds):
            scripts.append(run_script(info, script, topic))
            say(f"round {round_ + 1}: hand-written script {scripts[-1]:.1f}s")
            total, submitted = run_transform(api, namespace, topic)
            transforms.append(total)
            submits.append(submitted)
            say(f"round {round_ + 1}: Transform {total:.1f}s (SparkApplication after {submitted:.2f}s)")
    finally:
        operator.terminate()
        operator.wait(30)
        log.close()
        client.CoreV1Api(api).delete_namespace(namespace)
    results: dict[str, Any] = {
        "benchmark": "transform_overhead",
        "records": args.records,
        "script_seconds": [round(s, 1) for s in scripts],
        "transform_seconds": [round(t, 1) for t in transforms],
        "wall_time_ratio": round(statistics.median(transforms) / statistics.median(scripts), 3),
        "apply_to_sparkapplication_seconds": round(max(submits), 2),
    }
    results["goals"] = {
        "ratio_le_1.05": results["wall_time_ratio"] <= 1.05,
        "submit_lt_1s": results["apply_to_sparkapplication_seconds"] < 1,
    }
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
