"""OpenLineage events on a real Kafka topic from Connects and consumers, and their history kept in MongoDB by a
DatabusConsumer with the history sink. A Transform run's events are checked beside its run in test_transform."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kubernetes.client import ApiClient
from pymongo import MongoClient

from fibers_stack import StackInfo
from tests.helpers import Resources, lineage_events, produce_around, wait_for
from tests.integration.conftest import OperatorProcess, lineage_env

pytestmark = pytest.mark.connect


@pytest.fixture(scope="module")
def operator_env(lineage_topic: str) -> dict[str, str]:
    return lineage_env(lineage_topic)


def test_a_connector_run_starts_when_ready_and_completes_when_deleted_and_the_history_keeps_it(
    kube: ApiClient,
    namespace: str,
    operator: OperatorProcess,
    stack_info: StackInfo,
    lineage_topic: str,
    mongo_secret: str,
    tmp_path: Path,
    unique: str,
) -> None:
    """A Connect's run: START once Running, COMPLETE when deleted, and a consumer reading its topic names it
    as its input's producer. A DatabusConsumer with the history sink keeps every event in MongoDB, its own
    START included, each under its topic position."""
    consumers = Resources(kube, "databusconsumers", namespace)
    history_sink = {
        "type": "history",
        "uriSecretRef": {"name": mongo_secret, "key": "uri"},
        "database": unique,
        "collection": "lineage",
    }
    consumers.create(f"{unique}-h", {"sources": [lineage_topic], "startPosition": "earliest", "sink": history_sink})
    source = tmp_path / "in.txt"
    source.write_text("a\nb\n")
    os.chmod(tmp_path, 0o755)  # Kafka Connect reads it
    connects = Resources(kube, "connects", namespace)
    hoist = {"transforms": "id", "transforms.id.type": "org.apache.kafka.connect.transforms.HoistField$Value"}
    connects.create(
        unique,
        {
            "class": "FileStreamSource",
            "config": {"file": str(source), "topic": unique, **hoist, "transforms.id.field": "id"},
        },
    )
    connects.wait_condition(unique, "True", "Running", timeout=90)
    connects.wait_status(unique, lambda s: bool(s.get("topics")), what="topics known")
    job = f"{namespace}.connect.{unique}"
    bootstrap = stack_info.kafka_bootstrap
    [start] = wait_for(lambda: lineage_events(bootstrap, lineage_topic, job) or None, timeout=60, what="START")
    assert start["eventType"] == "START"
    assert [(d["namespace"], d["name"]) for d in start["inputs"]] == [("file", str(source))]

    # A consumer reading it through a sourceRef names the Connect as its input's producer, as the pipeline does.
    consumers.create(
        f"{unique}-c",
        {"sourceRefs": [{"connectRef": {"name": unique}}], "startPosition": "earliest", "sink": {"type": "log"}},
    )
    consumer_job = f"{namespace}.databusconsumer.{unique}-c"
    [own] = wait_for(
        lambda: lineage_events(bootstrap, lineage_topic, consumer_job) or None, timeout=120, what="its START"
    )[:1]
    assert [(d["name"], d["facets"].get("fibers_producer", {}).get("name")) for d in own["inputs"]] == [
        (unique, unique)
    ]
    assert own["inputs"][0]["facets"]["fibers_producer"]["kind"] == "Connect"
    consumers.delete(f"{unique}-c")
    connects.delete(unique)
    wait_for(lambda: not connects.exists(unique), timeout=60, what="Connect deleted")
    found = wait_for(
        lambda: (e := lineage_events(bootstrap, lineage_topic, job)) and len(e) >= 2 and e, timeout=60, what="COMPLETE"
    )
    assert [e["eventType"] for e in found] == ["START", "COMPLETE"]
    assert found[0]["run"]["runId"] == found[1]["run"]["runId"]
    assert [(d["namespace"], d["name"]) for d in found[1]["outputs"]] == [
        (f"kafka://{bootstrap.split(',')[0]}", unique)
    ]

    history = MongoClient(stack_info.mongodb_uri)[unique]["lineage"]

    def stored() -> dict[str, list[str]] | None:
        by_job: dict[str, list[str]] = {}
        for doc in history.find():
            by_job.setdefault(doc["job"]["name"], []).append(doc["eventType"])
        return by_job if len(by_job.get(job, [])) >= 2 and f"{namespace}.databusconsumer.{unique}-h" in by_job else None

    by_job = wait_for(stored, timeout=120, what="lineage events in MongoDB")
    assert by_job[f"{namespace}.databusconsumer.{unique}-h"] == ["START"]
    assert sorted(by_job[job]) == ["COMPLETE", "START"] and by_job[consumer_job][0] == "START"
    doc = history.find_one({"eventType": "COMPLETE", "job.name": job})
    assert doc is not None and doc["_id"] == f"{lineage_topic}/0/{doc['_offset']}"


def test_a_sink_connector_replayed_from_a_time_delivers_again_from_there_and_lineage_names_the_replay(
    kube: ApiClient,
    namespace: str,
    operator: OperatorProcess,
    connect_cluster: str,
    stack_info: StackInfo,
    lineage_topic: str,
    tmp_path: Path,
    unique: str,
) -> None:
    """A pipeline of a source connector and a sink connector, records on both sides of T. A Replay from T
    skips the source (no position in time; its topic keeps what it wrote) and moves the sink's consumer
    group to the first record at or after T through Kafka Connect's offsets API: the sink delivers those
    six again, and the Replay, the Connect's status and an OpenLineage event all count six."""
    from fibers.startfrom import format_time

    connects, replays = Resources(kube, "connects", namespace), Resources(kube, "replays", namespace)
    t = produce_around(stack_info.kafka_bootstrap, unique)
    labels = {"fibers.dev/pipeline": unique}
    os.chmod(tmp_path, 0o755)  # the Connect worker reads and writes there
    source_file, out = tmp_path / "in.txt", tmp_path / "out.txt"
    source_file.write_text("")
    source = {"class": "FileStreamSource", "config": {"file": str(source_file), "topic": f"{unique}-src"}}
    connects.create(f"{unique}-src", source, labels=labels)
    connects.create(
        f"{unique}-sink", {"class": "FileStreamSink", "config": {"file": str(out), "topics": unique}}, labels=labels
    )

    def lines() -> list[str]:
        return out.read_text().splitlines() if out.exists() else []

    wait_for(lambda: len(lines()) == 10, timeout=90, what="the sink's first delivery")
    replays.create(unique, {"pipeline": unique, "startFrom": {"timestamp": format_time(t)}})
    replays.wait_condition(unique, "True", "Replayed", timeout=120)
    steps = {s["name"]: s for s in replays.status(unique)["steps"]}
    assert steps[f"{unique}-src"]["state"] == "Skipped"
    assert "a source connector has no position in time" in steps[f"{unique}-src"]["message"]
    assert (steps[f"{unique}-sink"]["state"], steps[f"{unique}-sink"]["records"]) == ("Repositioned", 6)
    row = replays.printed(unique)
    assert (row["Pipeline"], row["From"], row["Phase"], row["Ready"], row["Reason"]) == (
        unique,
        format_time(t),
        "Succeeded",
        "True",
        "Replayed",
    )
    assert row["Steps"] == replays.status(unique)["progress"] and row["Steps"]
    wait_for(lambda: len(lines()) == 16, timeout=90, what="the six records since T delivered again")
    assert lines()[10:] == lines()[4:10]  # the same records, from the first at T on
    status = connects.status(f"{unique}-sink")
    assert (status["offsets"]["lastOperation"]["operation"], status["offsets"]["lastOperation"]["records"]) == (
        "seek",
        6,
    )
    assert status["connectorState"] == "RUNNING" and status["lastSeekNonce"].startswith(f"replay-{unique}")
    job = f"{namespace}.connect.{unique}-sink"
    found = wait_for(
        lambda: [
            e for e in lineage_events(stack_info.kafka_bootstrap, lineage_topic, job) if e["eventType"] == "OTHER"
        ],
        timeout=60,
        what="the replay's lineage event",
    )
    facet = found[0]["run"]["facets"]["fibers_replay"]
    assert (facet["replay"], facet["records"], facet["startFrom"]) == (
        f"{namespace}/{unique}",
        6,
        f"from {format_time(t)}",
    )
