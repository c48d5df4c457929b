"""The chaos benchmark's replay-kills scenario: a Replay moving a pipeline back while the operator is SIGKILLed
at each of its moves (a step told to seek, a step repositioned).

The pipeline reads one topic of ten records, four before the time T and six after: a sink connector (a
file), a DatabusConsumer (a MongoDB view, then corrupted by hand), and, when asked, a batch Transform. A
Replay from T with `sinks: reapply` must end Succeeded with every step moved exactly once, whatever the
kills: the file holds the ten records and the six since T once more (a second seek would deliver them
again), the view is right from T on (and untouched before it), and the Transform ran once more. Figures:
`replay_phase`, `redelivered_extra` (lines beyond the one redelivery), `view_wrong`, `extra_seek_runs`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import client
from pymongo import MongoClient

from bench.chaos import Context
from bench.machine import say
from fibers.startfrom import format_time
from tests.helpers import Resources, wait_for

BEFORE, SINCE = 4, 6  # records before T and at or after it


def replay_kills(ctx: Context, *, kills: int, transform: bool) -> dict[str, Any]:
    info, ns = ctx.info, ctx.namespace
    topic, pipeline = f"{ns}-replayed", f"{ns}-pipeline"
    admin = AdminClient({"bootstrap.servers": info.kafka_bootstrap})  # held: its futures die with it
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    t = int(time.time() * 1000) - 60_000
    producer = Producer({"bootstrap.servers": info.kafka_bootstrap})
    stamps = [t - 30_000 + i for i in range(BEFORE)] + [t + 1_000 * i for i in range(SINCE)]
    for i, stamp in enumerate(stamps):
        producer.produce(topic, key=str(i).encode(), value=json.dumps({"id": i, "v": i}).encode(), timestamp=stamp)
    assert producer.flush(30) == 0
    core = client.CoreV1Api(ctx.api)
    secret = client.V1Secret(metadata=client.V1ObjectMeta(name="replay-mongo"), string_data={"uri": info.mongodb_uri})
    core.create_namespaced_secret(ns, secret)
    labels = {"fibers.dev/pipeline": pipeline}
    connects, consumers = Resources(ctx.api, "connects", ns), Resources(ctx.api, "databusconsumers", ns)
    transforms, replays = Resources(ctx.api, "transforms", ns), Resources(ctx.api, "replays", ns)
    out = ctx.workdir / "replayed.txt"
    connects.create("file", {"class": "FileStreamSink", "config": {"file": str(out), "topics": topic}}, labels=labels)
    database = f"replay{ns.replace('-', '')}"
    sink = {"type": "mongodb", "uriSecretRef": {"name": "replay-mongo", "key": "uri"}, "database": database}
    view_spec = {"sources": [topic], "startFrom": {"position": "earliest"}, "sink": {**sink, "collection": "view"}}
    consumers.create("view", view_spec, labels=labels)
    if transform:
        inputs = [{"name": "rows", "kafka": {"topics": [topic], "schema": "id INT, v INT"}}]
        transforms.create(
            "agg",
            {"inputs": inputs, "sql": "SELECT id, v FROM rows", "output": {"kafka": {"topic": f"{topic}-out"}}},
            labels=labels,
        )
        transforms.wait_condition("agg", "True", "Succeeded", timeout=600)

    def lines() -> list[str]:
        return out.read_text().splitlines() if out.exists() else []

    wait_for(lambda: len(lines()) == BEFORE + SINCE, timeout=120, what="the file sink's first delivery")
    consumers.wait_status("view", lambda s: s.get("windowScn") == BEFORE + SINCE - 1, timeout=180, what="the view")
    view = MongoClient(info.mongodb_uri)[database]["view"]
    view.update_many({}, {"$set": {"v": -1}})  # every document wrong, its SCN kept

    replays.create("again", {"pipeline": pipeline, "startFrom": {"timestamp": format_time(t)}, "sinks": "reapply"})
    killed, seen = 0, None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        status = replays.status("again")
        if status.get("phase") in ("Succeeded", "Failed"):
            break
        moves = tuple(s["state"] for s in status.get("steps") or [])
        if moves != seen and killed < kills:  # a step moved: kill the operator at a random moment after it
            seen = moves
            time.sleep(ctx.rng.uniform(0.0, 1.0))
            ctx.kill_operator()
            killed += 1
        time.sleep(0.2)
    status = replays.status("again")

    def view_right() -> bool:
        return {d["_id"]: d["v"] for d in view.find()} == {str(i): (i if i >= BEFORE else -1) for i in range(10)}

    right = status.get("phase") == "Succeeded" and _within(view_right, 120)
    _within(lambda: len(lines()) >= BEFORE + 2 * SINCE, 90)
    time.sleep(5)  # a second seek would deliver again within this
    apps = ctx.custom.list_namespaced_custom_object("sparkoperator.k8s.io", "v1beta2", ns, "sparkapplications")
    figures = {
        "kills": killed,
        "replay_phase": status.get("phase"),
        "steps": {f"{s['kind']}/{s['name']}": [s["state"], s.get("records")] for s in status.get("steps") or []},
        "redelivered_extra": len(lines()) - (BEFORE + 2 * SINCE),
        "view_wrong": 0
        if right
        else sum(1 for d in view.find() if d["v"] != (int(d["_id"]) if int(d["_id"]) >= BEFORE else -1)),
        "extra_seek_runs": max(len(apps["items"]) - 2, 0) if transform else 0,
    }
    say(f"replay-kills: {figures}")
    return figures


def _within(probe: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(0.5)
    return False
